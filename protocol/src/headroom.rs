//! Headroom: the slack between a request's stated SLOs and an endpoint's
//! predictions. Defined here because two components judge it: the filter's
//! policy (which tier an endpoint is in) and the predictor's flow control
//! (whether a queued request can go now). One definition, or they disagree on
//! when a request "fits".
//!
//! `ttft = slo_ttft - predicted_ttft`; for a streaming request with a TPOT SLO
//! `tpot = min(slo_tpot, tightest TPOT SLO running there) * buffer -
//! predicted_tpot`. Only the SLOs the request stated are judged.

use crate::messages::{EndpointPrediction, RequestFeatures};

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

/// Headroom of `request` on one endpoint; `None` when a judged SLO has no prediction.
pub fn headroom(request: &RequestFeatures, endpoint: &EndpointPrediction, tpot_buffer: f64) -> Option<Headroom> {
    judge(request, endpoint, tpot_buffer, endpoint.state.tightest_tpot_slo_ms)
}

/// [`headroom`] on the request's own SLOs alone, as if nothing with a tighter TPOT SLO
/// ran there. Where this is positive and [`headroom`] is not, the endpoint would serve
/// the request in time, but its decode would slow the running requests past theirs.
pub fn own_headroom(request: &RequestFeatures, endpoint: &EndpointPrediction, tpot_buffer: f64) -> Option<Headroom> {
    judge(request, endpoint, tpot_buffer, None)
}

/// Of `endpoints`, where the request does least harm among those with room for its own
/// SLOs ([`own_headroom`] positive): the fewest requests in flight with a tighter TPOT SLO
/// than its own (`tighter_tpot_in_flight`, the decodes its own would slow past theirs),
/// and among those the busiest: the least TPOT headroom where TPOT is judged (the slowest
/// decode that still serves it), else the least TTFT headroom. Loose work goes where it
/// slows the fewest tight decodes, and, where it slows some everywhere, where the harm is
/// done already: the endpoints where tight requests still meet theirs are left alone.
/// The filter's policy and the predictor's flow control both place such requests here.
pub fn least_harm_with_own_room(
    request: &RequestFeatures,
    endpoints: &[EndpointPrediction],
    tpot_buffer: f64,
) -> Option<usize> {
    endpoints
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let own = own_headroom(request, e, tpot_buffer).filter(Headroom::is_positive)?;
            own.tpot.or(own.ttft).map(|slack| (i, e.state.tighter_tpot_in_flight, slack))
        })
        .min_by(|(_, harm_a, slack_a), (_, harm_b, slack_b)| harm_a.cmp(harm_b).then(slack_a.total_cmp(slack_b)))
        .map(|(i, _, _)| i)
}

fn judge(
    request: &RequestFeatures,
    endpoint: &EndpointPrediction,
    tpot_buffer: f64,
    running_tpot_slo_ms: Option<f64>,
) -> Option<Headroom> {
    let ttft = match request.slo.ttft_ms {
        Some(slo) => Some(slo - endpoint.ttft_ms?),
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
            Some(target * tpot_buffer - endpoint.tpot_ms?)
        }
        None => None,
    };
    Some(Headroom { ttft, tpot })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Slo;

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
        assert_eq!(headroom(&request, &e, 1.0), Some(Headroom { ttft: Some(3900.0), tpot: Some(-20.0) }));
        assert_eq!(own_headroom(&request, &e, 1.0), Some(Headroom { ttft: Some(3900.0), tpot: Some(90.0) }));
        let mut busy = e.clone();
        busy.tpot_ms = Some(120.0);
        let mut too_slow = e.clone();
        too_slow.tpot_ms = Some(200.0);
        assert_eq!(least_harm_with_own_room(&request, &[e.clone(), busy.clone(), too_slow.clone()], 1.0), Some(1));
        assert_eq!(least_harm_with_own_room(&request, &[too_slow], 1.0), None);
        // Fewer tight decodes to slow outweighs being the busiest.
        let mut crowded = busy.clone();
        crowded.state.tighter_tpot_in_flight = 5;
        let mut few = e.clone();
        few.state.tighter_tpot_in_flight = 1;
        assert_eq!(least_harm_with_own_room(&request, &[crowded, few], 1.0), Some(1));
    }
}
