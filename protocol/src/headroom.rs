//! Headroom: the slack between a request's stated SLOs and an endpoint's
//! predictions. Defined here because two components judge it: the filter's
//! policy (which tier an endpoint is in) and the predictor's flow control
//! (whether a queued request can go now). One definition, or they disagree on
//! when a request "fits".
//!
//! `ttft = slo_ttft * ttft_buffer - predicted_ttft`; for a streaming request with a
//! TPOT SLO `tpot = min(slo_tpot, tightest TPOT SLO running there) * tpot_buffer -
//! predicted_tpot`. Only the SLOs the request stated are judged. The buffers are
//! Llumnix's SLO dispatch thresholds: below 1 an endpoint must be predicted that much
//! under a goal to count as meeting it (Llumnix suggests 0.85), a margin for a
//! predictor known to err; above 1, a goal missed by a little still counts as met.

use crate::messages::{EndpointPrediction, FlowTerms, RequestFeatures};

/// The factors on a request's SLOs that headroom is judged against (1: the SLOs as stated).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SloBuffers {
    pub ttft: f64,
    pub tpot: f64,
}

impl Default for SloBuffers {
    fn default() -> Self {
        SloBuffers { ttft: 1.0, tpot: 1.0 }
    }
}

impl SloBuffers {
    /// The buffers a flow-controlled request is judged with: those its gateway sent.
    pub fn of(terms: &FlowTerms) -> SloBuffers {
        SloBuffers { ttft: terms.ttft_buffer, tpot: terms.tpot_buffer }
    }
}

/// Per-endpoint headroom of one request (`None`: that SLO is not judged).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headroom {
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
}

impl Headroom {
    /// Every judged SLO is predicted to be met.
    pub fn is_positive(&self) -> bool {
        self.ttft.is_none_or(|h| h >= 0.0) && self.tpot.is_none_or(|h| h >= 0.0)
    }
}

/// The least TTFT SLO a request is judged against after waiting in the flow queue: one
/// that waited past its SLO is judged as "as soon as possible", never as negative.
pub const MIN_REMAINING_TTFT_MS: f64 = 1.0;

/// `request` as it is judged after `waited_ms` in the flow queue: the client's clock ran
/// while it waited, so that much of its TTFT SLO is gone (never below
/// [`MIN_REMAINING_TTFT_MS`]). The predictor's flow control judges a waiting request with
/// it and the filter's policy a released one: one definition, or a request the queue let
/// go would be judged by other numbers at the gateway.
pub fn after_waiting(request: &RequestFeatures, waited_ms: f64) -> RequestFeatures {
    let mut left = request.clone();
    let waited = if waited_ms.is_finite() { waited_ms.max(0.0) } else { 0.0 };
    left.slo.ttft_ms = left.slo.ttft_ms.map(|slo| (slo - waited).max(MIN_REMAINING_TTFT_MS));
    left
}

/// Headroom of `request` on one endpoint; `None` when a judged SLO has no prediction.
pub fn headroom(request: &RequestFeatures, endpoint: &EndpointPrediction, buffers: SloBuffers) -> Option<Headroom> {
    judge(request, endpoint, buffers, endpoint.state.tightest_tpot_slo_ms)
}

/// [`headroom`] on the request's own SLOs alone, as if nothing with a tighter TPOT SLO
/// ran there. Where this is positive and [`headroom`] is not, the endpoint would serve
/// the request in time, but its decode would slow the running requests past theirs.
pub fn own_headroom(request: &RequestFeatures, endpoint: &EndpointPrediction, buffers: SloBuffers) -> Option<Headroom> {
    judge(request, endpoint, buffers, None)
}

/// Of `endpoints`, where the request does least harm among those with room for its own
/// SLOs ([`own_headroom`] positive): the fewest requests in flight with a tighter TPOT SLO
/// than its own (`tighter_tpot_in_flight`, the decodes its own would slow past theirs),
/// and among those the busiest: the least TPOT headroom where TPOT is judged (the slowest
/// decode that still serves it), else the least TTFT headroom. Loose work goes where it
/// slows the fewest tight decodes, and, where it slows some everywhere, where the harm is
/// done already: the endpoints where tight requests still meet theirs are left alone.
///
/// `waited_ms` (what it spent in the flow queue, already taken from its TTFT SLO) is how
/// late its first token may be for them: where an endpoint that would slow fewer tight
/// decodes than every one with room for its own SLOs serves its own TPOT, and its TTFT
/// at most that late, it goes there. This is the batch request that waited in the flow
/// queue for the interactive decodes to end until only the fastest endpoints, where they
/// run, could still give its first token in time (where loose work gathers the queues are
/// longest): without it the wait ended by sending it among them (docs/flow-control.md,
/// "Late rather than among the tight decodes"). Its first token is late by no more than
/// it waited: within its TTFT SLO counted from its release. A request that did not wait
/// is never sent late, and nothing in time anywhere is `None`, as before (the filter's
/// policy ranks by deficit).
/// The filter's policy and the predictor's flow control both place such requests here.
pub fn least_harm_with_own_room(
    request: &RequestFeatures,
    endpoints: &[EndpointPrediction],
    buffers: SloBuffers,
    waited_ms: f64,
) -> Option<usize> {
    /// An endpoint that serves the request's own SLOs, its TTFT up to `lateness` late.
    struct Candidate {
        index: usize,
        /// Tighter decodes it would slow there.
        harm: u32,
        /// Its own TPOT headroom there where judged, else its TTFT headroom: the least is the busiest.
        slack: f64,
        in_time: bool,
    }
    let lateness = if waited_ms.is_finite() { waited_ms.max(0.0) } else { 0.0 };
    let candidates: Vec<Candidate> = endpoints
        .iter()
        .enumerate()
        .filter_map(|(index, e)| {
            let own = own_headroom(request, e, buffers)?;
            let served = own.tpot.is_none_or(|h| h >= 0.0) && own.ttft.is_none_or(|h| h >= -lateness);
            let slack = own.tpot.or(own.ttft)?;
            let in_time = own.is_positive();
            served.then_some(Candidate { index, harm: e.state.tighter_tpot_in_flight, slack, in_time })
        })
        .collect();
    // The fewest tighter decodes slowed, the busiest among equals; late ones only if asked,
    // and only where they slow fewer than `fewer_than`.
    let least = |late_too: bool, fewer_than: u32| {
        candidates
            .iter()
            .filter(|c| (late_too || c.in_time) && c.harm < fewer_than)
            .min_by(|a, b| a.harm.cmp(&b.harm).then(a.slack.total_cmp(&b.slack)))
    };
    let in_time = least(false, u32::MAX)?;
    Some(least(true, in_time.harm).unwrap_or(in_time).index)
}

fn judge(
    request: &RequestFeatures,
    endpoint: &EndpointPrediction,
    buffers: SloBuffers,
    running_tpot_slo_ms: Option<f64>,
) -> Option<Headroom> {
    let ttft = match request.slo.ttft_ms {
        Some(slo) => Some(slo * buffers.ttft - endpoint.ttft_ms?),
        None => None,
    };
    let tpot = match request.streamed_tpot_slo_ms() {
        Some(slo) => {
            // Only a real (positive) running SLO tightens the target; a missing
            // one never weakens it (the reference let "no SLO" enter as 0).
            let target = match running_tpot_slo_ms {
                Some(running) if running > 0.0 => slo.min(running),
                _ => slo,
            };
            Some(target * buffers.tpot - endpoint.tpot_ms?)
        }
        None => None,
    };
    Some(Headroom { ttft, tpot })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Slo;

    const B: SloBuffers = SloBuffers { ttft: 1.0, tpot: 1.0 };

    #[test]
    fn own_headroom_leaves_out_the_running_requests_tpot_slo() {
        let request = RequestFeatures {
            slo: Slo { ttft_ms: Some(4000.0), tpot_ms: Some(150.0) },
            streaming: true,
            ..Default::default()
        };
        let mut e = EndpointPrediction {
            address: "a".into(),
            ttft_ms: Some(100.0),
            tpot_ms: Some(60.0),
            state: Default::default(),
        };
        e.state.tightest_tpot_slo_ms = Some(40.0);
        assert_eq!(headroom(&request, &e, B), Some(Headroom { ttft: Some(3900.0), tpot: Some(-20.0) }));
        assert_eq!(own_headroom(&request, &e, B), Some(Headroom { ttft: Some(3900.0), tpot: Some(90.0) }));
        let mut busy = e.clone();
        busy.tpot_ms = Some(120.0);
        let mut too_slow = e.clone();
        too_slow.tpot_ms = Some(200.0);
        assert_eq!(least_harm_with_own_room(&request, &[e.clone(), busy.clone(), too_slow.clone()], B, 0.0), Some(1));
        assert_eq!(least_harm_with_own_room(&request, &[too_slow], B, 0.0), None);
        // Fewer tight decodes to slow outweighs being the busiest.
        let mut crowded = busy.clone();
        crowded.state.tighter_tpot_in_flight = 5;
        let mut few = e.clone();
        few.state.tighter_tpot_in_flight = 1;
        assert_eq!(least_harm_with_own_room(&request, &[crowded.clone(), few.clone()], B, 0.0), Some(1));
        // In time only where the tight decodes crowd: after waiting 2 s for them, late by up to
        // that where fewer run, if its own decode is served there; never late by more than it
        // waited, never where it is too slow even for itself, never having not waited.
        let mut late = few.clone();
        late.ttft_ms = Some(5100.0);
        let harm = |eps: &[EndpointPrediction], waited| least_harm_with_own_room(&request, eps, B, waited);
        assert_eq!(harm(&[crowded.clone(), late.clone()], 2000.0), Some(1));
        assert_eq!(harm(&[crowded.clone(), late.clone()], 1000.0), Some(0), "1,100 ms late, having waited 1,000");
        assert_eq!(harm(&[crowded.clone(), late.clone()], 0.0), Some(0));
        let mut late_and_slow = late.clone();
        late_and_slow.tpot_ms = Some(200.0);
        assert_eq!(harm(&[crowded.clone(), late_and_slow], 2000.0), Some(0));
        // As many tight decodes there: in time wins.
        let mut late_crowded = crowded.clone();
        late_crowded.ttft_ms = Some(5000.0);
        late_crowded.tpot_ms = Some(100.0);
        assert_eq!(harm(&[crowded.clone(), late_crowded], 2000.0), Some(0));
        // A TTFT buffer under 1 asks for a margin under the SLO: 3,900 ms of headroom at 1,
        // -300 ms at 0.85 for a prediction of 3,700 ms on a 4,000 ms SLO.
        let mut near = e.clone();
        near.ttft_ms = Some(3700.0);
        let strict = SloBuffers { ttft: 0.85, tpot: 1.0 };
        assert_eq!(own_headroom(&request, &near, B).and_then(|h| h.ttft), Some(300.0));
        assert!((own_headroom(&request, &near, strict).and_then(|h| h.ttft).unwrap() + 300.0).abs() < 1e-9);
        // In time nowhere: nothing, whatever is late somewhere (the policy ranks by deficit).
        assert_eq!(harm(&[late], 2000.0), None);
        // The tightest request slows nobody: its own room is the positive tier, and a late
        // endpoint is never preferred to one in time.
        let interactive = RequestFeatures {
            slo: Slo { ttft_ms: Some(400.0), tpot_ms: Some(40.0) },
            streaming: true,
            ..Default::default()
        };
        let mut fast_late = e.clone();
        fast_late.ttft_ms = Some(900.0);
        fast_late.tpot_ms = Some(20.0);
        let mut in_time = e.clone();
        in_time.tpot_ms = Some(35.0);
        assert_eq!(least_harm_with_own_room(&interactive, &[fast_late.clone(), in_time], B, 1000.0), Some(1));
        assert_eq!(least_harm_with_own_room(&interactive, &[fast_late], B, 1000.0), None);
    }

    #[test]
    fn waiting_takes_from_the_ttft_slo_down_to_a_floor() {
        let mut r = RequestFeatures::default();
        r.slo.ttft_ms = Some(1000.0);
        r.slo.tpot_ms = Some(50.0);
        assert_eq!(after_waiting(&r, 300.0).slo.ttft_ms, Some(700.0));
        assert_eq!(after_waiting(&r, 300.0).slo.tpot_ms, Some(50.0), "TPOT is per token: untouched");
        assert_eq!(after_waiting(&r, 5000.0).slo.ttft_ms, Some(MIN_REMAINING_TTFT_MS));
        assert_eq!(after_waiting(&r, f64::NAN).slo.ttft_ms, Some(1000.0), "a wait that is no number takes nothing");
        r.slo.ttft_ms = None;
        assert_eq!(after_waiting(&r, 300.0).slo.ttft_ms, None);
    }
}
