//! The predictor's decisions run on the clock it is built with (`clock.rs`), not the
//! wall's: a manual clock moves a queued request to its deadline and the engine metrics
//! past their freshness in no wall time at all, the way a simulation runs it. No async
//! runtime, no ONNX Runtime: the core as a simulation would drive it.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headroom_predictor_core::admission::{self, Admission};
use headroom_predictor_core::callers::Caller;
use headroom_predictor_core::clock::{Clock, ManualClock};
use headroom_predictor_core::config::Config;
use headroom_predictor_core::flow::queue::Reply;
use headroom_predictor_core::model::native::Native;
use headroom_predictor_core::pool::EngineMetrics;
use headroom_predictor_core::predictor::Predictor;
use headroom_predictor_core::service;
use headroom_protocol::{FlowOutcome, PredictRequest, PredictResponse};

/// Engine metrics of a server far behind: a request with a minute's SLO has room there,
/// but the queue ahead of it is past any horizon, so it waits.
const SWAMPED: EngineMetrics =
    EngineMetrics { running: 256, waiting: 400, kv_usage: 0.99, decode: None, queue_read: true };

/// Where a waiting request's answer lands: read by the test when it looks.
#[derive(Debug, Default, Clone)]
struct Slot(Arc<Mutex<Option<PredictResponse>>>);

impl Slot {
    fn take(&self) -> Option<PredictResponse> {
        self.0.lock().unwrap().take()
    }
}

impl Reply for Slot {
    fn send(self: Box<Self>, answer: PredictResponse) {
        *self.0.lock().unwrap() = Some(answer);
    }
    fn is_closed(&self) -> bool {
        false
    }
}

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
    let state = Arc::new(Predictor::new(config, Arc::new(Native), clock.clone()).unwrap());
    let wall = Instant::now();
    state.pools.with("default", |p| p.endpoints[0].scraped(SWAMPED, clock.now()));

    let arrived = clock.now();
    let answer = service::predict(&state, request(), arrived).unwrap();
    assert!(answer.endpoints[0].ttft_ms.is_some(), "fresh metrics predict: {answer:?}");
    let reply = Slot::default();
    let Admission::Wait(_ticket) = admission::admit(&state, request(), answer, arrived, Box::new(reply.clone())) else {
        panic!("a request with room but a long queue ahead waits");
    };

    // A recheck 3 s in: still waiting, and the metrics (5 s fresh) still count.
    clock.advance(Duration::from_secs(3));
    admission::serve_pool(&state, "default", clock.now());
    assert!(reply.take().is_none(), "released or expired after 3 s of a minute's SLO");
    assert!(service::predict(&state, request(), clock.now()).unwrap().endpoints[0].ttft_ms.is_some());

    // A minute on: past its deadline, so it leaves as expired, having waited the service's
    // minute; the metrics not scraped since are stale by that clock and predict nothing.
    clock.advance(Duration::from_secs(60));
    admission::serve_pool(&state, "default", clock.now());
    let expired: PredictResponse = reply.take().expect("expired at the deadline");
    let flow = expired.flow.clone().unwrap();
    assert_eq!(flow.outcome, FlowOutcome::Expired);
    assert!((59_000.0..=63_000.0).contains(&flow.waited_ms), "waited {} ms of the service's time", flow.waited_ms);
    assert_eq!(expired.endpoints[0].ttft_ms, None, "stale by the service's clock: {expired:?}");
    assert_eq!(state.flows.with("default", |q| q.len()), 0);
    assert!(wall.elapsed() < Duration::from_secs(5), "a minute of the service's time took {:?}", wall.elapsed());
}

/// A scrape the server refused drops its state at once; one that timed out or read garbage
/// only lets it age, so it goes stale on the predictor's clock.
#[test]
fn a_refused_scrape_ends_predictions_at_once_and_a_failed_one_lets_them_age() {
    use headroom_predictor_core::service::{scraped, Scraped};
    let config =
        Config::parse("stale_after_ms = 5000\n[[pool]]\nname = \"default\"\nendpoints = [\"10.0.0.1:8000\"]\n")
            .unwrap();
    let clock = Arc::new(ManualClock::new());
    let state = Predictor::new(config, Arc::new(Native), clock.clone()).unwrap();
    let predicted = || service::predict(&state, request(), clock.now()).unwrap().endpoints[0].ttft_ms.is_some();
    assert_eq!(scraped(&state, "default", "10.0.0.1:8000", Scraped::Metrics(SWAMPED), clock.now()), None);
    assert!(predicted());
    assert_eq!(scraped(&state, "default", "10.0.0.1:8000", Scraped::Failed, clock.now()), Some(1));
    assert!(predicted(), "a timeout says nothing of its load: the metrics stand until stale");
    clock.advance(Duration::from_secs(6));
    assert!(!predicted(), "stale by the predictor's clock");
    assert_eq!(scraped(&state, "default", "10.0.0.1:8000", Scraped::Metrics(SWAMPED), clock.now()), None);
    assert!(predicted());
    assert_eq!(scraped(&state, "default", "10.0.0.1:8000", Scraped::Unreachable, clock.now()), Some(2));
    assert!(!predicted(), "nothing accepted the connection: no state to predict from");
    assert_eq!(scraped(&state, "default", "10.0.0.9:8000", Scraped::Failed, clock.now()), None, "not in the pool");
}

/// A gateway's reports of an endpoint failing fast (a 5xx each, or a retry away from it)
/// eject it: it gets no prediction, however idle its metrics, until its term ends on the
/// predictor's clock; then one more failure ejects it again. With every endpoint ejected,
/// none is.
#[test]
fn reports_of_an_endpoint_failing_eject_it_from_the_predictions_for_a_term() {
    use headroom_protocol::{Dispatch, DispatchBatch, Report, ReportBatch, RouteSource};
    let config = Config::parse(
        "stale_after_ms = 600000\n[[pool]]\nname = \"default\"\nendpoints = [\"10.0.0.1:8000\", \"10.0.0.2:8000\"]\n",
    )
    .unwrap();
    let clock = Arc::new(ManualClock::new());
    let state = Predictor::new(config, Arc::new(Native), clock.clone()).unwrap();
    let idle = EngineMetrics { running: 0, waiting: 0, kv_usage: 0.0, decode: None, queue_read: true };
    state.pools.with("default", |p| p.endpoints.iter_mut().for_each(|e| e.scraped(idle, clock.now())));
    let predicted = |i: usize| service::predict(&state, request(), clock.now()).unwrap().endpoints[i].ttft_ms.is_some();
    let gateway = Caller::new("gateway");
    let batch = |id: &str, endpoint: &str, status: u16, failed_at: Option<&str>| ReportBatch {
        reports: vec![Report {
            pool: "default".into(),
            request_id: id.into(),
            endpoint: endpoint.into(),
            source: RouteSource::PredictedPositive,
            ttft_ms: None,
            tpot_ms: None,
            e2e_ms: 2.0,
            output_tokens: None,
            cached_tokens: None,
            status,
            failed_at: failed_at.map(str::to_string),
        }],
        ..Default::default()
    };
    // Each request dispatched to its first choice by the gateway, then reported.
    let report = |id: &str, endpoint: &str, status: u16, failed_at: Option<&str>| {
        let chosen = failed_at.unwrap_or(endpoint);
        let d = Dispatch {
            pool: "default".into(),
            request_id: id.into(),
            endpoint: chosen.into(),
            request: request().request,
        };
        service::dispatch(&state, &DispatchBatch { dispatches: vec![d] }, &gateway, clock.now());
        batch(id, endpoint, status, failed_at)
    };
    // Failures reported of requests nobody dispatched, or that another caller dispatched, say
    // nothing: a token holder cannot eject endpoints, or end another gateway's requests.
    for i in 0..10 {
        service::report(&state, batch(&format!("invented-{i}"), "10.0.0.1:8000", 500, None), &gateway, clock.now());
    }
    let other = report("other", "10.0.0.1:8000", 500, None);
    let ack = service::report(&state, other, &Caller::new("leaked"), clock.now());
    assert_eq!(ack.rejected, 1, "another caller's request is not ended");
    assert!(predicted(0), "reports of invented requests eject nobody");
    assert_eq!(state.pools.with("default", |p| p.tracked().0), Some(1), "\"other\" is still tracked");
    service::report(&state, batch("other", "10.0.0.1:8000", 200, None), &gateway, clock.now());
    // Two 500s, a 400 (the client's) and a status 0 (maybe the client's): not yet.
    for (id, status) in [("a", 500), ("b", 500), ("c", 400), ("d", 0)] {
        service::report(&state, report(id, "10.0.0.1:8000", status, None), &gateway, clock.now());
    }
    assert!(predicted(0), "two failures in a row do not eject");
    // The third, a retry served elsewhere: ejected; the one that served is not.
    service::report(&state, report("e", "10.0.0.2:8000", 200, Some("10.0.0.1:8000")), &gateway, clock.now());
    assert!(!predicted(0) && predicted(1), "ejected: no prediction, idle as it looks");
    let metrics = state.metrics.render();
    assert!(metrics.contains("headroom_endpoint_ejections_total{pool=\"default\"} 1"), "{metrics}");
    assert!(metrics.contains("headroom_endpoint_failures_total{pool=\"default\"} 3"), "{metrics}");
    clock.advance(Duration::from_secs(5));
    assert!(predicted(0), "its term ends");
    service::report(&state, report("f", "10.0.0.1:8000", 503, None), &gateway, clock.now());
    assert!(!predicted(0), "on probation one failure ejects it again");
    clock.advance(Duration::from_secs(9));
    assert!(!predicted(0), "for twice as long");
    // The other fails too: with every endpoint ejected, none is.
    for id in ["g", "h", "i"] {
        service::report(&state, report(id, "10.0.0.2:8000", 502, None), &gateway, clock.now());
    }
    assert!(predicted(0) && predicted(1), "a pool all ejected is placed by load");
}
