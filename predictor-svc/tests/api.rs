//! The predictor's HTTP API, driven in-process (no sockets): formats, errors, tracking.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use headroom_predictor::{api, config::Config, state::AppState};
use headroom_protocol::{codec, Format, PredictResponse};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

fn state() -> Arc<AppState> {
    let config =
        Config::parse("[[pool]]\nname = \"default\"\nendpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n").unwrap();
    Arc::new(AppState::new(config).unwrap())
}

async fn call(
    state: &Arc<AppState>,
    path: &str,
    content_type: &str,
    accept: &str,
    body: Vec<u8>,
) -> (StatusCode, String, Vec<u8>) {
    let req = Request::post(path)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::ACCEPT, accept)
        .body(Body::from(body))
        .unwrap();
    let res = api::router(state.clone()).oneshot(req).await.unwrap();
    let status = res.status();
    let ct = res.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    (status, ct, res.into_body().collect().await.unwrap().to_bytes().to_vec())
}

fn predict_body() -> Value {
    json!({"pool": "default", "request_id": "r1", "request": {"model": "m", "input_tokens": 100, "streaming": true,
           "slo": {"ttft_ms": 200.0}}})
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

#[tokio::test]
async fn predict_speaks_msgpack_and_json() {
    let s = state();
    let msgpack = codec::encode(Format::MsgPack, &predict_body()).unwrap();
    let (status, ct, body) = call(&s, "/v1/predict", codec::MSGPACK, codec::MSGPACK, msgpack).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ct, codec::MSGPACK);
    let answer: PredictResponse = codec::decode(Format::MsgPack, &body).unwrap();
    assert_eq!(answer.endpoints.len(), 2);
    // Never scraped: the predictor says it does not know rather than guessing.
    assert!(answer.endpoints.iter().all(|e| e.ttft_ms.is_none() && e.tpot_ms.is_none()));

    let (status, ct, body) = call(&s, "/v1/predict", codec::JSON, "", predict_body().to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ct, codec::JSON, "answers in the request's format when accept names none");
    assert_eq!(json_of(&body)["model_version"], "analytic-prior");
}

#[tokio::test]
async fn errors_are_json_and_name_the_field() {
    let s = state();
    let cases = [
        ("text/plain", predict_body().to_string(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "content-type"),
        (codec::JSON, "{".to_string(), StatusCode::BAD_REQUEST, "body"),
        (codec::JSON, json!({"pool": "default"}).to_string(), StatusCode::BAD_REQUEST, "request_id"),
        (
            codec::JSON,
            json!({"pool": "default", "request_id": "r", "request": {"model": "m", "input_tokens": -1}}).to_string(),
            StatusCode::BAD_REQUEST,
            "request.input_tokens",
        ),
        (
            codec::JSON,
            json!({"pool": "default", "request_id": "r", "request": {"model": "m", "input_tokens": 1, "slo": {"tpot_ms": 0}}})
                .to_string(),
            StatusCode::BAD_REQUEST,
            "request.slo.tpot_ms",
        ),
        (
            codec::JSON,
            json!({"pool": "elsewhere", "request_id": "r", "request": {"model": "m", "input_tokens": 1}}).to_string(),
            StatusCode::NOT_FOUND,
            "pool",
        ),
    ];
    for (ct, body, want_status, want_field) in cases {
        let (status, rct, out) = call(&s, "/v1/predict", ct, codec::MSGPACK, body.into_bytes()).await;
        assert_eq!(status, want_status, "{want_field}");
        assert_eq!(rct, codec::JSON, "errors are JSON even to a MessagePack client");
        assert_eq!(json_of(&out)["error"]["field"], want_field);
    }
    let (status, _, _) = call(&s, "/v1/predict", codec::MSGPACK, "", vec![0xc1, 0xff]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn dispatch_and_report_track_in_flight() {
    let s = state();
    let request = json!({"model": "m", "input_tokens": 100, "streaming": true, "slo": {"tpot_ms": 30.0}});
    let dispatch = json!({"dispatches": [
        {"pool": "default", "request_id": "a", "endpoint": "127.0.0.1:1", "request": request},
        {"pool": "default", "request_id": "b", "endpoint": "127.0.0.1:9", "request": request},
        {"pool": "nowhere", "request_id": "c", "endpoint": "127.0.0.1:1", "request": request},
    ]});
    let (status, _, body) = call(&s, "/v1/dispatch", codec::JSON, codec::JSON, dispatch.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body), json!({"accepted": 1, "rejected": 2}));
    assert_eq!(s.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")), Some(1));

    let (_, _, body) = call(&s, "/v1/predict", codec::JSON, codec::JSON, predict_body().to_string().into_bytes()).await;
    let answer = json_of(&body);
    assert_eq!(answer["endpoints"][0]["state"]["in_flight"], 1);
    assert_eq!(answer["endpoints"][0]["state"]["tightest_tpot_slo_ms"], 30.0);

    let report = json!({"observations": [{"pool": "default", "request_id": "a", "endpoint": "127.0.0.1:1",
        "request": request, "source": "predicted_positive", "ttft_ms": 50.0, "tpot_ms": 8.0, "e2e_ms": 400.0,
        "output_tokens": 40, "status": 200}]});
    let (status, _, body) = call(&s, "/v1/report", codec::JSON, codec::JSON, report.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body), json!({"accepted": 1, "rejected": 0}));
    assert_eq!(s.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")), Some(0));

    // A dispatch arriving after its report (batches can cross) is not tracked again.
    let late =
        json!({"dispatches": [{"pool": "default", "request_id": "a", "endpoint": "127.0.0.1:1", "request": request}]});
    let (_, _, body) = call(&s, "/v1/dispatch", codec::JSON, codec::JSON, late.to_string().into_bytes()).await;
    assert_eq!(json_of(&body)["rejected"], 1);
    assert_eq!(s.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")), Some(0));
}

#[tokio::test]
async fn a_refused_dispatch_batch_applies_nothing() {
    let s = state();
    let good = json!({"model": "m", "input_tokens": 10, "streaming": true});
    let bad = json!({"model": "m", "input_tokens": 10, "slo": {"ttft_ms": -1.0}});
    let batch = json!({"dispatches": [
        {"pool": "default", "request_id": "ok", "endpoint": "127.0.0.1:1", "request": good},
        {"pool": "default", "request_id": "bad", "endpoint": "127.0.0.1:1", "request": bad},
    ]});
    let (status, _, body) = call(&s, "/v1/dispatch", codec::JSON, codec::JSON, batch.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json_of(&body)["error"]["field"], "dispatches[1].request.slo.ttft_ms");
    assert_eq!(
        s.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")),
        Some(0),
        "the valid item was not applied either"
    );
}

#[tokio::test]
async fn the_service_prior_uses_the_configured_hardware_scales() {
    use headroom_protocol::{EndpointState, RequestFeatures};
    let config = Config::parse(
        "[model]\nprior_hardware_scale = {a100 = 2.0}\n[[pool]]\nname = \"default\"\nendpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\nhardware = {\"127.0.0.1:1\" = \"a100\", \"127.0.0.1:2\" = \"h100\"}\n",
    )
    .unwrap();
    let (a100, h100) = (config.hardware_class("a100"), config.hardware_class("h100"));
    let s = AppState::new(config).unwrap();
    let req = RequestFeatures { input_tokens: 1000, ..Default::default() };
    let rows: Vec<_> = [a100, h100]
        .map(|hardware_class| s.models.row(&req, &EndpointState { hardware_class, ..Default::default() }))
        .into();
    let (out, version) = s.models.predict(&rows);
    assert_eq!(version, "analytic-prior");
    assert!((out[0].1 / out[1].1 - 2.0).abs() < 1e-9, "a100 TPOT is twice the h100's: {out:?}");
}
