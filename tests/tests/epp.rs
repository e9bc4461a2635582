//! The endpoint-picker mode through the real Envoy: its ext_proc filter in front of
//! headroom-epp, which decides with the filter core. The same traffic through the Wasm
//! filter and through the picker gets the same decisions; a picker that is down is
//! skipped or fails requests as `failure_mode_allow` says.

use std::net::SocketAddr;
use std::time::Duration;

use headroom_e2e::fake_predictor::{FakePredictor, Misbehaviour};
use headroom_e2e::{wait_until, Harness, Reply};
use headroom_stack::{Router, StackOptions};
use serde_json::{json, Value};

fn harness(router: Router, plugin: Value, external_predictor: Option<SocketAddr>) -> Harness {
    harness_with(StackOptions { router, external_predictor, ..Default::default() }, plugin)
}

fn harness_with(opts: StackOptions, plugin: Value) -> Harness {
    let (router, plugin) = (opts.router, plugin.as_object().cloned().unwrap_or_default());
    let opts = StackOptions { plugin, ..opts };
    match Harness::start_opts(opts) {
        Ok(h) => h,
        Err(e) => panic!("{} stack did not start: {e:#}", router.name()),
    }
}

#[test]
fn the_picker_routes_through_envoys_ext_proc_and_learns_from_what_passes() {
    routes_and_learns(json!({}));
}

/// Header-only routing (`read_body: false`): the pick goes with the headers' answer, and the
/// body passes after it, counted.
#[test]
fn the_picker_routes_on_headers_alone_when_told_to() {
    routes_and_learns(json!({"read_body": false}));
}

fn routes_and_learns(plugin: Value) {
    let h = harness(Router::Epp, plugin, None);
    let slo = [("x-slo-ttft-ms", "5000"), ("x-slo-tpot-ms", "200"), ("x-prediction-based-scheduling", "true")];
    let responses = json!({"model": "sim-llama-8b", "input": "hello", "max_output_tokens": 8, "stream": true});
    for i in 0..6 {
        let r = match i {
            5 => h
                .post(
                    "/v1/responses",
                    &[("content-type", "application/json"), slo[0], slo[1], slo[2]],
                    &responses.to_string(),
                )
                .unwrap(),
            _ => h.completion(8, i % 2 == 0, &slo).unwrap(),
        };
        assert_eq!(r.status, 200, "{}", r.body);
        let chosen = r.chosen.clone().unwrap_or_else(|| panic!("no pick on a routed request: {r:?}"));
        assert_eq!(r.served_by.as_deref(), Some(chosen.as_str()), "served where the picker chose");
        assert_eq!(r.tier.as_deref(), Some("positive"), "{r:?}");
    }
    assert_eq!(h.headroom_stat("headroom_routed_predicted_positive"), 6.0, "the picker chose, not a Wasm filter");
    assert_eq!(h.envoy_stat("headroom_routed_predicted_positive"), 0.0);
    // What passed was measured and reported: each request where it ran, its first token timed.
    assert!(
        wait_until(Duration::from_secs(10), || h.observations().len() >= 6),
        "the picker's reports never reached the predictor: {:?}",
        h.observations()
    );
    let servers: Vec<String> = h.stack.state.servers.iter().map(|s| s.to_string()).collect();
    for o in h.observations() {
        assert_eq!(o["status"], 200, "{o}");
        assert!(o["endpoint"].as_str().is_some_and(|e| servers.iter().any(|s| s == e)), "{o}");
        if o["request"]["streaming"] == true {
            assert!(o["ttft_ms"].as_f64().is_some_and(|t| t > 0.0), "first token timed: {o}");
        }
    }
}

/// What one request got, in terms that do not depend on the stack's ports: the pick as a
/// place in the predictor's ranking, and where it was served likewise.
#[derive(Debug, Clone, PartialEq)]
struct Decision {
    status: u16,
    chosen: Option<usize>,
    served: Option<usize>,
    tier: Option<String>,
    dropped_reason: Option<String>,
    error_field: Option<String>,
}

/// The same requests through `router`, with a predictor whose answers are fixed: the second
/// server is the one predicted to meet any SLO, the third the next.
fn decisions(router: Router, epp_full_duplex: bool) -> Vec<Decision> {
    let fake = FakePredictor::start(Misbehaviour::Ranked).unwrap();
    // No exploration: every request goes to the prediction's pick.
    let plugin = json!({"negative_tier_epsilon": 0.0, "fallback_endpoints": 1, "min_tpot_slo_ms": 0.1});
    let opts = StackOptions { router, external_predictor: Some(fake.addr), epp_full_duplex, ..Default::default() };
    let h = harness_with(opts, plugin);
    let servers = &h.stack.state.servers;
    let ranking: Vec<String> = [1, 2, 0].iter().map(|&i| servers[i].to_string()).collect();
    *fake.ranking.lock().unwrap() = ranking.clone();
    let place = |address: &Option<String>| {
        address.as_ref().and_then(|a| ranking.iter().position(|r| a.split(',').next() == Some(r.as_str())))
    };
    let slo = [("x-slo-ttft-ms", "2000"), ("x-slo-tpot-ms", "100"), ("x-prediction-based-scheduling", "true")];
    let chat =
        json!({"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4});
    let json = ("content-type", "application/json");
    let mut replies: Vec<Reply> = Vec::new();
    // Streamed and not, completion and chat.
    replies.push(h.completion(4, true, &slo).unwrap());
    replies.push(h.completion(4, false, &slo).unwrap());
    replies.push(h.post("/v1/chat/completions", &[json, slo[0], slo[1], slo[2]], &chat.to_string()).unwrap());
    // A client naming its own server is not obeyed.
    let own = ("x-gateway-destination-endpoint", servers[0].to_string());
    replies.push(h.completion(4, true, &[slo[0], slo[1], slo[2], (own.0, own.1.as_str())]).unwrap());
    // Sheddable, and no server can keep its TPOT: shed.
    replies.push(h.completion(4, true, &[("x-slo-tpot-ms", "0.5"), ("x-request-priority", "-1"), slo[2]]).unwrap());
    // Not sheddable: served by the least bad.
    replies.push(h.completion(4, true, &[("x-slo-tpot-ms", "0.5"), slo[2]]).unwrap());
    // Bad hints and bad bodies: 400s naming the field.
    replies.push(h.completion(4, true, &[("x-slo-ttft-ms", "soon")]).unwrap());
    replies.push(h.post("/v1/completions", &[json], "{\"model\": 7").unwrap());
    replies.push(h.post("/v1/completions", &[json], "{\"model\": \"sim-llama-8b\", \"prompt\": 7}").unwrap());
    // Not an inference request: passes, unrouted.
    replies.push(h.get(&format!("{}/v1/models", h.gateway())).unwrap());
    // No SLO: the default profile's pick.
    replies.push(h.completion(4, false, &[]).unwrap());
    // The responses API, streamed and not.
    for stream in [true, false] {
        let body = json!({"model": "sim-llama-8b", "instructions": "be brief", "max_output_tokens": 4, "stream": stream,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hello there"}]}]});
        replies.push(h.post("/v1/responses", &[json, slo[0], slo[1], slo[2]], &body.to_string()).unwrap());
    }
    let leaked: f64 = servers.iter().map(|&s| h.server_metric(s, "sim:requests_with_routing_hints_total")).sum();
    assert_eq!(leaked, 0.0, "{}: routing hints reached a model server", router.name());
    replies
        .into_iter()
        .map(|r| Decision {
            status: r.status,
            chosen: place(&r.chosen),
            // Unrouted, where it is served is Envoy's round robin.
            served: place(&r.chosen).and(place(&r.served_by)),
            tier: r.tier.clone(),
            dropped_reason: r.dropped_reason.clone(),
            error_field: r.json()["error"]["field"].as_str().map(str::to_string),
        })
        .collect()
}

#[test]
fn the_picker_decides_as_the_wasm_filter_does_on_the_same_traffic() {
    let wasm = decisions(Router::Headroom, false);
    // The Wasm filter's decisions are what the other suites pin down; a few here, so the
    // comparison is not of two mistakes.
    assert_eq!(wasm[0].chosen, Some(0), "{:?}", wasm[0]);
    assert_eq!(wasm[0].tier.as_deref(), Some("positive"));
    assert_eq!(wasm[3].chosen, Some(0), "a client's own pick is not obeyed: {:?}", wasm[3]);
    assert_eq!((wasm[4].status, wasm[4].dropped_reason.as_deref()), (429, Some("rejected-saturated")));
    assert_eq!((wasm[5].status, wasm[5].tier.as_deref()), (200, Some("negative")));
    assert_eq!((wasm[6].status, wasm[6].error_field.as_deref()), (400, Some("x-slo-ttft-ms")));
    assert_eq!(wasm[7].status, 400);
    assert_eq!((wasm[9].status, wasm[9].chosen), (200, None));
    assert_eq!((wasm[11].status, wasm[11].chosen, wasm[12].chosen), (200, Some(0), Some(0)), "responses: {wasm:?}");
    // The picker with Envoy buffering each request body, and streaming it.
    for full_duplex in [false, true] {
        let epp = decisions(Router::Epp, full_duplex);
        for (i, (w, e)) in wasm.iter().zip(&epp).enumerate() {
            // In the negative tier the pick is random, weighted by how far each server misses
            // (each VM draws its own): the tier and the outcome are what must agree.
            let random = |d: &Decision| Decision { chosen: None, served: None, ..d.clone() };
            let (w, e) = if i == 5 { (random(w), random(e)) } else { (w.clone(), e.clone()) };
            assert_eq!(w, e, "request {i}, full duplex {full_duplex}: the Wasm filter decided {w:?}, the picker {e:?}");
        }
    }
}

#[test]
fn a_picker_that_is_down_is_skipped_or_fails_requests_as_failure_mode_says() {
    for allow in [true, false] {
        let opts = StackOptions { router: Router::Epp, epp_failure_mode_allow: allow, ..Default::default() };
        let mut h = Harness::start_opts(opts).unwrap();
        let slo = [("x-slo-ttft-ms", "5000"), ("x-prediction-based-scheduling", "true")];
        assert_eq!(h.completion(4, true, &slo).unwrap().status, 200);
        h.stack.stop_epp();
        for i in 0..4 {
            let r = h.completion(4, i % 2 == 0, &slo).unwrap();
            if allow {
                assert_eq!(r.status, 200, "skipped: Envoy balances: {}", r.body);
                assert!(r.chosen.is_none() && r.served_by.is_some(), "{r:?}");
            } else {
                assert_eq!(r.status, 500, "failure_mode_allow false: the request fails: {r:?}");
            }
        }
        // Back: it picks again.
        h.stack.start_epp().unwrap();
        let r = h.completion(4, true, &slo).unwrap();
        assert_eq!((r.status, r.tier.as_deref()), (200, Some("positive")), "{r:?}");
    }
}

/// GIE's protocol gives the pick in `envoy.lb` metadata: with the filter's header renamed,
/// Envoy's override_host finds it there alone.
#[test]
fn the_pick_in_envoy_lb_metadata_routes_without_the_header() {
    let h = harness(Router::Epp, json!({"destination_header": "x-headroom-pick"}), None);
    let slo = [("x-slo-ttft-ms", "5000"), ("x-prediction-based-scheduling", "true")];
    let mut served = std::collections::HashSet::new();
    for i in 0..8 {
        let r = h.completion(4, i % 2 == 0, &slo).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.served_by, r.chosen, "served where the metadata said: {r:?}");
        served.extend(r.served_by);
    }
    assert!(!served.is_empty());
}

/// A gateway may restrict a request to some endpoints (`envoy.lb.subset_hint`): the picker
/// keeps to them, and answers 503 when they are none.
#[test]
fn the_picker_keeps_to_the_gateways_subset_hint() {
    let opts = StackOptions { router: Router::Epp, epp_subset_hint: Some(vec![2]), ..Default::default() };
    let h = harness_with(opts, json!({}));
    let only = h.stack.state.servers[2].to_string();
    let slo = [("x-slo-ttft-ms", "5000"), ("x-prediction-based-scheduling", "true")];
    for i in 0..8 {
        let r = h.completion(4, i % 2 == 0, &slo).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.chosen.as_deref(), Some(only.as_str()), "{r:?}");
        assert_eq!(r.served_by.as_deref(), Some(only.as_str()));
    }
    drop(h);
    let opts = StackOptions { router: Router::Epp, epp_subset_hint: Some(Vec::new()), ..Default::default() };
    let h = harness_with(opts, json!({}));
    let r = h.completion(4, true, &slo).unwrap();
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.dropped_reason.as_deref(), Some("rejected-no-endpoints"));
    assert!(r.served_by.is_none());
    assert_eq!(h.headroom_stat("headroom_no_endpoints"), 1.0);
}

/// Moves the last server of the stack's pool into a pool of its own, `big`.
fn split_off_big(config: &mut headroom_predictor_config::Config) {
    let default = &mut config.pools[0];
    let Some(last) = default.endpoints.pop() else { return };
    let mut big = default.clone();
    big.name = "big".into();
    big.endpoints = vec![last.clone()];
    big.hardware.retain(|e, _| *e == last);
    default.hardware.remove(&last);
    config.pools.push(big);
}

/// One gateway fronting two models: each request is predicted and placed in the pool its
/// model maps to (`model_pools`), through the Wasm filter and through the picker alike.
#[test]
fn one_gateway_fronts_two_models_each_in_its_own_pool() {
    for router in [Router::Headroom, Router::Epp] {
        let server_models = vec![String::new(), String::new(), "sim-llama-70b".to_string()];
        let opts = StackOptions { router, predictor_tweak: split_off_big, server_models, ..Default::default() };
        let h = harness_with(opts, json!({"model_pools": {"sim-llama-70b": "big"}}));
        let big = h.stack.state.servers.last().map(|s| s.to_string()).unwrap_or_default();
        let slo = [("x-slo-ttft-ms", "5000"), ("x-prediction-based-scheduling", "true")];
        for i in 0..8 {
            let model = if i % 2 == 0 { "sim-llama-70b" } else { "sim-llama-8b" };
            let body = json!({"model": model, "prompt": "hello there", "max_tokens": 4, "stream": true});
            let headers = [("content-type", "application/json"), slo[0], slo[1]];
            let r = h.post("/v1/completions", &headers, &body.to_string()).unwrap();
            assert_eq!(r.status, 200, "{}: {}", router.name(), r.body);
            let served = r.served_by.clone().unwrap_or_default();
            assert_eq!(
                served == big,
                model == "sim-llama-70b",
                "{}: {model} served by {served} ({r:?})",
                router.name()
            );
            assert_eq!(r.tier.as_deref(), Some("positive"), "{}: predicted in its pool: {r:?}", router.name());
        }
        assert!(
            wait_until(Duration::from_secs(10), || h.observations().len() >= 8),
            "{}: reports never reached the predictor",
            router.name()
        );
        for o in h.observations() {
            let in_big = o["pool"] == "big";
            assert_eq!(in_big, o["endpoint"] == big.as_str(), "{}: reported in its pool: {o}", router.name());
        }
    }
}

/// A request naming an InferenceObjective runs at that objective's priority, over its own
/// claim: what the predictor is told and learns from.
#[test]
fn a_named_objective_sets_the_priority_the_predictor_sees() {
    let h = harness(Router::Epp, json!({"objectives": {"interactive": 3, "batch": -1}}), None);
    let slo = [("x-slo-ttft-ms", "5000"), ("x-prediction-based-scheduling", "true")];
    let cases = [("x-llm-d-inference-objective", "interactive", 3), ("x-gateway-inference-objective", "batch", -1)];
    for (header, objective, _) in cases {
        let r = h.completion(4, true, &[slo[0], slo[1], (header, objective), ("x-request-priority", "0")]).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert!(wait_until(Duration::from_secs(10), || h.observations().len() >= 2), "reports never arrived");
    let priorities: Vec<i64> = h.observations().iter().filter_map(|o| o["request"]["priority"].as_i64()).collect();
    assert_eq!(priorities, cases.map(|(_, _, p)| p), "{:?}", h.observations());
}
