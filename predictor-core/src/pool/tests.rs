//! The pool's unit tests.

use super::books::FIRST_TOKEN_GRACE;
use super::endpoint::{DECODE_FRESH, PREFILL_RATE_TAU};
use super::*;
use headroom_protocol::Slo;

/// Test set-up: `d`'s request as this predictor answered it (`predicted`, TTFT and TPOT, at
/// `d.endpoint`; nothing elsewhere), then dispatched.
impl Pool {
    pub(crate) fn predicted_then_dispatched(
        &mut self,
        d: &Dispatch,
        predicted: (Option<f64>, Option<f64>),
        now: Instant,
    ) -> Applied {
        let states = vec![EndpointState::default(); self.endpoints.len()];
        let answers: Vec<_> =
            self.endpoints.iter().map(|e| if e.address == d.endpoint { predicted } else { (None, None) }).collect();
        self.remember(&d.request_id, &d.request, &states, &answers, now);
        self.dispatch(d, now)
    }
}

fn dispatch(id: &str, endpoint: &str, tokens: u32, tpot: Option<f64>) -> Dispatch {
    Dispatch {
        pool: "p".into(),
        request_id: id.into(),
        endpoint: endpoint.into(),
        request: RequestFeatures {
            input_tokens: tokens,
            prefix_hashes: vec![1, 2],
            streaming: true,
            max_tokens: Some(10),
            slo: Slo { ttft_ms: None, tpot_ms: tpot },
            prediction_based: true,
            ..Default::default()
        },
    }
}

fn pool() -> Pool {
    Pool::new("p", &["a:1".into(), "b:2".into()], 100)
}

/// A dispatch of a request the predictor answered: the request and the endpoint, nothing else.
fn lean(id: &str, endpoint: &str) -> Dispatch {
    Dispatch { request: RequestFeatures::default(), ..dispatch(id, endpoint, 0, None) }
}

/// What a predict answer for `id` said: 500 tokens, `b:2` at `ttft` ms.
fn remember(p: &mut Pool, id: &str, ttft: f64, now: Instant) {
    let request = RequestFeatures { input_tokens: 500, max_tokens: Some(10), ..Default::default() };
    let states =
        [EndpointState { running: 1, ..Default::default() }, EndpointState { running: 7, ..Default::default() }];
    p.remember(id, &request, &states, &[(Some(10.0), Some(5.0)), (Some(ttft), Some(6.0))], now);
}

/// Predict batches of 4,096 prefix hashes a request, 100,000 of them, took the predictor
/// to 3.3 GB: the records are weighed, and past [`MAX_RECORD_BYTES`] the oldest go (their
/// dispatches are tracked without a record); the newest are kept whole.
#[test]
fn records_hold_at_most_their_byte_cap_and_keep_the_newest() {
    let mut p = pool();
    let now = Instant::now();
    let request = RequestFeatures { prefix_hashes: vec![7; 4_096], ..Default::default() };
    let states = [EndpointState::default(), EndpointState::default()];
    let n = MAX_RECORD_BYTES / (4_096 * 8) + 500;
    for k in 0..n {
        p.remember(&format!("r{k}"), &request, &states, &[(None, None), (None, None)], now);
    }
    assert!(p.records_bytes() <= MAX_RECORD_BYTES, "{}", p.records_bytes());
    assert!(p.records_kept() < n - 500 && p.records_kept() > (n - 500) * 9 / 10, "{}", p.records_kept());
    assert_eq!(p.dispatch(&lean(&format!("r{}", n - 1), "a:1"), now), Applied::Accepted, "the newest kept");
    assert_eq!(p.dispatch(&lean("r0", "a:1"), now), Applied::AcceptedWithoutRecord, "the oldest went");
    let before = p.records_bytes();
    p.expire(now + RECORD_TTL);
    assert_eq!((p.records_kept(), p.records_bytes()), (0, 0), "weights leave with their records ({before})");
}

#[test]
fn pool_gauges_average_the_endpoints_with_fresh_metrics_only() {
    let mut p = Pool::new("p", &["a:1".into(), "b:2".into(), "c:3".into()], 100);
    let t0 = Instant::now();
    let none = p.gauges(t0, Duration::from_secs(5));
    assert_eq!((none.ready, none.kv_usage, none.waiting), (0, 0.0, 0.0), "nothing scraped: no division by zero");
    let m = |running, waiting, kv_usage| EngineMetrics { running, waiting, kv_usage, decode: None, queue_read: true };
    p.endpoints[0].scraped(m(2, 1, 0.2), t0);
    p.endpoints[1].scraped(m(4, 3, 0.6), t0 + Duration::from_secs(4));
    p.endpoints[2].scraped(m(9, 9, 0.9), t0);
    p.endpoints[2].unreachable();
    let g = p.gauges(t0 + Duration::from_secs(6), Duration::from_secs(5));
    assert_eq!(g.ready, 1, "a's scrape is 6 s old, c is unreachable");
    assert_eq!(g.waiting_by_endpoint, [("b:2".to_string(), 3)]);
    let g = p.gauges(t0 + Duration::from_secs(5), Duration::from_secs(5));
    assert_eq!((g.ready, g.running, g.waiting), (2, 3.0, 2.0));
    assert!((g.kv_usage - 0.4).abs() < 1e-12);
}

#[test]
fn a_lean_dispatch_is_tracked_from_the_predictors_own_record() {
    let mut p = pool();
    let now = Instant::now();
    remember(&mut p, "r", 300.0, now);
    // Flow control answered again at release: the newer answer is the one dispatched on.
    remember(&mut p, "r", 80.0, now + Duration::from_millis(5));
    assert_eq!(p.dispatch(&lean("r", "b:2"), now), Applied::Accepted);
    assert_eq!(p.records_kept(), 0, "the record moved into the books");
    assert_eq!(p.states_for(&RequestFeatures::default(), now)[1].uncached_tokens_in_flight, 500);
    let Finished::Tracked(at, Some(kept)) = p.finish("r", now) else { panic!("tracked with its record") };
    assert_eq!(at, "b:2");
    assert_eq!(kept.state.running, 7, "the state of the endpoint it went to");
    assert_eq!((kept.predicted_ttft_ms, kept.predicted_tpot_ms), (Some(80.0), Some(6.0)));
    assert_eq!(kept.request.input_tokens, 500);
}

#[test]
fn a_header_only_body_shorter_than_its_claim_is_booked_as_it_passed() {
    let mut p = pool();
    let now = Instant::now();
    remember(&mut p, "r", 300.0, now);
    let passed = |tokens| Dispatch {
        request: RequestFeatures { input_tokens: tokens, ..Default::default() },
        ..lean("r", "b:2")
    };
    assert_eq!(p.dispatch(&passed(120), now), Applied::Accepted);
    assert_eq!(p.states_for(&RequestFeatures::default(), now)[1].uncached_tokens_in_flight, 120);
    let Finished::Tracked(_, Some(kept)) = p.finish("r", now) else { panic!("tracked with its record") };
    assert_eq!(kept.request.input_tokens, 120, "learned from the prompt that passed");
    // A body cannot make its request larger than predicted: the claim bounds it.
    remember(&mut p, "s", 300.0, now);
    let larger = Dispatch { request_id: "s".into(), ..passed(900) };
    assert_eq!(p.dispatch(&larger, now), Applied::Accepted);
    assert_eq!(p.states_for(&RequestFeatures::default(), now)[1].uncached_tokens_in_flight, 500);
}

#[test]
fn a_dispatch_without_a_record_counts_as_load_and_keeps_nothing_to_learn_from() {
    let mut p = pool();
    let now = Instant::now();
    // Predicted by another replica: a lean dispatch says only where it went.
    assert_eq!(p.dispatch(&lean("elsewhere", "a:1"), now), Applied::AcceptedWithoutRecord);
    assert_eq!(p.in_flight_on("a:1"), 1);
    // Placed by the filter's fallback: the features its dispatch carries count as load.
    assert_eq!(p.dispatch(&dispatch("fallback", "a:1", 400, None), now), Applied::AcceptedWithoutRecord);
    assert_eq!(p.states_for(&RequestFeatures::default(), now)[0].uncached_tokens_in_flight, 400);
    // Nothing says how long they run: held for the floor, not the ten-minute ceiling.
    assert_eq!(p.expire(now + Expiry::default().floor), 2);
    assert_eq!(p.finish("elsewhere", now), Finished::Late("a:1".into(), None));
    assert_eq!(p.finish("fallback", now), Finished::Late("a:1".into(), None));
}

#[test]
fn records_are_bounded_and_forgotten_undispatched() {
    let mut p = pool().with_max_in_flight(3);
    let now = Instant::now();
    for i in 0..10 {
        remember(&mut p, &format!("r{i}"), 100.0, now);
    }
    assert_eq!(p.records_kept(), 3, "the oldest go first");
    assert_eq!(p.dispatch(&lean("r0", "a:1"), now), Applied::AcceptedWithoutRecord);
    assert_eq!(p.dispatch(&lean("r9", "a:1"), now), Applied::Accepted);
    p.expire(now + RECORD_TTL);
    assert_eq!(p.records_kept(), 0, "a record is kept for its dispatch, not longer");
}

#[test]
fn dispatch_and_report_track_in_flight() {
    let mut p = pool();
    let now = Instant::now();
    assert_eq!(p.dispatch(&dispatch("r1", "a:1", 100, Some(20.0)), now), Applied::AcceptedWithoutRecord);
    assert_eq!(p.dispatch(&dispatch("r2", "a:1", 50, Some(10.0)), now), Applied::AcceptedWithoutRecord);
    assert_eq!(p.dispatch(&dispatch("r3", "zz:9", 50, None), now), Applied::UnknownEndpoint);
    let s = p.states_for(&RequestFeatures::default(), now);
    assert_eq!(s[0].in_flight, 2);
    assert_eq!(s[0].tokens_in_flight, 170);
    assert_eq!(s[0].tightest_tpot_slo_ms, Some(10.0));
    assert_eq!(s[1].in_flight, 0);
    // Counted against the asking request's own TPOT SLO: the decodes it would slow past theirs.
    let asking =
        |tpot| RequestFeatures { streaming: true, slo: Slo { ttft_ms: None, tpot_ms: tpot }, ..Default::default() };
    let mut tighter = |tpot| p.states_for(&asking(tpot), now)[0].tighter_tpot_in_flight;
    assert_eq!((tighter(Some(150.0)), tighter(Some(15.0)), tighter(Some(10.0)), tighter(None)), (2, 1, 0, 0));
    assert_eq!(p.finish("r1", now), Finished::Tracked("a:1".into(), None));
    p.finish("r2", now);
    assert_eq!(p.in_flight_on("a:1"), 0);
    assert_eq!(p.finish("never-dispatched", now), Finished::Unknown, "a report for an unseen request is not tracked");
}

/// Invented dispatches (a token holder's) and lost reports held load the engine never had
/// for up to `in_flight_ttl_s`: 10,000 ids put 10,000 requests on an idle endpoint. Its
/// engine's count bounds them: once they are [`SHOWS_WITHIN`] older than a fresh scrape,
/// all but what it shows (and [`VOUCH_SLACK`]) are forgotten, the oldest first, and a
/// report that comes after all is late, not lost. The newest dispatches stand until their
/// engine could show them, and a scrape that read no count, or an old one, vouches for
/// nothing.
#[test]
fn the_books_hold_no_more_than_the_engine_shows_beyond_the_newest_dispatches() {
    let mut p = pool();
    let t0 = Instant::now();
    for k in 0..10_000 {
        p.dispatch(&dispatch(&format!("fake{k}"), "a:1", 10, None), t0);
    }
    p.dispatch(&dispatch("real", "a:1", 10, None), t0 + Duration::from_secs(1));
    let later = t0 + SHOWS_WITHIN + Duration::from_secs(2);
    p.dispatch(&dispatch("new", "a:1", 10, None), later);
    let shows = |running| EngineMetrics { running, waiting: 1, kv_usage: 0.1, decode: None, queue_read: true };

    // No count read, then a stale one: nothing is vouched against.
    p.endpoints[0].scraped(EngineMetrics { queue_read: false, ..shows(0) }, later);
    assert_eq!(p.expire(later), 0);
    p.endpoints[0].scraped(shows(0), later);
    assert_eq!(p.expire(later + VOUCH_FRESH + Duration::from_secs(1)), 0);

    // Fresh: 2 running, 1 waiting, so 3 + 4 of the 10,001 old ones stay, the newest of them.
    p.endpoints[0].scraped(shows(2), later);
    assert_eq!(p.expire(later), 10_001 - 7);
    assert_eq!(p.in_flight_on("a:1"), 8, "7 vouched for, and the dispatch too new to show");
    assert!(p.in_flight.contains_key("real") && p.in_flight.contains_key("new"));
    assert_eq!(p.finish("fake0", later), Finished::Late("a:1".into(), None), "a report after all still teaches");
    assert_eq!(p.expire(later), 0, "what the engine shows stays");
    assert_eq!(p.in_flight_on("b:2"), 0);
}

/// One client asking a TPOT at or near the endpoint's fastest decode step (7 ms, 5 ms)
/// used to become the target of every later request on its endpoint: two such streams
/// took the simulated H100s from every other tenant. A goal tightens others only when it
/// leaves the endpoint room for a batch (at least twice its fastest step), and only for a
/// request placed by its goals; then for its own band and those below, also where it was
/// predicted to miss under load (40 ms, predicted 60): protecting it is what lets the
/// endpoint get back under its SLO.
#[test]
fn only_a_running_slo_that_leaves_room_and_was_routed_by_tightens_and_only_its_band_and_below() {
    let cost = ClassCost { prefill_ms_per_token: 0.03, fastest_tpot_ms: 7.0 };
    let mut p = pool().with_class_costs(vec![cost]);
    let now = Instant::now();
    assert_eq!(p.dispatch(&dispatch("liar", "a:1", 10, Some(5.0)), now), Applied::AcceptedWithoutRecord);
    assert_eq!(p.dispatch(&dispatch("greedy", "a:1", 10, Some(7.0)), now), Applied::AcceptedWithoutRecord);
    assert_eq!(p.dispatch(&dispatch("near", "a:1", 10, Some(13.9)), now), Applied::AcceptedWithoutRecord);
    let honest = dispatch("tight", "b:2", 10, Some(14.0));
    assert_eq!(p.predicted_then_dispatched(&honest, (Some(100.0), Some(7.0)), now), Applied::Accepted);
    let mut unrouted = dispatch("unrouted", "b:2", 10, Some(20.0));
    unrouted.request.prediction_based = false;
    assert_eq!(p.dispatch(&unrouted, now), Applied::AcceptedWithoutRecord);
    let asking = |tpot, priority| RequestFeatures {
        streaming: true,
        priority,
        slo: Slo { ttft_ms: None, tpot_ms: Some(tpot) },
        ..Default::default()
    };
    let s = p.states_for(&asking(100.0, 0), now);
    assert_eq!((s[0].tightest_tpot_slo_ms, s[0].tighter_tpot_in_flight), (None, 0), "claims under 14 ms are left out");
    assert_eq!((s[1].tightest_tpot_slo_ms, s[1].tighter_tpot_in_flight), (Some(14.0), 1), "the seed's rule");
    let sheddable = p.states_for(&asking(100.0, -1), now);
    assert_eq!(sheddable[1].tightest_tpot_slo_ms, Some(14.0), "a lower band is held to it");
    let above = p.states_for(&asking(100.0, 1), now);
    assert_eq!(above[1].tightest_tpot_slo_ms, None, "a higher band is not");
    p.finish("tight", now);
    let s = p.states_for(&asking(100.0, 0), now);
    assert_eq!(s[1].tightest_tpot_slo_ms, None, "a goal it was not placed by holds nobody");
    assert_eq!(s[1].in_flight, 1, "though its load counts");
    // Predicted to miss its SLO where it runs, but above the floor: it protects.
    let loaded = dispatch("loaded", "a:1", 10, Some(40.0));
    assert_eq!(p.predicted_then_dispatched(&loaded, (Some(100.0), Some(60.0)), now), Applied::Accepted);
    assert_eq!(p.states_for(&asking(100.0, 0), now)[0].tightest_tpot_slo_ms, Some(40.0));
    // With no engine costs known, every goal placed by counts, as the seed's rule has it.
    let mut unknown = pool();
    assert_eq!(unknown.dispatch(&dispatch("liar", "a:1", 10, Some(5.0)), now), Applied::AcceptedWithoutRecord);
    assert_eq!(unknown.states_for(&asking(100.0, 0), now)[0].tightest_tpot_slo_ms, Some(5.0));
}

/// `n`, `best_of` and a list's prompts each run as a sequence: each is booked as a
/// request in flight with its own output.
#[test]
fn every_sequence_of_a_request_is_booked() {
    let mut p = pool();
    let now = Instant::now();
    let mut d = dispatch("n4", "a:1", 100, None);
    d.request.sequences = 4;
    p.dispatch(&d, now);
    let s = p.states_for(&RequestFeatures::default(), now);
    assert_eq!((s[0].in_flight, s[0].tokens_in_flight), (4, 100 + 4 * 10));
    p.finish("n4", now);
    let s = p.states_for(&RequestFeatures::default(), now);
    assert_eq!((s[0].in_flight, s[0].tokens_in_flight), (0, 0), "all of them leave with it");
}

#[test]
fn a_huge_predicted_ttft_is_not_a_panic() {
    let mut p = pool();
    let now = Instant::now();
    for (i, ms) in [1e300, 1e22, f64::MAX, f64::INFINITY, f64::NAN, -5.0].into_iter().enumerate() {
        let d = dispatch(&format!("r{i}"), "a:1", 10, None);
        assert_eq!(p.predicted_then_dispatched(&d, (Some(ms), None), now), Applied::Accepted, "{ms}");
    }
    assert_eq!(p.states_for(&RequestFeatures::default(), now)[0].in_flight, 6);
}

#[test]
fn tracking_is_bounded() {
    let mut p = pool().with_max_in_flight(3);
    let now = Instant::now();
    for i in 0..3 {
        let d = dispatch(&format!("r{i}"), "a:1", 1, None);
        assert_eq!(p.predicted_then_dispatched(&d, (Some(100.0), None), now), Applied::Accepted);
    }
    assert_eq!(p.dispatch(&dispatch("r3", "a:1", 1, None), now), Applied::PoolFull);
    for i in 0..100 {
        p.finish(&format!("flood{i}"), now);
    }
    assert_eq!(p.tracked(), (3, 3), "finished ids capped too");
    // Expiry forgets finished ids without any scrape.
    p.expire(now + FINISHED_MEMORY);
    assert_eq!(p.tracked(), (3, 0));
}

#[test]
fn requests_without_a_tpot_slo_never_weaken_the_tightest() {
    let mut p = pool();
    let now = Instant::now();
    p.dispatch(&dispatch("with", "a:1", 10, Some(25.0)), now);
    p.dispatch(&dispatch("without", "a:1", 10, None), now);
    let mut non_streaming = dispatch("batch", "a:1", 10, Some(5.0));
    non_streaming.request.streaming = false; // its TPOT is never observed: it protects nothing
    p.dispatch(&non_streaming, now);
    assert_eq!(p.states_for(&RequestFeatures::default(), now)[0].tightest_tpot_slo_ms, Some(25.0));
    p.finish("with", now);
    assert_eq!(p.states_for(&RequestFeatures::default(), now)[0].tightest_tpot_slo_ms, None);
}

#[test]
fn late_dispatch_after_report_is_ignored() {
    let mut p = pool();
    let now = Instant::now();
    p.finish("r1", now);
    assert_eq!(p.dispatch(&dispatch("r1", "a:1", 10, None), now), Applied::AlreadyFinished);
    assert_eq!(p.in_flight_on("a:1"), 0);
}

#[test]
fn a_dispatch_sent_again_keeps_the_first() {
    let mut p = pool();
    let now = Instant::now();
    let mut d = dispatch("r1", "a:1", 100, None);
    d.request.prefix_hashes.clear(); // a resent prompt would otherwise find itself cached
    p.dispatch(&d, now);
    assert!(p.first_token("r1", "a:1", now));
    // Resent after a call that timed out once the predictor had applied it.
    assert_eq!(p.dispatch(&d, now), Applied::AcceptedWithoutRecord);
    let s = p.states_for(&RequestFeatures::default(), now);
    assert_eq!((s[0].in_flight, s[0].uncached_tokens_in_flight), (1, 0), "still past prefill, counted once");
    assert_eq!(p.endpoints[0].prefill_rate(now), 100.0 / PREFILL_RATE_TAU.as_secs_f64(), "its prompt once");
}

#[test]
fn the_prefill_backlog_drains_first_come_first_served_from_each_dispatch() {
    // 0.1 ms a token on class 0 (a:1), twice that on class 1 (b:2).
    let cost = |ms| ClassCost { prefill_ms_per_token: ms, fastest_tpot_ms: 7.0 };
    let mut p = Pool::with_hardware("p", vec![("a:1".into(), 0), ("b:2".into(), 1)], 100)
        .with_class_costs(vec![cost(0.1), cost(0.2)]);
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    // No first token expected for a long time.
    let d = |p: &mut Pool, id: &str, endpoint: &str, tokens: u32, hash: u64, at: Instant| {
        let mut d = dispatch(id, endpoint, tokens, None);
        d.request.prefix_hashes = vec![hash]; // nothing cached
        p.predicted_then_dispatched(&d, (Some(10_000.0), None), at)
    };
    d(&mut p, "r1", "a:1", 1000, 11, t0); // prefills over 0-100 ms
    d(&mut p, "r2", "a:1", 500, 12, ms(20)); // behind it: 100-150 ms
    d(&mut p, "r3", "b:2", 1000, 13, t0); // 0-200 ms on the slower class
    let at = |p: &mut Pool, n: u64| {
        let s = p.states_for(&RequestFeatures::default(), ms(n));
        [0, 1].map(|i| (s[i].prefill_backlog_tokens, s[i].uncached_tokens_in_flight))
    };
    assert_eq!(at(&mut p, 20), [(Some(800 + 500), 1500), (Some(900), 1000)]);
    assert_eq!(at(&mut p, 120), [(Some(300), 1500), (Some(400), 1000)], "r1 done, r2 20 ms into its turn");
    assert_eq!(at(&mut p, 250), [(Some(0), 1500), (Some(0), 1000)], "done, though no first token came yet");
    // Each state says the cost it drains at: what the filter weighs a move off a cache by.
    let costs =
        p.states_for(&RequestFeatures::default(), ms(250)).iter().map(|s| s.prefill_ms_per_token).collect::<Vec<_>>();
    assert_eq!(costs, [Some(0.1), Some(0.2)]);
    // A first token seen takes the prompt out of both.
    assert!(p.first_token("r2", "a:1", ms(130)));
    assert_eq!(at(&mut p, 130)[0], (Some(0), 1000));
    // Without costs the backlog is every prompt in prefill, counted whole.
    let mut whole = pool();
    d(&mut whole, "w", "a:1", 1000, 14, t0);
    assert_eq!(at(&mut whole, 250)[0], (Some(1000), 1000));
}

#[test]
fn prefill_tokens_leave_after_predicted_ttft_and_prefix_is_remembered() {
    let mut p = pool();
    let now = Instant::now();
    p.predicted_then_dispatched(&dispatch("r1", "a:1", 100, None), (Some(100.0), None), now);
    let req = RequestFeatures { prefix_hashes: vec![1, 2], ..Default::default() };
    let s = p.states_for(&req, now);
    assert_eq!(s[0].uncached_tokens_in_flight, 100);
    assert_eq!(s[0].prefix_match, 1.0);
    assert_eq!(s[1].prefix_match, 0.0);
    let later = now + Duration::from_millis(150);
    assert_eq!(p.states_for(&req, later)[0].uncached_tokens_in_flight, 0);
    // A second request with the same prefix is mostly cached.
    p.predicted_then_dispatched(&dispatch("r2", "a:1", 100, None), (Some(100.0), None), later);
    assert_eq!(p.states_for(&req, later)[0].uncached_tokens_in_flight, 0);
}

#[test]
fn an_unreachable_server_loses_its_state_and_its_remembered_prefixes() {
    let mut p = pool();
    let now = Instant::now();
    p.endpoints[0].metrics =
        Some(EngineMetrics { running: 1, waiting: 0, kv_usage: 0.1, decode: None, queue_read: true });
    p.endpoints[0].scraped_at = Some(now);
    p.predicted_then_dispatched(&dispatch("r1", "a:1", 100, None), (Some(100.0), None), now);
    let req = RequestFeatures { prefix_hashes: vec![1, 2], ..Default::default() };
    assert_eq!(p.states_for(&req, now)[0].prefix_match, 1.0);
    p.endpoints[0].unreachable();
    let s = p.states_for(&req, now);
    assert_eq!(s[0].prefix_match, 0.0, "a restarted server caches nothing");
    assert_eq!(s[0].metrics_age_ms, None, "no engine state to predict from");
}

#[test]
fn a_first_token_ends_prefill_when_observed_not_when_predicted() {
    let mut p = pool();
    let now = Instant::now();
    p.predicted_then_dispatched(&own("slow", 100), (Some(50.0), None), now);
    p.predicted_then_dispatched(&own("fast", 300), (Some(100.0), None), now);
    let uncached =
        |p: &mut Pool, at: Instant| p.states_for(&RequestFeatures::default(), at)[0].uncached_tokens_in_flight;
    // An event for another endpoint, or an unknown request, changes nothing.
    assert!(!p.first_token("fast", "b:1", now) && !p.first_token("nope", "a:1", now));
    assert!(p.first_token("fast", "a:1", now + Duration::from_millis(5)));
    let at = now + Duration::from_millis(10);
    assert_eq!(uncached(&mut p, at), 100, "fast is past prefill, slow still in it");
    // With first tokens reported, a prompt whose predicted TTFT passed still counts
    // until its own first token (within the grace period)...
    let late = now + Duration::from_millis(500);
    assert_eq!(uncached(&mut p, late), 100);
    assert!(p.first_token("slow", "a:1", late));
    assert_eq!(uncached(&mut p, late), 0);
    // ...and a lost event is forgotten after the grace period.
    p.predicted_then_dispatched(&own("lost", 100), (Some(50.0), None), late);
    assert_eq!(uncached(&mut p, late + FIRST_TOKEN_GRACE + Duration::from_millis(100)), 0);
}

/// A dispatch to `a:1` with a prefix of its own (nothing cached from the others).
fn own(id: &str, tokens: u32) -> Dispatch {
    let mut d = dispatch(id, "a:1", tokens, None);
    d.request.prefix_hashes = vec![id.len() as u64 * 1000 + u64::from(id.as_bytes()[0])];
    d
}

#[test]
fn discovered_endpoints_join_and_leave_keeping_state_of_those_that_stay() {
    let mut p = Pool::new("p", &["s:1".into()], 100);
    let now = Instant::now();
    let change = p.set_discovered(0, vec![("k:1".into(), 2), ("k:2".into(), 2), ("s:1".into(), 9)]);
    assert_eq!(change, EndpointChange { added: 2, removed: 0, dropped_in_flight: 0 });
    let addresses: Vec<&str> = p.endpoints.iter().map(|e| e.address.as_str()).collect();
    assert_eq!(addresses, ["s:1", "k:1", "k:2"], "static first, duplicates once");
    assert_eq!(p.endpoints[1].hardware_class, 2);
    p.endpoints[2].metrics =
        Some(EngineMetrics { running: 4, waiting: 0, kv_usage: 0.5, decode: None, queue_read: true });
    p.dispatch(&dispatch("on-k1", "k:1", 10, None), now);
    p.dispatch(&dispatch("on-k2", "k:2", 10, None), now);
    p.dispatch(&dispatch("on-s1", "s:1", 10, None), now);

    // k:1 goes (deleted or no longer ready): its request leaves with it; k:2 moves up one index.
    let change = p.set_discovered(0, vec![("k:2".into(), 2)]);
    assert_eq!(change, EndpointChange { added: 0, removed: 1, dropped_in_flight: 1 });
    assert_eq!(p.in_flight_on("k:2"), 1);
    assert_eq!(p.in_flight_on("s:1"), 1);
    assert_eq!(p.endpoints[1].metrics.map(|m| m.running), Some(4), "metrics stay with the address");
    let s = p.states_for(&RequestFeatures::default(), now);
    assert_eq!((s[0].in_flight, s[1].in_flight), (1, 1));
    p.finish("on-k2", now);
    assert_eq!(p.in_flight_on("k:2"), 0);
    // A second source adds to the first.
    let change = p.set_discovered(1, vec![("k:3".into(), 1)]);
    assert_eq!((change.added, p.endpoints.len()), (1, 3));
}

/// A scrape of `a:1` whose histogram holds `tokens` tokens decoded in `sum_s`.
fn scrape(p: &mut Pool, sum_s: f64, tokens: f64, at: Instant) {
    let decode = Some(DecodeCounter { sum_s, tokens });
    p.endpoints[0].scraped(EngineMetrics { decode, ..Default::default() }, at);
}

fn recent_tpot(p: &mut Pool, at: Instant) -> Option<f64> {
    p.states_for(&RequestFeatures::default(), at)[0].recent_tpot_ms
}

#[test]
fn the_step_time_comes_from_the_histogram_between_scrapes_not_from_late_reports() {
    let mut p = pool();
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    p.observed_tpot("a:1", 40.0, t0);
    assert_eq!(recent_tpot(&mut p, t0), Some(40.0), "reports serve a server without the histogram");
    scrape(&mut p, 100.0, 10_000.0, at(0));
    assert_eq!(recent_tpot(&mut p, at(0)), Some(40.0), "one reading is no window");
    // 200 tokens at 20 ms each: the first reading replaces what reports said.
    scrape(&mut p, 104.0, 10_200.0, at(200));
    assert_eq!(recent_tpot(&mut p, at(200)), Some(20.0));
    // A report of a request that decoded long ago does not move it while the histogram does.
    p.observed_tpot("a:1", 80.0, at(250));
    assert_eq!(recent_tpot(&mut p, at(250)), Some(20.0));
    // Too few tokens say nothing yet; the window grows until they are enough.
    scrape(&mut p, 104.3, 10_210.0, at(400));
    assert_eq!(recent_tpot(&mut p, at(400)), Some(20.0));
    // The batch slowed to 50 ms a token: the estimate follows within a few seconds
    // (time constant DECODE_TAU, 1 s).
    let mut t = 400;
    let (mut sum, mut tokens) = (104.3, 10_210.0);
    while t < 3400 {
        t += 200;
        (sum, tokens) = (sum + 5.0, tokens + 100.0);
        scrape(&mut p, sum, tokens, at(t));
    }
    let now = recent_tpot(&mut p, at(t)).unwrap();
    assert!((now - 50.0).abs() < 2.0, "{now}");
    // A restarted server's histogram starts over: a new window, not a negative one.
    scrape(&mut p, 1.0, 50.0, at(t + 200));
    scrape(&mut p, 1.6, 80.0, at(t + 400));
    assert_eq!(recent_tpot(&mut p, at(t + 400)), Some(now), "30 tokens: nothing yet");
    scrape(&mut p, 2.0, 100.0, at(t + 600));
    let restarted = recent_tpot(&mut p, at(t + 600)).unwrap();
    assert!(restarted < now && restarted > 20.0, "{restarted}");
    // Once the histogram has been quiet for a while, reports move it again.
    p.observed_tpot("a:1", 30.0, at(t + 600) + DECODE_FRESH);
    let reported = recent_tpot(&mut p, at(t + 600) + DECODE_FRESH).unwrap();
    assert!((reported - (0.8 * restarted + 0.2 * 30.0)).abs() < 1e-9, "{reported}");
}

#[test]
fn unreported_requests_expire() {
    let ttl = Duration::from_secs(10);
    let mut p = pool().with_expiry(Expiry { ttl, ..Expiry::default() });
    let now = Instant::now();
    p.dispatch(&dispatch("r1", "a:1", 1, None), now);
    assert_eq!(p.expire(now + Duration::from_secs(5)), 0);
    assert_eq!(p.expire(now + Duration::from_secs(11)), 1);
}

#[test]
fn a_request_is_forgotten_at_a_multiple_of_its_predicted_time_and_a_late_report_still_counts() {
    let expiry = Expiry { ttl: Duration::from_secs(600), multiple: 4.0, floor: Duration::from_secs(5) };
    let mut p = pool().with_expiry(expiry);
    let now = Instant::now();
    // 100 ms to the first token, 10 tokens at 200 ms: 2.1 s predicted, 8.4 s at most.
    p.predicted_then_dispatched(&dispatch("short", "a:1", 1, None), (Some(100.0), Some(200.0)), now);
    // No TPOT predicted: the end is not known, the TTL holds.
    p.predicted_then_dispatched(&dispatch("unknown", "a:1", 1, None), (Some(100.0), None), now);
    // A tiny prediction is held to the floor.
    p.predicted_then_dispatched(&dispatch("tiny", "b:2", 1, None), (Some(100.0), Some(1.0)), now);
    assert_eq!(p.expire(now + Duration::from_secs(4)), 0, "the floor");
    assert_eq!(p.expire(now + Duration::from_secs(6)), 1, "tiny, past the floor");
    assert_eq!(p.in_flight_by_endpoint(), [2, 0]);
    assert_eq!(p.expire(now + Duration::from_millis(8_500)), 1, "short, past 4x its 2.1 s");
    assert_eq!(p.in_flight_by_endpoint(), [1, 0], "the one without a predicted end stays");
    // Its report comes after all: it still names where it ran, so it teaches, counted late.
    let late = p.finish("short", now + Duration::from_secs(9));
    assert!(matches!(&late, Finished::Late(a, Some(_)) if a == "a:1"), "{late:?}");
    assert_eq!(p.finish("short", now + Duration::from_secs(9)), Finished::Unknown, "once");
    assert_eq!(p.expire(now + Duration::from_secs(601)), 1);
    // Overdue ids are forgotten after the TTL too.
    p.expire(now + Duration::from_secs(607));
    assert_eq!(p.finish("tiny", now + Duration::from_secs(607)), Finished::Unknown);
}

#[test]
fn a_lifetime_is_never_unbounded_or_negative() {
    let expiry = Expiry::default();
    for (ttft, tpot) in [(f64::NAN, 1.0), (-1.0, 1.0), (f64::INFINITY, 1.0), (1e300, 1e300)] {
        let t = expiry.lifetime((Some(ttft), Some(tpot)), Some(10));
        assert!(t == expiry.ttl || t == expiry.floor, "{ttft} {tpot}: {t:?}");
    }
    assert_eq!(expiry.lifetime((Some(100.0), Some(1e300)), None), expiry.ttl, "no max_tokens: the output is unbounded");
}
