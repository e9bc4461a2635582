//! Header-only routing, the form an Istio WasmPlugin can run: the Envoy Wasm config
//! without `allow_on_headers_stop_iteration` and the filter with `read_body: false`.
//! The filter must decide on headers, resume, and let the body through untouched.

use std::time::Duration;

use headroom_e2e::{wait_until, Harness, SLO};
use serde_json::json;

#[test]
fn routes_on_headers_without_holding_the_body() {
    let h = Harness::start(json!({"read_body": false})).unwrap_or_else(|e| panic!("stack did not start: {e:#}"));
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
