//! The routing policy through the real Envoy: shedding, header hygiene, a
//! misbehaving predictor, a refused configuration, and the filter's stats.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use headroom_e2e::fake_predictor::{FakePredictor, Misbehaviour, UNKNOWN_ENDPOINT};
use headroom_e2e::{wait_until, Harness, SLO};
use headroom_protocol::RouteSource;
use serde_json::json;

fn harness(plugin: serde_json::Value) -> Harness {
    match Harness::start(plugin) {
        Ok(h) => h,
        Err(e) => panic!("stack did not start: {e:#}"),
    }
}

/// Opens a long request straight to a model server (bypassing the gateway) and
/// keeps it open; dropping the stream makes the server abort it.
fn hold_busy(server: std::net::SocketAddr, prompt_tokens: usize) -> TcpStream {
    let body =
        json!({"model": "sim-llama-8b", "prompt": "b".repeat(prompt_tokens * 4), "max_tokens": 4000}).to_string();
    let mut s = TcpStream::connect(server).unwrap();
    write!(s, "POST /v1/completions HTTP/1.1\r\nhost: {server}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    s
}

#[test]
fn sheddable_request_nobody_can_serve_gets_429_and_others_are_served() {
    let h = harness(json!({}));
    // Every server busy (not idle) and warm (KV above the 2% cold threshold).
    let _busy: Vec<TcpStream> =
        h.stack.state.servers.iter().flat_map(|&s| (0..4).map(move |_| hold_busy(s, 2500))).collect();
    let pools = || h.get(&format!("{}/v1/pools", h.predictor())).map(|r| r.json()).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(10), || {
            pools()["pools"][0]["endpoints"].as_array().is_some_and(|eps| {
                eps.iter().all(|e| e["running"].as_u64() >= Some(1) && e["kv_usage"].as_f64() >= Some(0.02))
            })
        }),
        "servers never looked busy to the predictor: {}",
        pools()
    );
    let impossible = [("x-slo-ttft-ms", "1"), ("x-prediction-based-scheduling", "true")];
    let mut sheddable = impossible.to_vec();
    sheddable.push(("x-request-priority", "-1"));
    let shed = h.completion(5, true, &sheddable).unwrap();
    assert_eq!(shed.status, 429, "{}", shed.body);
    assert_eq!(shed.json()["error"]["field"], "x-request-priority", "{}", shed.body);
    assert_eq!(shed.retry_after.as_deref(), Some("1"));
    assert_eq!(shed.dropped_reason.as_deref(), Some("rejected-saturated"), "every 429 says why, in llm-d's words");
    assert!(shed.served_by.is_none(), "a shed request never reaches a model server");

    let served = h.completion(5, true, &impossible).unwrap();
    assert_eq!(served.status, 200, "a request that may not be shed is served even when it will miss its SLO");
    assert_eq!(served.tier.as_deref(), Some("negative"));
    assert!(wait_until(Duration::from_secs(6), || h.envoy_stat("headroom_shed") >= 1.0));
}

#[test]
fn routing_hints_never_reach_the_model_servers() {
    let h = harness(json!({}));
    let all_hints = [
        ("x-slo-ttft-ms", "800"),
        ("x-slo-tpot-ms", "80"),
        ("x-llm-d-slo-ttft-ms", "700"),
        ("x-llm-d-slo-tpot-ms", "70"),
        ("x-prediction-based-scheduling", "true"),
        ("x-request-priority", "2"),
    ];
    for i in 0..9 {
        assert_eq!(h.completion(3, i % 2 == 0, &all_hints).unwrap().status, 200);
    }
    let leaked: f64 =
        h.stack.state.servers.iter().map(|&s| h.server_metric(s, "sim:requests_with_routing_hints_total")).sum();
    assert_eq!(leaked, 0.0, "routing hints reached a model server");
    // The counter does count: a request sent straight to a server with a hint shows up.
    let server = h.stack.state.servers[0];
    let direct = h
        .http
        .post(format!("http://{server}/v1/completions"))
        .header("x-slo-ttft-ms", "5")
        .body(json!({"model": "sim-llama-8b", "prompt": "x", "max_tokens": 1}).to_string())
        .send()
        .unwrap();
    assert_eq!(direct.status(), 200);
    assert_eq!(h.server_metric(server, "sim:requests_with_routing_hints_total"), 1.0);
}

fn fails_open_with(mode: Misbehaviour, cause_stat: &str) {
    let fake = FakePredictor::start(mode).unwrap();
    // A request that offers to wait in the flow queue (the default) gives its call
    // `flow_max_wait_ms` more: 100 ms keeps the sleeping predictor past that budget too.
    let h = match Harness::start_with(json!({"flow_max_wait_ms": 100}), Some(fake.addr)) {
        Ok(h) => h,
        Err(e) => panic!("stack did not start: {e:#}"),
    };
    for i in 0..10 {
        let r = h.completion(3, i % 2 == 0, &SLO).unwrap();
        assert_eq!(r.status, 200, "request {i} with a {mode:?} predictor: {}", r.body);
        assert!(r.served_by.is_some());
    }
    assert!(fake.predicts.load(std::sync::atomic::Ordering::Relaxed) >= 10, "the filter did call the predictor");
    assert!(
        wait_until(Duration::from_secs(8), || h.envoy_stat(cause_stat) >= 10.0),
        "{cause_stat} did not count 10 fallbacks: {}",
        h.stack.envoy_stats().lines().filter(|l| l.starts_with("headroom_")).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn garbage_from_the_predictor_still_serves_every_request() {
    fails_open_with(Misbehaviour::Garbage, "headroom_fallback_bad_answer");
}

#[test]
fn predictor_sleeping_past_the_timeout_still_serves_every_request() {
    fails_open_with(Misbehaviour::Sleep(Duration::from_millis(400)), "headroom_fallback_timeout");
}

#[test]
fn a_request_served_elsewhere_is_reported_where_it_was_served() {
    // The predictor names an endpoint Envoy's cluster lacks: override_host falls back
    // to round robin, so another server answers. The report must name that server: the
    // predictor completes it from its record only where it was dispatched, so what it
    // predicted for the chosen endpoint is never taken for what the other one did.
    let fake = FakePredictor::start(Misbehaviour::UnknownEndpoint).unwrap();
    let h = Harness::start_with(json!({}), Some(fake.addr)).unwrap_or_else(|e| panic!("stack did not start: {e:#}"));
    for stream in [false, true] {
        let r = h.completion(3, stream, &SLO).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.chosen.as_deref(), Some(UNKNOWN_ENDPOINT), "the filter followed the prediction");
        assert!(r.served_by.as_deref().is_some_and(|s| s != UNKNOWN_ENDPOINT), "served by {:?}", r.served_by);
    }
    let reports = || fake.reports.lock().unwrap().clone();
    assert!(wait_until(Duration::from_secs(8), || reports().len() >= 2), "reports: {:?}", reports());
    for o in reports() {
        assert!(h.stack.state.servers.iter().any(|s| s.to_string() == o.endpoint), "reported endpoint: {o:?}");
        assert_eq!(o.source, RouteSource::PredictedPositive);
    }
    assert!(wait_until(Duration::from_secs(6), || h.envoy_stat("headroom_served_elsewhere") >= 2.0));
}

#[test]
fn a_bad_plugin_configuration_is_refused_naming_the_field() {
    let err = match Harness::start(json!({"predictor_timeout_ms": 0})) {
        Ok(h) => {
            // Envoy may keep running with the filter disabled: it must then have logged the refusal.
            let log = std::fs::read_to_string(h.stack.run_dir.join("envoy.log")).unwrap_or_default();
            drop(h);
            log
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("invalid plugin configuration: field `predictor_timeout_ms`"),
        "the refusal must name the field:\n{err}"
    );
}

#[test]
fn filter_stats_are_in_envoy_prometheus() {
    let h = harness(json!({}));
    for _ in 0..4 {
        assert_eq!(h.completion(2, false, &SLO).unwrap().status, 200);
    }
    assert_eq!(h.completion(2, false, &[("x-slo-ttft-ms", "zero")]).unwrap().status, 400);
    assert!(wait_until(Duration::from_secs(8), || h.envoy_stat("headroom_routed_predicted_positive") >= 4.0));
    assert!(h.envoy_stat("headroom_bad_request") >= 1.0);
    assert!(wait_until(Duration::from_secs(8), || h.envoy_stat("headroom_reports_sent") >= 4.0));
    let stats = h.stack.envoy_stats();
    for name in
        ["headroom_shed", "headroom_fallback_timeout", "headroom_slo_violation_ttft", "headroom_predictor_call_ms"]
    {
        assert!(stats.contains(name), "{name} missing from /stats/prometheus");
    }
}

/// An llm-d client sends its goals and nothing else: the request is routed by them, its
/// features say so on the predictor (so its goal is booked as a claim, and flow control may
/// hold it), and `x-prediction-based-scheduling: false` still opts a request out.
#[test]
fn an_llm_d_clients_slo_headers_alone_route_it_by_its_goals() {
    let h = harness(json!({}));
    let llm_d =
        [("x-llm-d-slo-ttft-ms", "2000"), ("x-llm-d-slo-tpot-ms", "100"), ("x-llm-d-inference-fairness-id", "llm-d")];
    let opted_out = [
        ("x-slo-ttft-ms", "2000"),
        ("x-prediction-based-scheduling", "false"),
        ("x-llm-d-inference-fairness-id", "out"),
    ];
    for _ in 0..3 {
        let r = h.completion(4, true, &llm_d).unwrap();
        assert_eq!((r.status, r.tier.as_deref()), (200, Some("positive")), "{}", r.body);
        assert_eq!(h.completion(4, true, &opted_out).unwrap().status, 200);
    }
    let by_tenant = |tenant: &str| -> Vec<bool> {
        h.observations()
            .iter()
            .filter(|o| o["request"]["tenant"] == tenant)
            .map(|o| o["request"]["prediction_based"].as_bool().unwrap_or(false))
            .collect()
    };
    assert!(wait_until(Duration::from_secs(5), || by_tenant("llm-d").len() == 3 && by_tenant("out").len() == 3));
    assert_eq!(by_tenant("llm-d"), vec![true; 3], "placed by its goals");
    assert_eq!(by_tenant("out"), vec![false; 3], "opted out");
}
