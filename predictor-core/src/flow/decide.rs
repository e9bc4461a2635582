//! Whether a waiting request goes now, and where: pure functions of its predictions,
//! what it has waited and the flow settings (the rules are the module doc of
//! [`crate::flow`]). Times come in as numbers, so each rule is tested without a clock.

use headroom_protocol::headroom::{after_waiting, headroom, least_harm_with_own_room, SloBuffers};
use headroom_protocol::{EndpointPrediction, FlowTerms, PredictRequest};

use crate::config::FlowConfig;

/// The endpoints with headroom for `req` with `waited_ms` of its TTFT SLO gone (its own
/// SLOs and the tightest TPOT SLO running there), the most first (TTFT and TPOT slack
/// summed; ties in endpoint order). Empty when none has room.
pub fn fits(req: &PredictRequest, terms: &FlowTerms, endpoints: &[EndpointPrediction], waited_ms: f64) -> Vec<usize> {
    let features = after_waiting(&req.request, waited_ms);
    let mut room: Vec<(usize, f64)> = endpoints
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let h = headroom(&features, e, SloBuffers::of(terms)).filter(|h| h.is_positive())?;
            Some((i, h.ttft.unwrap_or(0.0) + h.tpot.unwrap_or(0.0)))
        })
        .collect();
    room.sort_by(|a, b| b.1.total_cmp(&a.1));
    room.into_iter().map(|(i, _)| i).collect()
}

/// Where `req` would go at its neighbours' expense (of the endpoints with room for its own
/// SLOs, where it slows the fewest tighter decodes, as the filter's policy places it), if
/// anywhere; having waited, where it slows fewer still though its first token comes late
/// there by up to `waited_ms` ([`must_go`] then holds at once: the wait ends before the
/// endpoints where loose work gathers drop out of reach, leaving it only those where the
/// tight decodes run).
pub fn own_room(
    req: &PredictRequest,
    terms: &FlowTerms,
    endpoints: &[EndpointPrediction],
    waited_ms: f64,
) -> Option<usize> {
    least_harm_with_own_room(&after_waiting(&req.request, waited_ms), endpoints, SloBuffers::of(terms), waited_ms)
}

/// Whether `req`, which has headroom at `endpoint`, may go there now: the wait ahead of it
/// there (its predicted TTFT less `service_ms`, its own TTFT there were the server idle)
/// is within the dispatch horizon (the server's queue is short), or the request
/// [`must_go`].
///
/// The horizon bounds the queue, not the request's own prefill: judged on the whole
/// predicted TTFT, a prompt whose prefill alone takes longer than the horizon would wait
/// even for an idle server, until its SLO pressed (and a sheddable one until it was shed).
pub fn goes_now(
    req: &PredictRequest,
    terms: &FlowTerms,
    endpoint: &EndpointPrediction,
    service_ms: f64,
    waited_ms: f64,
    config: &FlowConfig,
) -> bool {
    let Some(predicted) = endpoint.ttft_ms else { return false };
    predicted - service_ms <= terms.dispatch_horizon_ms as f64 || must_go(req, endpoint, waited_ms, config)
}

/// Of the endpoints with room for `req` (`room`, from [`fits`]), those it [`goes_now`] to,
/// in the same order: each judged on its own queue. `service_ms` as in [`ready`].
pub fn within_horizon(
    req: &PredictRequest,
    terms: &FlowTerms,
    endpoints: &[EndpointPrediction],
    room: Vec<usize>,
    service_ms: impl Fn(usize) -> f64,
    waited_ms: f64,
    config: &FlowConfig,
) -> Vec<usize> {
    room.into_iter().filter(|&i| goes_now(req, terms, &endpoints[i], service_ms(i), waited_ms, config)).collect()
}

/// Whether `req` cannot wait longer for `endpoint`: what is left of its TTFT SLO past the
/// prediction there is under [`pressure_ms`].
pub fn must_go(req: &PredictRequest, endpoint: &EndpointPrediction, waited_ms: f64, config: &FlowConfig) -> bool {
    let Some(predicted) = endpoint.ttft_ms else { return false };
    req.request.slo.ttft_ms.is_some_and(|slo| slo - waited_ms - predicted <= pressure_ms(slo, config))
}

/// Where a waiting `req` may go now, the one to count it at first; empty while it waits.
/// Those with headroom for what is left of its SLOs and those of the requests running
/// there ([`fits`]) that it [`goes_now`] to (each endpoint's own queue against the horizon:
/// room on a server whose queue is long does not hold it back from one whose queue is
/// short); or, where it has room only at its neighbours' expense (its decode would slow
/// theirs past their TPOT SLO), the one [`own_room`] names once its own SLO presses
/// ([`must_go`]): it waited for them as long as it could; a sheddable request never goes
/// there. `service_ms` gives the request's own TTFT at an endpoint (by index) were it idle.
///
/// The filter's policy places the request among these (`FlowAnswer::cleared`), so the
/// horizon holds wherever it goes.
pub fn ready(
    req: &PredictRequest,
    terms: &FlowTerms,
    endpoints: &[EndpointPrediction],
    service_ms: impl Fn(usize) -> f64,
    waited_ms: f64,
    config: &FlowConfig,
) -> Vec<usize> {
    let room = fits(req, terms, endpoints, waited_ms);
    if !room.is_empty() {
        return within_horizon(req, terms, endpoints, room, service_ms, waited_ms, config);
    }
    // Work that may be refused is not sent to slow work that may not: a sheddable request
    // waits for room beside the tighter decodes until its deadline (the filter's policy
    // would shed it there anyway).
    if req.request.is_sheddable() {
        return Vec::new();
    }
    own_room(req, terms, endpoints, waited_ms)
        .filter(|&at| must_go(req, &endpoints[at], waited_ms, config))
        .into_iter()
        .collect()
}

/// How close to running out of TTFT SLO a waiting request is sent even beyond the
/// dispatch horizon: a tenth of its SLO, and never less than two rechecks.
pub fn pressure_ms(slo_ms: f64, config: &FlowConfig) -> f64 {
    (slo_ms * 0.1).max(2.0 * config.recheck_interval_ms as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::{EndpointState, RequestFeatures, Slo};

    fn request() -> PredictRequest {
        PredictRequest {
            pool: "p".into(),
            request_id: "r1".into(),
            request: RequestFeatures { slo: Slo { ttft_ms: Some(500.0), tpot_ms: None }, ..Default::default() },
            flow: None,
        }
    }

    /// Flow terms with `horizon_ms` as the dispatch horizon, buffers at 1.
    fn terms(horizon_ms: u64) -> FlowTerms {
        FlowTerms {
            max_wait_ms: 10_000,
            tpot_buffer: 1.0,
            ttft_buffer: 1.0,
            dispatch_horizon_ms: horizon_ms,
            fairness_id: String::new(),
        }
    }

    fn endpoint(ttft_ms: f64) -> EndpointPrediction {
        EndpointPrediction {
            address: "10.0.0.1:8000".into(),
            ttft_ms: Some(ttft_ms),
            tpot_ms: Some(10.0),
            state: EndpointState::default(),
        }
    }

    #[test]
    fn a_request_goes_when_the_queue_ahead_is_within_the_horizon_or_its_own_slo_presses() {
        let mut req = request();
        req.request.slo.ttft_ms = Some(1000.0);
        let config = FlowConfig::default();
        let busy = [endpoint(300.0)];
        let short = |_| 20.0; // the request's own TTFT on the idle server: the rest is queue
        assert_eq!(ready(&req, &terms(400), &busy, short, 0.0, &config), vec![0], "within the horizon");
        assert_eq!(
            ready(&req, &terms(150), &busy, short, 0.0, &config),
            Vec::<usize>::new(),
            "has room, but the queue is long"
        );
        // 1000 - 650 waited - 300 predicted = 50 ms left, under a tenth of the SLO: it must go.
        assert_eq!(ready(&req, &terms(150), &busy, short, 650.0, &config), vec![0]);
        // Past its SLO there is no room at all: never "ready", it expires instead.
        assert_eq!(ready(&req, &terms(150), &busy, short, 800.0, &config), Vec::<usize>::new());
        // A long prompt whose own prefill takes 280 of the 300 ms: 20 ms of queue, so it goes
        // at once; its prefill is no queue, and waiting would never shorten it.
        assert_eq!(ready(&req, &terms(150), &busy, |_| 280.0, 0.0, &config), vec![0], "the horizon is the queue");
        assert_eq!(pressure_ms(1000.0, &config), 100.0);
        assert_eq!(pressure_ms(100.0, &config), 40.0, "never under two rechecks");
    }

    #[test]
    fn every_endpoint_is_judged_on_its_own_queue_and_the_most_room_comes_first() {
        let mut req = request();
        req.request.slo.ttft_ms = Some(1000.0);
        let terms = terms(150);
        let config = FlowConfig::default();
        let own = |_| 20.0;
        // The most room (a fast server, 300 ms to a first token) behind a long queue; less
        // room (500 ms, a slow server's prefill) with none; none at all (1.2 s).
        let (fast_busy, slow_free, late) = (endpoint(300.0), endpoint(500.0), endpoint(1200.0));
        let eps = [late.clone(), slow_free.clone(), fast_busy.clone()];
        assert_eq!(fits(&req, &terms, &eps, 0.0), vec![2, 1], "by room, the most first");
        let slow_prefill = |i| if i == 1 { 480.0 } else { 20.0 };
        // Only the slow server's queue is within the horizon: it goes now, there alone.
        assert_eq!(ready(&req, &terms, &eps, slow_prefill, 0.0, &config), vec![1]);
        // Both queues short: both cleared, the most room first (where it is counted).
        let both_short = |i| if i == 2 { 200.0 } else { 480.0 };
        assert_eq!(ready(&req, &terms, &eps, both_short, 0.0, &config), vec![2, 1]);
        // Neither queue short: it waits.
        assert_eq!(ready(&req, &terms, &eps, own, 0.0, &config), Vec::<usize>::new());
    }

    #[test]
    fn a_request_with_room_only_at_its_neighbours_expense_waits_until_its_own_slo_presses() {
        // A batch request: 4 s TTFT, 150 ms TPOT, streaming.
        let mut req = request();
        req.request.slo = Slo { ttft_ms: Some(4000.0), tpot_ms: Some(150.0) };
        req.request.streaming = true;
        let terms = terms(150);
        let config = FlowConfig::default();
        // An idle queue, but interactive requests (40 ms TPOT SLO) decode there and its
        // decode would take the step time to 60 ms.
        let mut shared = endpoint(100.0);
        shared.tpot_ms = Some(60.0);
        shared.state.tightest_tpot_slo_ms = Some(40.0);
        let eps = [shared.clone()];
        let own = |_| 100.0;
        assert!(fits(&req, &terms, &eps, 0.0).is_empty());
        assert_eq!(own_room(&req, &terms, &eps, 0.0), Some(0), "its own SLOs are met there");
        assert_eq!(ready(&req, &terms, &eps, own, 0.0, &config), Vec::<usize>::new(), "waits while they decode");
        // 4000 - 3550 waited - 100 predicted = 350 ms left, under a tenth of its SLO: it goes.
        assert_eq!(ready(&req, &terms, &eps, own, 3550.0, &config), vec![0], "its own SLO presses");
        // Once their decodes end (nothing tight runs there), it goes at once.
        let mut freed = shared;
        freed.state.tightest_tpot_slo_ms = None;
        assert_eq!(ready(&req, &terms, &[freed], own, 0.0, &config), vec![0]);
        // Where it would not meet even its own SLO, waiting is no use: never "ready".
        let mut slow = endpoint(100.0);
        slow.tpot_ms = Some(200.0);
        assert_eq!(own_room(&req, &terms, &[slow], 0.0), None);
        // Pressed, it goes where the harm is done already: the busiest endpoint that still
        // meets its own SLOs, not the one where tight requests still meet theirs.
        let mut lost = endpoint(100.0);
        lost.tpot_ms = Some(120.0);
        lost.state.tightest_tpot_slo_ms = Some(40.0);
        let both = [eps[0].clone(), lost];
        assert_eq!(ready(&req, &terms, &both, own, 3550.0, &config), vec![1]);
        // Unless more of those tight decodes run there: fewer slowed outweighs the busiest.
        let [mut few, mut many] = both;
        few.state.tighter_tpot_in_flight = 1;
        many.state.tighter_tpot_in_flight = 3;
        assert_eq!(ready(&req, &terms, &[few.clone(), many.clone()], own, 3550.0, &config), vec![0]);
        // Where loose work gathers the queue is long: 2.5 s to a first token where one tight
        // decode runs, 100 ms where three do. It waits while the first is in time there (with
        // room to spare), and once it would be late there by less than it has waited, it goes
        // there at once: not on waiting until only the endpoint among the three is in time.
        let mut gathered = few;
        gathered.ttft_ms = Some(2500.0);
        let apart = [gathered, many];
        assert_eq!(ready(&req, &terms, &apart, own, 1000.0, &config), Vec::<usize>::new(), "500 ms to spare there");
        assert_eq!(ready(&req, &terms, &apart, own, 1600.0, &config), vec![0], "100 ms late, having waited 1.6 s");
        // A sheddable request is never sent to slow them, however pressed: the filter would
        // shed it there, and on azure held at 140 req/s placing it cost the interactive class
        // 14 points. It waits for room beside them until its deadline.
        req.request.priority = -1;
        assert_eq!(ready(&req, &terms, &eps, own, 3550.0, &config), Vec::<usize>::new());
        let mut freed = eps[0].clone();
        freed.state.tightest_tpot_slo_ms = None;
        assert_eq!(ready(&req, &terms, &[freed], own, 3550.0, &config), vec![0], "room beside them: it goes");
    }
}
