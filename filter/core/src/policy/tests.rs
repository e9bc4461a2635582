//! Table-driven tests of every policy rule, including each known flaw of the
//! reference system shown not to happen here.

use super::*;
use headroom_protocol::{EndpointState, Slo};

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// An endpoint that is busy (not idle, not cold) with the given predictions.
fn ep(ttft: Option<f64>, tpot: Option<f64>) -> EndpointPrediction {
    EndpointPrediction {
        address: String::new(),
        ttft_ms: ttft,
        tpot_ms: tpot,
        state: EndpointState { running: 4, in_flight: 4, kv_usage: 0.5, ..Default::default() },
    }
}

fn idle(mut e: EndpointPrediction) -> EndpointPrediction {
    e.state = EndpointState::default();
    e.state.kv_usage = 0.3;
    e
}

fn with_prefix(mut e: EndpointPrediction, prefix: f64) -> EndpointPrediction {
    e.state.prefix_match = prefix;
    e
}

fn req(ttft: Option<f64>, tpot: Option<f64>, streaming: bool, priority: i32) -> RequestFeatures {
    RequestFeatures { slo: Slo { ttft_ms: ttft, tpot_ms: tpot }, streaming, priority, ..Default::default() }
}

fn cfg() -> FilterConfig {
    FilterConfig { negative_tier_epsilon: 0.0, prefix_explore_epsilon: 0.0, ..FilterConfig::default() }
}

/// Flow control's answer for a request released after `waited_ms`, cleared for `cleared`.
fn after(waited_ms: f64, cleared: &[&str]) -> FlowAnswer {
    let cleared = cleared.iter().map(|a| a.to_string()).collect();
    FlowAnswer { outcome: headroom_protocol::FlowOutcome::Released, waited_ms, cleared }
}

fn primary(d: &Decision) -> Option<(usize, RouteSource)> {
    match d {
        Decision::Route { ranked, source } => ranked.first().map(|&i| (i, *source)),
        _ => None,
    }
}

/// Share of `draws` decisions that went to each endpoint.
fn shares(
    request: &RequestFeatures,
    endpoints: &[EndpointPrediction],
    config: &FilterConfig,
    draws: usize,
) -> Vec<f64> {
    let mut rng = Rng::new(42);
    let mut counts = vec![0usize; endpoints.len()];
    for _ in 0..draws {
        if let Some((i, _)) = primary(&decide(request, endpoints, true, None, config, &mut rng)) {
            counts[i] += 1;
        }
    }
    counts.iter().map(|c| *c as f64 / draws as f64).collect()
}

/// One routing case: endpoints, request, and where it must (or must not) go.
struct Case {
    name: &'static str,
    endpoints: Vec<EndpointPrediction>,
    request: RequestFeatures,
    expect: Expect,
}

enum Expect {
    Only(usize, RouteSource),
    Never(usize),
    Shed,
    NoPrediction,
}

#[test]
fn routing_rules() {
    let cases = vec![
        Case {
            name: "positive tier only: an endpoint missing the TTFT SLO is never picked",
            endpoints: vec![ep(Some(500.0), Some(10.0)), ep(Some(100.0), Some(10.0))],
            request: req(Some(200.0), None, true, 0),
            expect: Expect::Only(1, RouteSource::PredictedPositive),
        },
        Case {
            name: "TPOT judged for streaming requests with a TPOT SLO",
            endpoints: vec![ep(Some(100.0), Some(50.0)), ep(Some(150.0), Some(10.0))],
            request: req(Some(200.0), Some(20.0), true, 0),
            expect: Expect::Only(1, RouteSource::PredictedPositive),
        },
        Case {
            name: "non-streaming requests are not judged on TPOT",
            endpoints: vec![ep(Some(100.0), Some(50.0)), ep(Some(900.0), Some(10.0))],
            request: req(Some(200.0), Some(20.0), false, 0),
            expect: Expect::Only(0, RouteSource::PredictedPositive),
        },
        Case {
            name: "reference flaw: a TTFT-only streaming request is never failed on TPOT (nor shed)",
            endpoints: vec![ep(Some(100.0), Some(500.0)), ep(Some(120.0), Some(900.0))],
            request: req(Some(200.0), None, true, -1),
            expect: Expect::Never(usize::MAX),
        },
        Case {
            name: "unpredicted endpoints join the negative tier",
            endpoints: vec![ep(None, None), ep(Some(100.0), Some(10.0))],
            request: req(Some(200.0), None, true, 0),
            expect: Expect::Only(1, RouteSource::PredictedPositive),
        },
        Case {
            name: "an endpoint without a prediction (stale metrics) is not taken for idle when all are short",
            endpoints: vec![idle(ep(None, None)), ep(Some(500.0), Some(10.0)), ep(Some(400.0), Some(10.0))],
            request: req(Some(100.0), None, true, 0),
            expect: Expect::Never(0),
        },
        Case {
            name: "sheddable and nothing can serve: shed",
            endpoints: vec![ep(Some(500.0), Some(10.0)), ep(Some(400.0), Some(10.0))],
            request: req(Some(100.0), None, true, -1),
            expect: Expect::Shed,
        },
        Case {
            name: "the same request, not sheddable: served from the negative tier",
            endpoints: vec![ep(Some(500.0), Some(10.0)), ep(Some(400.0), Some(10.0))],
            request: req(Some(100.0), None, true, 0),
            expect: Expect::Never(usize::MAX),
        },
        Case {
            name: "sheddable but an endpoint is idle: sent there, not shed",
            endpoints: vec![ep(Some(500.0), Some(10.0)), idle(ep(Some(400.0), Some(10.0)))],
            request: req(Some(100.0), None, true, -1),
            expect: Expect::Only(1, RouteSource::PredictedNegative),
        },
        Case {
            name: "sheddable but an endpoint is cold (KV < 2%): not shed",
            endpoints: vec![ep(Some(500.0), Some(10.0)), {
                let mut e = ep(Some(400.0), Some(10.0));
                e.state.kv_usage = 0.01;
                e
            }],
            request: req(Some(100.0), None, true, -1),
            expect: Expect::Never(usize::MAX),
        },
        Case {
            name: "no predictions at all: fail open, never shed",
            endpoints: vec![ep(None, None), ep(None, None)],
            request: req(Some(100.0), None, true, -1),
            expect: Expect::NoPrediction,
        },
        Case {
            name: "some predictions missing: never shed for it",
            endpoints: vec![ep(Some(500.0), Some(10.0)), ep(None, None)],
            request: req(Some(100.0), None, true, -1),
            expect: Expect::Never(usize::MAX),
        },
        Case {
            name: "all short: only-TPOT-short beats only-TTFT-short",
            endpoints: vec![ep(Some(300.0), Some(10.0)), ep(Some(100.0), Some(90.0))],
            request: req(Some(200.0), Some(50.0), true, 0),
            expect: Expect::Only(1, RouteSource::PredictedNegative),
        },
        Case {
            name: "all short: only-TTFT-short beats both-short",
            endpoints: vec![ep(Some(300.0), Some(90.0)), ep(Some(300.0), Some(10.0))],
            request: req(Some(200.0), Some(50.0), true, 0),
            expect: Expect::Only(1, RouteSource::PredictedNegative),
        },
        Case {
            name: "prefix affinity: a cached endpoint within the tier wins",
            endpoints: vec![ep(Some(150.0), Some(10.0)), with_prefix(ep(Some(120.0), Some(10.0)), 1.0)],
            request: req(Some(1000.0), None, true, 0),
            expect: Expect::Only(1, RouteSource::PredictedPositive),
        },
        Case {
            name: "prefix affinity never moves a request to an endpoint that misses its SLO",
            endpoints: vec![ep(Some(150.0), Some(10.0)), with_prefix(ep(Some(400.0), Some(10.0)), 1.0)],
            request: req(Some(200.0), None, true, 0),
            expect: Expect::Only(0, RouteSource::PredictedPositive),
        },
    ];
    for case in cases {
        let mut rng = Rng::new(11);
        for _ in 0..300 {
            let d = decide(&case.request, &case.endpoints, true, None, &cfg(), &mut rng);
            match case.expect {
                Expect::Only(i, source) => assert_eq!(primary(&d), Some((i, source)), "{}", case.name),
                Expect::Never(i) => {
                    assert!(matches!(d, Decision::Route { .. }), "{}: {d:?}", case.name);
                    assert_ne!(primary(&d).map(|p| p.0), Some(i), "{}", case.name);
                }
                Expect::Shed => assert_eq!(d, Decision::Shed, "{}", case.name),
                Expect::NoPrediction => assert_eq!(d, Decision::NoPrediction, "{}", case.name),
            }
        }
    }
}

#[test]
fn reference_flaw_missing_tpot_slo_never_switches_protection_off() {
    // A running request without a TPOT SLO shows as none (or, in the reference, 0):
    // the new request must still be protected by its own SLO, and a real running
    // SLO must still tighten it.
    for running in [None, Some(0.0)] {
        let mut e = ep(Some(10.0), Some(40.0));
        e.state.tightest_tpot_slo_ms = running;
        let h = headroom(&req(None, Some(30.0), true, 0), &e, SloBuffers::default()).unwrap_or_else(|| unreachable!());
        assert_eq!(h.tpot, Some(-10.0), "running {running:?}");
    }
    let mut e = ep(Some(10.0), Some(20.0));
    e.state.tightest_tpot_slo_ms = Some(15.0);
    assert_eq!(headroom(&req(None, Some(50.0), true, 0), &e, SloBuffers::default()).map(|h| h.tpot), Some(Some(-5.0)));
    assert_eq!(
        headroom(&req(None, Some(50.0), true, 0), &e, SloBuffers { ttft: 1.0, tpot: 2.0 }).map(|h| h.tpot),
        Some(Some(10.0)),
        "buffer"
    );
}

#[test]
fn a_request_that_would_only_slow_its_neighbours_goes_where_that_harm_is_done_already() {
    // A batch request (TPOT SLO 150 ms) where interactive requests (40 ms) decode everywhere:
    // its own SLOs are met on both, its neighbours' on neither.
    let batch = req(Some(4000.0), Some(150.0), true, 0);
    let with_tight = |tpot: f64| {
        let mut e = ep(Some(100.0), Some(tpot));
        e.state.tightest_tpot_slo_ms = Some(40.0);
        e
    };
    let eps = [with_tight(45.0), with_tight(120.0)];
    let s = shares(&batch, &eps, &cfg(), 4000);
    assert!(s[1] > 0.95, "the busier endpoint, where the tight requests miss already: {s:?}");
    let mut rng = Rng::new(3);
    assert!(matches!(
        decide(&batch, &eps, true, None, &cfg(), &mut rng),
        Decision::Route { source: RouteSource::PredictedNegative, .. }
    ));
    // Released from the flow queue after 2 s, 600 ms of its TTFT SLO left (the filter took
    // the wait off it): in time only among the tight decodes, 500 ms late where none run.
    // It goes late, by less than it waited, and never late without having waited.
    let released = req(Some(600.0), Some(150.0), true, 0);
    let mut among_tight = with_tight(45.0);
    among_tight.state.tighter_tpot_in_flight = 20;
    let mut apart = with_tight(120.0);
    apart.ttft_ms = Some(1100.0);
    let eps = [among_tight, apart];
    let pick = |waited| primary(&decide(&released, &eps, true, Some(&after(waited, &[])), &cfg(), &mut Rng::new(5)));
    assert_eq!(pick(2000.0), Some((1, RouteSource::PredictedNegative)));
    assert_eq!(pick(400.0), Some((0, RouteSource::PredictedNegative)), "late by more than it waited");
    assert_eq!(pick(0.0), Some((0, RouteSource::PredictedNegative)));
    // Where it would miss its own TPOT SLO too, nothing is packed: the usual weighted pick
    // by deficit, which favours the faster endpoint.
    let slow = [with_tight(160.0), with_tight(300.0)];
    let s = shares(&batch, &slow, &cfg(), 4000);
    assert!(s[0] > 0.2, "not packed: {s:?}");
}

#[test]
fn nothing_in_time_anywhere_goes_mostly_where_the_deficit_is_smallest() {
    // An overloaded fleet: every endpoint meets the interactive request's TTFT SLO and misses
    // its TPOT SLO, by 5, 10 and 30 ms. The TTFT figure, no deficit anywhere, says nothing and
    // must not flatten the ranking (with it blended in at the default 0.8, the worst endpoint
    // got 0.8 of the best one's weight).
    let interactive = req(Some(400.0), Some(40.0), true, 0);
    let eps = [ep(Some(100.0), Some(45.0)), ep(Some(120.0), Some(50.0)), ep(Some(80.0), Some(70.0))];
    let s = shares(&interactive, &eps, &cfg(), 4000);
    assert!(s[0] > s[1] && s[2] < 0.02, "the smallest deficit first, the largest almost never: {s:?}");
}

#[test]
fn nothing_in_time_anywhere_stays_where_moving_adds_more_work_than_it_gains() {
    // An overloaded fleet: a 1,100-token turn misses its 1.5 s TTFT everywhere. The endpoint
    // caching 95% of it is predicted 1.2 s later than the other, which would prefill those
    // 1,045 tokens again at 1.5 ms each: 1.6 s of its time. Moving gains less than it adds:
    // the turn stays. Without this rule the turn went to the smaller deficit, and on the
    // engine-bound simulated fleet such moves at a burst of sessions took multi-turn from
    // 99% to 85% of SLOs (docs/real-engine.md).
    let mut turn = req(Some(1500.0), None, true, 0);
    turn.input_tokens = 1100;
    let costing = |mut e: EndpointPrediction, ms: f64| {
        e.state.prefill_ms_per_token = Some(ms);
        e
    };
    let slow = |ttft: f64, prefix: f64| with_prefix(costing(ep(Some(ttft), Some(30.0)), 1.5), prefix);
    assert_eq!(shares(&turn, &[slow(1700.0, 0.0), slow(2900.0, 0.95)], &cfg(), 2000)[1], 1.0, "stays, 1.2 s later");
    // The same prompt on a fast engine behind a queue: the refill costs 0.03 ms a token,
    // about 31 ms, and moving is 300 ms sooner: it moves.
    let fast = |ttft: f64, prefix: f64| with_prefix(costing(ep(Some(ttft), Some(30.0)), 0.03), prefix);
    assert!(shares(&turn, &[fast(1700.0, 0.0), fast(2000.0, 0.95)], &cfg(), 2000)[0] > 0.9, "cheap refill: moves");
    // Past the gate (5 s) it moves whatever the refill costs; with no cost known, as before.
    assert!(shares(&turn, &[slow(1700.0, 0.0), slow(7900.0, 0.95)], &cfg(), 2000)[0] > 0.9, "past the gate");
    let unknown = [ep(Some(1700.0), Some(30.0)), with_prefix(ep(Some(2900.0), Some(30.0)), 0.95)];
    assert!(shares(&turn, &unknown, &cfg(), 2000)[0] > 0.9, "no cost known: the smaller deficit");
}

#[test]
fn a_figure_every_candidate_shares_does_not_flatten_the_strategy() {
    // Only a TPOT SLO: the positive tier differs in TPOT headroom alone (30, 20 and 5 ms), and
    // `least` packs onto the smallest. With the absent TTFT headroom blended in at the default
    // 0.8 its weights were 0.8-1.0, close to a uniform pick.
    let r = req(None, Some(40.0), true, 0);
    let eps = [ep(Some(100.0), Some(10.0)), ep(Some(100.0), Some(20.0)), ep(Some(100.0), Some(35.0))];
    let least = shares(&r, &eps, &FilterConfig { strategy: Strategy::Least, ..cfg() }, 4000);
    assert!(least[2] > 0.6 && least[0] < 0.02, "least favours the smallest headroom: {least:?}");
}

#[test]
fn least_bin_packs_and_most_spreads() {
    let eps = [ep(Some(190.0), Some(10.0)), ep(Some(100.0), Some(10.0)), ep(Some(20.0), Some(10.0))];
    let r = req(Some(200.0), None, true, 0);
    let least = shares(&r, &eps, &FilterConfig { strategy: Strategy::Least, ..cfg() }, 4000);
    assert!(least[0] > least[1] && least[1] > least[2], "least favours the smallest headroom: {least:?}");
    let most = shares(&r, &eps, &FilterConfig { strategy: Strategy::Most, ..cfg() }, 4000);
    assert!(most[2] > most[1] && most[1] > most[0], "most favours the largest headroom: {most:?}");
}

#[test]
fn prefix_gate_ignores_affinity_that_costs_too_much() {
    let r = req(Some(10_000.0), None, true, 0);
    let within = [ep(Some(100.0), Some(10.0)), with_prefix(ep(Some(4000.0), Some(10.0)), 1.0)];
    assert_eq!(shares(&r, &within, &cfg(), 2000)[0], 0.0, "3.9 s slower is within the 5 s gate: affinity holds");
    let beyond = [ep(Some(100.0), Some(10.0)), with_prefix(ep(Some(7000.0), Some(10.0)), 1.0)];
    let s = shares(&r, &beyond, &cfg(), 2000);
    assert!(s[0] > 0.05, "6.9 s slower exceeds the gate: both stay candidates: {s:?}");
    let loose = [ep(Some(100.0), Some(10.0)), with_prefix(ep(Some(120.0), Some(10.0)), 0.85)];
    assert_eq!(shares(&r, &loose, &cfg(), 500)[1], 1.0, "loose threshold 0.80 applies");
    let explore = FilterConfig { prefix_explore_epsilon: 0.2, ..cfg() };
    let s = shares(&r, &loose, &explore, 10_000);
    assert!(s[0] > 0.02 && s[0] < 0.2, "affinity skipped on exploration only: {s:?}");
}

#[test]
fn without_slo_routing_the_default_profile_places_the_request() {
    let mut eps = vec![ep(Some(300.0), Some(10.0)), ep(Some(100.0), Some(10.0))];
    let mut rng = Rng::new(3);
    for slo_routing in [false, true] {
        let r = if slo_routing { req(None, None, true, 0) } else { req(Some(50.0), None, true, 0) };
        let d = decide(&r, &eps, slo_routing, None, &cfg(), &mut rng);
        assert_eq!(primary(&d), Some((1, RouteSource::PredictedPositive)), "lowest latency wins");
    }
    eps[0].state.kv_usage = 0.0;
    eps[0].state.waiting = 0;
    eps[1].state.waiting = 9;
    let composite = FilterConfig { default_profile: DefaultProfile::Composite, ..cfg() };
    let d = decide(&req(Some(50.0), None, true, 0), &eps, false, None, &composite, &mut rng);
    assert_eq!(primary(&d), Some((0, RouteSource::Composite)));
}

#[test]
fn fallback_list_is_ranked_and_distinct() {
    let eps: Vec<EndpointPrediction> = (0..5).map(|i| ep(Some(50.0 + 10.0 * f64::from(i)), Some(10.0))).collect();
    let config = FilterConfig { fallback_endpoints: 2, ..cfg() };
    let mut rng = Rng::new(8);
    for _ in 0..200 {
        let Decision::Route { ranked, .. } =
            decide(&req(Some(1000.0), None, true, 0), &eps, true, None, &config, &mut rng)
        else {
            unreachable!()
        };
        assert_eq!(ranked.len(), 3);
        let mut unique = ranked.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 3, "{ranked:?}");
    }
    let d = decide(&req(Some(1000.0), None, true, 0), &eps, true, None, &cfg(), &mut rng);
    assert!(matches!(d, Decision::Route { ref ranked, .. } if ranked.len() == 3), "two fallbacks by default");
}

#[test]
fn exploration_never_probes_an_endpoint_without_a_prediction() {
    // The only negative endpoint has no prediction (stale metrics): there is nothing to check
    // there, so even an exploration rate of 1 keeps to the predicted endpoint.
    let eps = [idle(ep(None, None)), ep(Some(100.0), Some(10.0))];
    let config = FilterConfig { negative_tier_epsilon: 1.0, ..cfg() };
    let mut rng = Rng::new(9);
    for _ in 0..200 {
        let d = decide(&req(Some(200.0), None, true, 0), &eps, true, None, &config, &mut rng);
        assert_eq!(primary(&d), Some((1, RouteSource::PredictedPositive)));
    }
}

#[test]
fn exploration_rate_matches_epsilon() {
    let eps = [ep(Some(500.0), Some(10.0)), ep(Some(100.0), Some(10.0))];
    let config = FilterConfig { negative_tier_epsilon: 0.1, ..cfg() };
    let mut rng = Rng::new(9);
    let n = 20_000;
    let negative = (0..n)
        .filter(|_| {
            primary(&decide(&req(Some(200.0), None, true, 0), &eps, true, None, &config, &mut rng))
                == Some((0, RouteSource::PredictedNegative))
        })
        .count();
    let rate = negative as f64 / n as f64;
    assert!((rate - 0.1).abs() < 0.01, "exploration rate {rate}");
}

#[test]
fn weighted_pick_follows_weights() {
    let weights = [1.0, 2.0, 3.0, 0.0];
    let mut rng = Rng::new(5);
    let mut counts = [0usize; 4];
    let n = 60_000;
    for _ in 0..n {
        counts[pick_weighted(&weights, &mut rng).unwrap_or(0)] += 1;
    }
    for (i, w) in weights.iter().enumerate() {
        let share = counts[i] as f64 / n as f64;
        assert!((share - w / 6.0).abs() < 0.01, "endpoint {i}: share {share}, weight {w}");
    }
    assert_eq!(pick_weighted(&[], &mut rng), None);
    let uniform: Vec<usize> = (0..3000).filter_map(|_| pick_weighted(&[0.0, 0.0, 0.0], &mut rng)).collect();
    for i in 0..3 {
        assert!(uniform.iter().filter(|x| **x == i).count() > 800);
    }
}

#[test]
fn a_request_flow_control_let_go_goes_among_the_endpoints_it_cleared() {
    // Three endpoints in time; flow control cleared the second and third (their queues within
    // its horizon), not the first, which has the most room: the draw never takes the first.
    let named = |address: &str, ttft: f64| EndpointPrediction { address: address.into(), ..ep(Some(ttft), None) };
    let eps = [named("a", 100.0), named("b", 300.0), named("c", 350.0)];
    let request = req(Some(1000.0), None, true, 0);
    let mut rng = Rng::new(7);
    let mut went = [0usize; 3];
    let cleared = after(0.0, &["b", "c"]);
    for _ in 0..2000 {
        let Decision::Route { ranked, source } = decide(&request, &eps, true, Some(&cleared), &cfg(), &mut rng) else {
            panic!("routed")
        };
        assert_eq!(source, RouteSource::PredictedPositive);
        went[ranked[0]] += 1;
        assert!(ranked.contains(&0), "the endpoint cut stays a fallback: {ranked:?}");
    }
    assert!(went[0] == 0 && went[1] > 0 && went[2] > 0, "{went:?}");
    // Nothing cleared (an older predictor), or only endpoints no longer in the tier (ejected
    // since, or out of time by the filter's judgement): the whole tier, as without it.
    for cleared in [after(0.0, &[]), after(0.0, &["gone"])] {
        let d = (0..200).filter_map(|_| primary(&decide(&request, &eps, true, Some(&cleared), &cfg(), &mut rng)));
        assert!(d.map(|(i, _)| i).any(|i| i == 0), "the first endpoint drawn too");
    }
}
