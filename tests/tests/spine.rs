//! The spine: one request routed end to end through the real Envoy, the built
//! filter, the real predictor and three simulated servers on 127.0.0.1.

use std::time::Duration;

use headroom_e2e::{patient, wait_until, Harness, SLO};
use headroom_filter_core::host::FallbackCause;
use serde_json::{json, Value};

fn harness() -> Harness {
    match Harness::start(json!({})) {
        Ok(h) => h,
        Err(e) => panic!("stack did not start: {e:#}"),
    }
}

fn observation_with_max_tokens(h: &Harness, max_tokens: u64) -> Option<Value> {
    h.observations().into_iter().find(|o| o["request"]["max_tokens"].as_u64() == Some(max_tokens))
}

/// Why the filter fell back so far, by cause (all zero when every call was answered).
fn fallbacks(h: &Harness) -> String {
    FallbackCause::ALL
        .map(|c| format!("{}={}", c.name(), h.envoy_stat(&format!("headroom_fallback_{}", c.name()))))
        .join(" ")
}

#[test]
fn streaming_and_non_streaming_are_routed_measured_and_reported() {
    let h = match Harness::start(patient(json!({}))) {
        Ok(h) => h,
        Err(e) => panic!("stack did not start: {e:#}"),
    };
    let plain = h.completion(7, false, &SLO).unwrap();
    assert_eq!(plain.status, 200, "{}", plain.body);
    assert!(plain.served_by.is_some());
    assert_eq!(
        plain.served_by,
        plain.chosen,
        "the server that answered is the one the filter chose (fallbacks: {})",
        fallbacks(&h)
    );
    assert_eq!(plain.json()["usage"]["completion_tokens"], 7);

    let streamed = h.completion(9, true, &SLO).unwrap();
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert_eq!(streamed.served_by, streamed.chosen, "fallbacks: {}", fallbacks(&h));
    assert!(streamed.content_type.as_deref().unwrap_or("").starts_with("text/event-stream"));
    assert!(streamed.body.contains("\"completion_tokens\":9"), "{}", streamed.body);

    // Observations arrive batched on the filter's tick.
    let mut found = (None, None);
    assert!(
        wait_until(Duration::from_secs(5), || {
            found = (observation_with_max_tokens(&h, 7), observation_with_max_tokens(&h, 9));
            found.0.is_some() && found.1.is_some()
        }),
        "observations never reached the predictor: {:?}",
        h.observations()
    );
    let (plain_obs, stream_obs) = (found.0.unwrap(), found.1.unwrap());
    for (obs, reply) in [(&plain_obs, &plain), (&stream_obs, &streamed)] {
        assert_eq!(obs["status"], 200);
        assert_eq!(obs["endpoint"].as_str(), reply.served_by.as_deref(), "reported endpoint is the one that served");
        assert!(obs["ttft_ms"].as_f64().unwrap_or(0.0) > 0.0, "{obs}");
        assert!(obs["state_at_dispatch"].is_object(), "completed from the predictor's record: {obs}");
        assert_eq!(obs["request"]["slo"]["ttft_ms"], 2000.0);
    }
    assert_eq!(plain_obs["output_tokens"], 7, "tokens come from the usage block");
    assert_eq!(plain_obs["request"]["streaming"], false);
    assert_eq!(stream_obs["output_tokens"], 9);
    assert!(stream_obs["tpot_ms"].as_f64().unwrap_or(0.0) > 0.0, "{stream_obs}");
    assert!(stream_obs["ttft_ms"].as_f64() < stream_obs["e2e_ms"].as_f64());
    // Measured on Envoy's monotonic clock (WASI clock_time_get), which a wall clock set back
    // does not move: every VM (one per worker, and the main thread's) counts itself on it.
    assert!(h.envoy_stat("headroom_monotonic_clock_vms") >= 2.0, "the filter's VMs read the wall clock");

    for reply in [&plain, &streamed] {
        let endpoint = reply.served_by.clone().unwrap_or_default();
        assert!(
            wait_until(Duration::from_secs(5), || h.in_flight(&endpoint) == Some(0)),
            "in-flight count for {endpoint} did not return to 0"
        );
    }
}

#[test]
fn client_cannot_choose_the_endpoint() {
    let h = harness();
    // Each request pins a different server in turn, so the filter's choice and
    // the client's pin must differ on some of them whatever the filter prefers
    // (the same prompt is sticky through prefix affinity): on those, only the
    // filter's choice may serve.
    let servers: Vec<String> = h.stack.state.servers.iter().map(ToString::to_string).collect();
    let mut overridden = 0;
    for i in 0..15 {
        let pinned = &servers[i % servers.len()];
        let mut headers = SLO.to_vec();
        headers.push(("x-gateway-destination-endpoint", pinned.as_str()));
        let r = h.completion(2, false, &headers).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.served_by, r.chosen, "the filter's choice, not the client's pin {pinned}, decides");
        overridden += usize::from(r.served_by.as_deref() != Some(pinned.as_str()));
    }
    assert!(overridden > 0, "the filter chose the client's pinned endpoint every time, so nothing was tested");
}

#[test]
fn predictor_down_still_routes_and_recovers() {
    let mut h = harness();
    assert_eq!(h.completion(3, false, &SLO).unwrap().tier.as_deref(), Some("positive"));

    h.stack.stop_predictor();
    let before = h.envoy_stat("headroom_fallback_unavailable") + h.envoy_stat("headroom_fallback_call_failed");
    for i in 0..8 {
        let r = h.completion(3, i % 2 == 0, &SLO).unwrap();
        assert_eq!(r.status, 200, "request {i} failed with the predictor down: {}", r.body);
        assert!(r.served_by.is_some());
        assert_ne!(r.tier.as_deref(), Some("positive"), "no predictions without a predictor");
    }
    assert!(
        wait_until(Duration::from_secs(8), || {
            h.envoy_stat("headroom_fallback_unavailable") + h.envoy_stat("headroom_fallback_call_failed")
                >= before + 8.0
        }),
        "fallback counter did not rise: {}",
        h.stack.envoy_stats().lines().filter(|l| l.contains("headroom")).collect::<Vec<_>>().join("\n")
    );

    h.stack.start_predictor().unwrap();
    let tiers: Vec<Option<String>> = (0..5).map(|_| h.completion(3, false, &SLO).unwrap().tier).collect();
    assert!(tiers.iter().all(|t| t.as_deref() == Some("positive")), "predictions not used after restart: {tiers:?}");
}

#[test]
fn bad_input_gets_clear_errors_and_other_paths_pass_through() {
    let h = harness();
    for (header, value) in [("x-slo-ttft-ms", "abc"), ("x-slo-ttft-ms", "-5"), ("x-llm-d-slo-tpot-ms", "0")] {
        let r = h.completion(3, false, &[(header, value)]).unwrap();
        assert_eq!(r.status, 400, "{header}: {value}");
        assert_eq!(r.json()["error"]["field"], header, "{}", r.body);
        assert!(r.served_by.is_none(), "a refused request never reaches a model server");
    }
    let r = h.post("/v1/completions", &[("content-type", "application/json")], "this is not json").unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["field"], "body");
    let r =
        h.post("/v1/chat/completions", &[("content-type", "application/json")], r#"{"model":"sim-llama-8b"}"#).unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["field"], "messages");

    let models = h.get(&format!("{}/v1/models", h.gateway())).unwrap();
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], "sim-llama-8b");
    assert!(models.served_by.is_some());
    assert!(models.chosen.is_none(), "non-inference paths are not routed by the filter");

    // The filter kept working after all that.
    assert_eq!(h.completion(2, true, &SLO).unwrap().status, 200);
}
