//! The predictor's HTTP API, driven in-process (no sockets): formats, errors, tracking.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use headroom_predictor::{config::Config, routes, state::AppState};
use headroom_predictor_core::pool::EngineMetrics;
use headroom_protocol::{codec, Format, PredictBatchResponse, PredictResponse};
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
    let res = routes::router(state.clone()).oneshot(req).await.unwrap();
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
async fn a_batch_answers_each_request_as_predict_would() {
    let s = state();
    // Scraped, so both endpoints are predicted; one has a request in flight, so they differ.
    s.core.pools.with("default", |p| {
        for e in &mut p.endpoints {
            e.metrics = Some(EngineMetrics { running: 2, waiting: 1, kv_usage: 0.3, decode: None, queue_read: true });
            e.scraped_at = Some(std::time::Instant::now());
        }
    });
    let dispatch = json!({"dispatches": [{"pool": "default", "request_id": "x", "endpoint": "127.0.0.1:1",
        "request": {"model": "m", "input_tokens": 3000, "streaming": true}}]});
    call(&s, "/v1/dispatch", codec::JSON, codec::JSON, dispatch.to_string().into_bytes()).await;
    let mut short = predict_body();
    short["request_id"] = json!("short");
    let mut long = predict_body();
    long["request_id"] = json!("long");
    long["request"]["input_tokens"] = json!(6000);
    let batch = json!({"requests": [short, long]});
    let (status, ct, body) =
        call(&s, "/v1/predict/batch", codec::MSGPACK, codec::MSGPACK, codec::encode(Format::MsgPack, &batch).unwrap())
            .await;
    assert_eq!((status, ct.as_str()), (StatusCode::OK, codec::MSGPACK));
    let batch: PredictBatchResponse = codec::decode(Format::MsgPack, &body).unwrap();
    assert_eq!(batch.answers.len(), 2);
    for (i, one) in [short, long].into_iter().enumerate() {
        let (_, _, body) = call(&s, "/v1/predict", codec::JSON, codec::MSGPACK, one.to_string().into_bytes()).await;
        let alone: PredictResponse = codec::decode(Format::MsgPack, &body).unwrap();
        assert!(alone.endpoints.iter().all(|e| e.ttft_ms.is_some()), "scraped endpoints are predicted");
        // What moves with the clock (metrics age, decaying rates) aside, the same answer: TTFT
        // reads the prefill backlog, which drains between the two calls (a 3000-token prompt
        // over 90 ms), TPOT the endpoint's prefill rate, which decays; the long prompt's
        // answer is twice the short one's, far outside either.
        let view = |a: &PredictResponse| -> Vec<_> {
            a.endpoints.iter().map(|e| (e.address.clone(), e.state.in_flight)).collect()
        };
        assert_eq!(view(&batch.answers[i]), view(&alone), "answer {i} of the batch is what /v1/predict answers");
        for (b, a) in batch.answers[i].endpoints.iter().zip(&alone.endpoints) {
            let (bt, at) = (b.ttft_ms.unwrap(), a.ttft_ms.unwrap());
            assert!((bt / at - 1.0).abs() < 0.05, "answer {i}: TTFT {bt} in the batch, {at} alone");
            let (b, a) = (b.tpot_ms.unwrap(), a.tpot_ms.unwrap());
            assert!((b / a - 1.0).abs() < 1e-4, "answer {i}: TPOT {b} in the batch, {a} alone");
        }
    }
    assert!(batch.answers[1].endpoints[0].ttft_ms > batch.answers[0].endpoints[0].ttft_ms, "each its own rows");
}

#[tokio::test]
async fn what_rides_on_a_batch_is_applied_before_its_predictions() {
    let s = state();
    let request = json!({"model": "m", "input_tokens": 100, "streaming": true});
    let batch = json!({
        "requests": [predict_body()],
        "dispatches": [{"pool": "default", "request_id": "a", "endpoint": "127.0.0.1:1", "request": request},
                       {"pool": "default", "request_id": "b", "endpoint": "127.0.0.1:1", "request": request}],
        "reports": {"reports": [{"pool": "default", "request_id": "a", "endpoint": "127.0.0.1:1",
            "source": "predicted_positive", "ttft_ms": 50.0, "tpot_ms": 8.0, "e2e_ms": 400.0,
            "output_tokens": 40, "status": 200}]},
    });
    let (status, _, body) =
        call(&s, "/v1/predict/batch", codec::JSON, codec::JSON, batch.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK);
    // Both dispatched, then a reported in the same call: b is in flight, and the answer sees it.
    assert_eq!(json_of(&body)["answers"][0]["endpoints"][0]["state"]["in_flight"], 1);
    assert_eq!(s.core.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")), Some(1));

    let bad = json!({"requests": [], "dispatches": [{"pool": "default", "request_id": "", "endpoint": "127.0.0.1:1",
        "request": request}]});
    let (status, _, body) = call(&s, "/v1/predict/batch", codec::JSON, "", bad.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json_of(&body)["error"]["field"], "dispatches[0].request_id");
    let bad = json!({"requests": [], "reports": {"reports": [{"pool": "default"}]}});
    let (status, _, body) = call(&s, "/v1/predict/batch", codec::JSON, "", bad.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(json_of(&body)["error"]["field"].as_str().unwrap().starts_with("reports"), "{:?}", json_of(&body));
}

#[tokio::test]
async fn a_batch_refuses_what_it_cannot_answer_at_once_naming_the_request() {
    let s = state();
    let mut waits = predict_body();
    waits["flow"] = json!({"max_wait_ms": 100, "tpot_buffer": 1.0, "dispatch_horizon_ms": 150});
    let mut elsewhere = predict_body();
    elsewhere["pool"] = json!("elsewhere");
    let mut bad = predict_body();
    bad["request"]["input_tokens"] = json!(-1);
    let cases = [
        (json!({"requests": [predict_body(), waits]}), StatusCode::BAD_REQUEST, "requests[1].flow"),
        (json!({"requests": [bad]}), StatusCode::BAD_REQUEST, "requests[0].request.input_tokens"),
        (json!({"requests": [predict_body(), elsewhere]}), StatusCode::NOT_FOUND, "requests[1].pool"),
        (json!({"requests": 3}), StatusCode::BAD_REQUEST, "requests"),
    ];
    for (body, want_status, want_field) in cases {
        let (status, _, out) = call(&s, "/v1/predict/batch", codec::JSON, "", body.to_string().into_bytes()).await;
        assert_eq!(status, want_status, "{want_field}");
        assert_eq!(json_of(&out)["error"]["field"], want_field);
    }
    let (status, _, body) = call(&s, "/v1/predict/batch", codec::JSON, "", b"{\"requests\": []}".to_vec()).await;
    assert_eq!(status, StatusCode::OK, "an empty batch is an empty answer");
    assert_eq!(json_of(&body), json!({"answers": []}));
}

#[tokio::test]
async fn dispatch_and_report_track_in_flight() {
    let s = state();
    // Placed by its goals: its TPOT goal then holds later requests on its endpoint.
    let request = json!({"model": "m", "input_tokens": 100, "streaming": true, "slo": {"tpot_ms": 30.0},
        "prediction_based": true});
    let dispatch = json!({"dispatches": [
        {"pool": "default", "request_id": "a", "endpoint": "127.0.0.1:1", "request": request},
        {"pool": "default", "request_id": "b", "endpoint": "127.0.0.1:9", "request": request},
        {"pool": "nowhere", "request_id": "c", "endpoint": "127.0.0.1:1", "request": request},
    ]});
    let (status, _, body) = call(&s, "/v1/dispatch", codec::JSON, codec::JSON, dispatch.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body), json!({"accepted": 1, "rejected": 2}));
    assert_eq!(s.core.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")), Some(1));

    let (_, _, body) = call(&s, "/v1/predict", codec::JSON, codec::JSON, predict_body().to_string().into_bytes()).await;
    let answer = json_of(&body);
    assert_eq!(answer["endpoints"][0]["state"]["in_flight"], 1);
    assert_eq!(answer["endpoints"][0]["state"]["tightest_tpot_slo_ms"], 30.0);

    let report = json!({"reports": [{"pool": "default", "request_id": "a", "endpoint": "127.0.0.1:1",
        "source": "predicted_positive", "ttft_ms": 50.0, "tpot_ms": 8.0, "e2e_ms": 400.0,
        "output_tokens": 40, "status": 200}]});
    let (status, _, body) = call(&s, "/v1/report", codec::JSON, codec::JSON, report.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body), json!({"accepted": 1, "rejected": 0}));
    assert_eq!(s.core.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")), Some(0));

    // A dispatch arriving after its report (batches can cross) is not tracked again.
    let late =
        json!({"dispatches": [{"pool": "default", "request_id": "a", "endpoint": "127.0.0.1:1", "request": request}]});
    let (_, _, body) = call(&s, "/v1/dispatch", codec::JSON, codec::JSON, late.to_string().into_bytes()).await;
    assert_eq!(json_of(&body)["rejected"], 1);
    assert_eq!(s.core.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")), Some(0));
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
        s.core.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")),
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
        .map(|hardware_class| s.core.models.row(&req, &EndpointState { hardware_class, ..Default::default() }))
        .into();
    let (out, version) = s.core.models.predict(&rows);
    assert_eq!(version, "analytic-prior");
    assert!((out[0].1 / out[1].1 - 2.0).abs() < 1e-9, "a100 TPOT is twice the h100's: {out:?}");
}

#[tokio::test]
async fn a_prompt_the_engine_has_had_time_to_prefill_is_no_longer_work_ahead() {
    // A slow class prefills at ten times an H100's cost a token: the service drains each
    // pool's backlog at the prior's cost for the endpoint's class.
    let config = Config::parse(
        "[[pool]]\nname = \"default\"\nendpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n\
         hardware = {\"127.0.0.1:1\" = \"h100\", \"127.0.0.1:2\" = \"a100\"}\n\
         [model]\nprior_hardware_scale = {a100 = 10.0}\n",
    )
    .unwrap();
    let s = Arc::new(AppState::new(config).unwrap());
    let dispatch = |endpoint: &str, id: &str| {
        json!({"pool": "default", "request_id": id, "endpoint": endpoint, "predicted_ttft_ms": 60000.0,
               "request": {"model": "m", "input_tokens": 3000, "streaming": true}})
    };
    let both = json!({"dispatches": [dispatch("127.0.0.1:1", "h"), dispatch("127.0.0.1:2", "a")]});
    call(&s, "/v1/dispatch", codec::JSON, codec::JSON, both.to_string().into_bytes()).await;
    // 3000 tokens take an H100 90 ms at the prior's 0.03 ms a token, the slow class 900 ms.
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let (_, _, body) = call(&s, "/v1/predict", codec::JSON, codec::JSON, predict_body().to_string().into_bytes()).await;
    let answer = json_of(&body);
    let state = |i: usize| &answer["endpoints"][i]["state"];
    // Both still count as in prefill (no first token seen, predicted far off)...
    assert_eq!(
        (state(0)["uncached_tokens_in_flight"].as_u64(), state(1)["uncached_tokens_in_flight"].as_u64()),
        (Some(3000), Some(3000))
    );
    // ...but the H100 has had time for all of it, the slow class for some (a sixth, or more
    // if the sleep ran long).
    assert_eq!(state(0)["prefill_backlog_tokens"].as_u64(), Some(0), "{answer}");
    let left = state(1)["prefill_backlog_tokens"].as_u64().unwrap();
    assert!(left > 0 && left < 3000, "the slow class has {left} of 3000 left: {answer}");
}
