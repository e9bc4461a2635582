//! The service's routes read the clock the predictor is built with, not the runtime's
//! (the decisions themselves are tested on a manual clock in predictor-core's
//! `tests/clock.rs`).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use headroom_predictor::config::Config;
use headroom_predictor::state::AppState;
use headroom_predictor_core::clock::{Clock, ManualClock};
use headroom_predictor_core::engine_metrics::parse_engine_metrics;

/// Engine metrics of a server far behind: a request with a minute's SLO has room there,
/// but the queue ahead of it is past any horizon, so it waits.
const SWAMPED: &str = "vllm:num_requests_running 256\nvllm:num_requests_waiting 400\nvllm:kv_cache_usage_perc 0.99\n";

/// The routes read the service's clock too: `/v1/predict` on metrics scraped a second
/// ago by the wall but a minute ago by the service answers "unknown".
#[tokio::test]
async fn the_predict_route_judges_freshness_on_the_services_clock() {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let config =
        Config::parse("stale_after_ms = 5000\n[[pool]]\nname = \"default\"\nendpoints = [\"10.0.0.1:8000\"]\n")
            .unwrap();
    let clock = Arc::new(ManualClock::new());
    let state = Arc::new(AppState::with_clock(config, clock.clone()).unwrap());
    let metrics = parse_engine_metrics(SWAMPED).unwrap();
    state.core.pools.with("default", |p| p.endpoints[0].scraped(metrics, clock.now()));
    let predict = async || -> serde_json::Value {
        let body = serde_json::json!({"pool": "default", "request_id": "r1",
            "request": {"model": "m", "input_tokens": 100, "streaming": true, "slo": {"ttft_ms": 200.0}}});
        let req = axum::http::Request::post("/v1/predict")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let res = headroom_predictor::routes::router(state.clone()).oneshot(req).await.unwrap();
        serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes()).unwrap()
    };
    assert!(predict().await["endpoints"][0]["ttft_ms"].is_number(), "fresh by the service's clock");
    clock.advance(Duration::from_secs(60));
    assert!(predict().await["endpoints"][0]["ttft_ms"].is_null(), "stale by the service's clock");
}
