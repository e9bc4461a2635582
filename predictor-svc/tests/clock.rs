//! The predictor's decisions run on the clock it is built with (`clock.rs`), not the
//! runtime's: a manual clock moves a queued request to its deadline and the engine
//! metrics past their freshness in no wall time at all, the way a simulation runs it.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_predictor::clock::{Clock, ManualClock};
use headroom_predictor::config::Config;
use headroom_predictor::flow::admission::{self, Admission};
use headroom_predictor::scrape::parse_engine_metrics;
use headroom_predictor::service;
use headroom_predictor::state::AppState;
use headroom_protocol::{FlowOutcome, PredictRequest, PredictResponse};

/// Engine metrics of a server far behind: a request with a minute's SLO has room there,
/// but the queue ahead of it is past any horizon, so it waits.
const SWAMPED: &str = "vllm:num_requests_running 256\nvllm:num_requests_waiting 400\nvllm:kv_cache_usage_perc 0.99\n";

fn request() -> PredictRequest {
    serde_json::from_value(serde_json::json!({"pool": "default", "request_id": "r1",
        "request": {"model": "m", "input_tokens": 100, "streaming": true, "slo": {"ttft_ms": 60000.0}, "priority": 0},
        "flow": {"max_wait_ms": 120000, "tpot_buffer": 1.0, "dispatch_horizon_ms": 150, "fairness_id": "a"}}))
    .unwrap()
}

#[test]
fn a_queued_request_reaches_its_deadline_on_the_services_clock_not_the_wall() {
    let config = Config::parse(
        "stale_after_ms = 5000\n[flow]\nmax_wait_ms = 120000\n[[pool]]\nname = \"default\"\nendpoints = [\"10.0.0.1:8000\"]\n",
    )
    .unwrap();
    let clock = Arc::new(ManualClock::new());
    let state = Arc::new(AppState::with_clock(config, clock.clone()).unwrap());
    let wall = Instant::now();
    let metrics = parse_engine_metrics(SWAMPED).unwrap();
    state.pools.with("default", |p| p.endpoints[0].scraped(metrics, clock.now()));

    let arrived = clock.now();
    let answer = service::predict(&state, request(), arrived).unwrap();
    assert!(answer.endpoints[0].ttft_ms.is_some(), "fresh metrics predict: {answer:?}");
    let Admission::Wait(mut reply, _ticket) = admission::admit(&state, request(), answer, arrived) else {
        panic!("a request with room but a long queue ahead waits");
    };

    // A recheck 3 s in: still waiting, and the metrics (5 s fresh) still count.
    clock.advance(Duration::from_secs(3));
    admission::serve_pool(&state, "default", clock.now());
    assert!(reply.try_recv().is_err(), "released or expired after 3 s of a minute's SLO");
    assert!(service::predict(&state, request(), clock.now()).unwrap().endpoints[0].ttft_ms.is_some());

    // A minute on: past its deadline, so it leaves as expired, having waited the service's
    // minute; the metrics not scraped since are stale by that clock and predict nothing.
    clock.advance(Duration::from_secs(60));
    admission::serve_pool(&state, "default", clock.now());
    let expired: PredictResponse = reply.try_recv().expect("expired at the deadline");
    let flow = expired.flow.unwrap();
    assert_eq!(flow.outcome, FlowOutcome::Expired);
    assert!((59_000.0..=63_000.0).contains(&flow.waited_ms), "waited {} ms of the service's time", flow.waited_ms);
    assert_eq!(expired.endpoints[0].ttft_ms, None, "stale by the service's clock: {expired:?}");
    assert_eq!(state.flows.with("default", |q| q.len()), 0);
    assert!(wall.elapsed() < Duration::from_secs(5), "a minute of the service's time took {:?}", wall.elapsed());
}

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
    state.pools.with("default", |p| p.endpoints[0].scraped(metrics, clock.now()));
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
