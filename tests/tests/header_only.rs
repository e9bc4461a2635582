//! Header-only routing, the form an Istio WasmPlugin can run: the Envoy Wasm config
//! without `allow_on_headers_stop_iteration` and the filter with `read_body: false`.
//! The filter must decide on headers, resume, and let the body through untouched.

use std::time::Duration;

use headroom_e2e::{patient, wait_until, Harness, SLO};
use serde_json::json;

#[test]
fn routes_on_headers_without_holding_the_body() {
    let h =
        Harness::start(patient(json!({"read_body": false}))).unwrap_or_else(|e| panic!("stack did not start: {e:#}"));
    let envoy_yaml = std::fs::read_to_string(h.stack.run_dir.join("envoy.yaml")).unwrap();
    assert!(envoy_yaml.contains("allow_on_headers_stop_iteration: false"), "the stack did not drop the flag");

    for stream in [false, true] {
        let r = h.completion(6, stream, &SLO).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body.contains("\"completion_tokens\":6"), "the body did not reach the server intact: {}", r.body);
        assert_eq!(r.served_by, r.chosen, "served where the filter chose");
        assert_eq!(r.tier.as_deref(), Some("positive"), "routed by prediction");
    }
    // The input size came from content-length (about a quarter of the body's bytes).
    let mut sizes = Vec::new();
    assert!(wait_until(Duration::from_secs(5), || {
        sizes = h.observations().iter().filter_map(|o| o["request"]["input_tokens"].as_u64()).collect();
        sizes.len() >= 2
    }));
    assert!(sizes.iter().all(|&t| (200..=400).contains(&t)), "input token estimates: {sizes:?}");
}

/// `content-length` is a client's claim (docs/reliability.md, "Bad inputs tried"): requests
/// claiming 64 MiB that never send a body are placed on their headers, but book nothing on
/// the predictor, so honest requests still find every endpoint with room. Before the claim was
/// held back, each booked 2^24 prompt tokens and the pool had no positive tier left.
#[test]
fn a_claimed_body_that_never_comes_books_nothing() {
    use std::io::Write;
    let h =
        Harness::start(patient(json!({"read_body": false}))).unwrap_or_else(|e| panic!("stack did not start: {e:#}"));
    let mut liars = Vec::new();
    for _ in 0..9 {
        let mut s = std::net::TcpStream::connect(h.stack.state.gateway).unwrap();
        let head = "POST /v1/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
            content-length: 67108864\r\nx-slo-ttft-ms: 2000\r\nx-slo-tpot-ms: 100\r\n\
            x-prediction-based-scheduling: true\r\n\r\n";
        s.write_all(head.as_bytes()).unwrap();
        liars.push(s);
        // Each placement reaches the predictor (20 ms ticks) before the next is decided.
        std::thread::sleep(Duration::from_millis(150));
    }
    for _ in 0..3 {
        let r = h.completion(6, true, &SLO).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.tier.as_deref(), Some("positive"), "the claims emptied the positive tier");
    }
    // Nothing of the liars is in the predictor's books while they hold their connections.
    let endpoints: Vec<String> = h.stack.state.servers.iter().map(|s| s.to_string()).collect();
    assert!(
        wait_until(Duration::from_secs(5), || endpoints.iter().all(|e| h.in_flight(e) == Some(0))),
        "in flight: {:?}",
        endpoints.iter().map(|e| h.in_flight(e)).collect::<Vec<_>>()
    );
    drop(liars);
}
