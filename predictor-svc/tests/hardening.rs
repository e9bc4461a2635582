//! The predictor against hostile or broken input, in-process: each test is one
//! finding of the hardening review (`docs/reliability.md`) and fails without its fix.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use headroom_predictor::config::ModelConfig;
use headroom_predictor::{config::Config, routes, state::AppState};
use headroom_predictor_core::model::store::{ModelStore, TrainOutcome};
use headroom_protocol::codec;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// The service's model runtime, as the stores it opens run.
fn ort() -> Arc<dyn headroom_predictor_core::model::runtime::Runtime> {
    Arc::new(headroom_predictor::ort::Ort::init(None).unwrap())
}

const POOL: &str = "[[pool]]\nname = \"default\"\nendpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n";
const TOKEN: &str = "s3cret-token-0123456789";

fn state_with(extra: &str) -> Arc<AppState> {
    Arc::new(AppState::new(Config::parse(&format!("{extra}{POOL}")).unwrap()).unwrap())
}

async fn send(
    state: &Arc<AppState>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Value,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path).header(header::CONTENT_TYPE, codec::JSON);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let body = if method == "GET" { Body::empty() } else { Body::from(body.to_string()) };
    let res = routes::router(state.clone()).oneshot(req.body(body).unwrap()).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn request() -> Value {
    json!({"model": "m", "input_tokens": 100, "streaming": true})
}

fn dispatch(id: &str, extra: Value) -> Value {
    let mut d = json!({"pool": "default", "request_id": id, "endpoint": "127.0.0.1:1", "request": request()});
    if let (Some(d), Some(extra)) = (d.as_object_mut(), extra.as_object()) {
        d.extend(extra.clone());
    }
    json!({"dispatches": [d]})
}

fn report(id: &str, i: u64) -> Value {
    json!({"pool": "default", "request_id": id, "endpoint": "127.0.0.1:1", "source": "predicted_positive",
        "ttft_ms": 50.0 + i as f64, "tpot_ms": 8.0, "e2e_ms": 900.0, "output_tokens": 100, "status": 200})
}

#[tokio::test]
async fn a_huge_number_in_a_dispatch_is_a_400_naming_the_field_not_a_dropped_connection() {
    let s = state_with("");
    for value in [json!(1e300), json!(1e22), json!(-1.0), json!(3_600_001.0)] {
        let mut d = dispatch("r", json!({}));
        d["dispatches"][0]["request"]["slo"] = json!({"ttft_ms": value});
        let (status, body) = send(&s, "POST", "/v1/dispatch", None, d).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{value}");
        assert_eq!(body["error"]["field"], "dispatches[0].request.slo.ttft_ms", "{value}");
    }
    // The service is still up and tracks nothing from the refused batches.
    assert_eq!(s.core.pools.with("default", |p| p.in_flight_on("127.0.0.1:1")), Some(0));
    let (status, _) = send(&s, "POST", "/v1/dispatch", None, dispatch("ok", json!({}))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn out_of_range_report_values_and_sizes_are_refused_by_field() {
    let s = state_with("");
    let cases = [
        ("ttft_ms", json!(1e300), "reports[0].ttft_ms"),
        ("e2e_ms", json!(-3.0), "reports[0].e2e_ms"),
        ("request_id", json!("x".repeat(129)), "reports[0].request_id"),
        ("endpoint", json!("e".repeat(257)), "reports[0].endpoint"),
    ];
    for (key, value, field) in cases {
        let mut o = report("r", 1);
        o[key] = value;
        let (status, body) = send(&s, "POST", "/v1/report", None, json!({"reports": [o]})).await;
        assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some(field)));
    }
    let many: Vec<Value> = (0..10_001).map(|i| report(&format!("r{i}"), i)).collect();
    let body = json!({"reports": many});
    let (status, _) = send(&s, "POST", "/v1/report", None, body).await;
    // Over the item cap, or over the body cap first: refused either way, nothing applied.
    assert!(status == StatusCode::BAD_REQUEST || status == StatusCode::PAYLOAD_TOO_LARGE, "{status}");
    let mut d = dispatch("p", json!({}));
    d["dispatches"][0]["request"]["prefix_hashes"] = json!(vec![1u64; 4097]);
    let (_, body) = send(&s, "POST", "/v1/dispatch", None, d).await;
    assert_eq!(body["error"]["field"], "dispatches[0].request.prefix_hashes");
}

#[tokio::test]
async fn guarded_routes_need_the_token_and_open_ones_do_not() {
    std::env::remove_var(headroom_predictor::config::TOKEN_ENV);
    let dir = std::env::temp_dir().join(format!("headroom-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let s = state_with(&format!("auth_token_file = \"{}\"\n", file.display()));
    let predict = json!({"pool": "default", "request_id": "r", "request": request()});
    let guarded = [
        ("POST", "/v1/predict", predict.clone()),
        ("POST", "/v1/predict/batch", json!({"requests": [predict.clone()]})),
        ("POST", "/v1/dispatch", dispatch("r", json!({}))),
        ("POST", "/v1/report", json!({"reports": []})),
        ("GET", "/v1/observations", Value::Null),
        ("GET", "/v1/models/v1.onnx", Value::Null),
    ];
    let wrong_calls = guarded.len() * 3;
    for (method, path, body) in guarded {
        for wrong in [None, Some("not-the-token-at-all"), Some(&TOKEN[..TOKEN.len() - 1])] {
            let (status, out) = send(&s, method, path, wrong, body.clone()).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} with {wrong:?}");
            assert_eq!(out["error"]["field"], "authorization");
        }
        let (status, _) = send(&s, method, path, Some(TOKEN), body.clone()).await;
        assert_ne!(status, StatusCode::UNAUTHORIZED, "{path} with the token");
    }
    for path in ["/healthz", "/v1/models", "/v1/pools", "/metrics"] {
        let (status, _) = send(&s, "GET", path, None, Value::Null).await;
        assert_eq!(status, StatusCode::OK, "{path} stays open");
    }
    let (_, metrics) = {
        let req = Request::get("/metrics").body(Body::empty()).unwrap();
        let res = routes::router(s.clone()).oneshot(req).await.unwrap();
        (res.status(), String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
    };
    assert!(metrics.contains(&format!("headroom_unauthorized_requests_total {wrong_calls}")), "{metrics}");
    // A short token is refused at start, naming where it came from.
    std::fs::write(&file, "short").unwrap();
    let err = Config::parse(&format!("auth_token_file = \"{}\"\n{POOL}", file.display())).unwrap().auth_token();
    assert!(err.unwrap_err().to_string().contains("auth_token_file"));
    // So is the manifests' placeholder: a token everyone knows guards nothing.
    std::fs::write(&file, "change-me-generate-with-openssl-rand-hex-32").unwrap();
    let err = Config::parse(&format!("auth_token_file = \"{}\"\n{POOL}", file.display())).unwrap().auth_token();
    assert!(err.unwrap_err().to_string().contains("placeholder"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A callers file with one token for each of two gateways (a second for `gw-a`, rotating).
fn callers_file(name: &str, lines: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("headroom-callers-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("callers");
    std::fs::write(&file, lines).unwrap();
    file
}

const GW_A: &str = "gw-a-token-0123456789";
const GW_B: &str = "gw-b-token-0123456789";

/// `n` invented dispatches, `from`'s ids.
fn invented(from: &str, n: usize) -> Value {
    let dispatches: Vec<Value> = (0..n)
        .map(|i| {
            json!({"pool": "default", "request_id": format!("{from}-{i}"), "endpoint": "127.0.0.1:1",
            "request": request()})
        })
        .collect();
    json!({"dispatches": dispatches})
}

/// What the probe did with the shared token (10 calls of 10,000 invented dispatch ids in
/// 1.3 s filled the books: every real dispatch was refused `pool_full`) is bounded per
/// caller: each gateway's token names it, its dispatches past its rate are not tracked, and
/// those it has tracked hold at most its share of the books, so the other gateway's real
/// dispatches are tracked as before. Fails with either quota removed.
#[tokio::test]
async fn a_leaked_token_floods_only_its_own_callers_quotas() {
    std::env::remove_var(headroom_predictor::config::TOKEN_ENV);
    let file = callers_file("quotas", &format!("gw-a {GW_A}\ngw-b {GW_B}\n"));
    let config = |rate: u32| {
        format!(
            "callers_file = \"{}\"\nmax_in_flight = 1000\n[callers]\ndispatches_per_s = {rate}\n\
             dispatch_burst = {rate}\nin_flight_share = 0.5\n",
            file.display()
        )
    };
    // The rate: a burst of 200, then 200 a second.
    let s = state_with(&config(200));
    let started = std::time::Instant::now();
    let mut accepted = 0;
    for call in 0..10 {
        let (status, ack) = send(&s, "POST", "/v1/dispatch", Some(GW_A), invented(&format!("a{call}"), 1000)).await;
        assert_eq!(status, StatusCode::OK);
        accepted += ack["accepted"].as_u64().unwrap();
    }
    let most = 200 + (started.elapsed().as_secs_f64() * 200.0).ceil() as u64;
    assert!((200..=most).contains(&accepted), "{accepted} of 10,000 tracked; at most {most}");
    let (_, ack) = send(&s, "POST", "/v1/dispatch", Some(GW_B), invented("b", 50)).await;
    assert_eq!(ack["accepted"], 50, "the other gateway's bucket is its own");
    let refused =
        format!(r#"headroom_caller_refusals_total{{caller="gw-a",result="caller_rate"}} {}"#, 10_000 - accepted);
    assert!(s.core.metrics.render().contains(&refused), "the flooding caller is named");

    // The share: however fast it may post, a caller holds at most half the books.
    let s = state_with(&config(1_000_000));
    let (_, ack) = send(&s, "POST", "/v1/dispatch", Some(GW_A), invented("a", 2000)).await;
    assert_eq!((ack["accepted"].as_u64(), ack["rejected"].as_u64()), (Some(500), Some(1500)));
    let (_, ack) = send(&s, "POST", "/v1/dispatch", Some(GW_B), invented("b", 100)).await;
    assert_eq!(ack["accepted"], 100, "the other gateway's dispatches are tracked, not refused pool_full");
    let text = s.core.metrics.render();
    assert!(text.contains(r#"headroom_dispatches_total{result="caller_full"} 1500"#), "{text}");
    assert!(text.contains(r#"headroom_caller_refusals_total{caller="gw-a",result="caller_full"} 1500"#), "{text}");
    assert!(!text.contains(r#"caller="gw-b""#), "the other gateway was refused nothing");
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

/// A token is rotated, or a leaked one revoked, by editing the callers file: the predictor
/// reads it again when it changes, and a file that no longer parses keeps the tokens in force.
#[tokio::test(start_paused = true)]
async fn a_callers_file_is_read_again_when_it_changes() {
    std::env::remove_var(headroom_predictor::config::TOKEN_ENV);
    let file = callers_file("rotate", &format!("gw-a {GW_A}\ngw-b {GW_B}\n"));
    let s = state_with(&format!("callers_file = \"{}\"\n", file.display()));
    let reload = tokio::spawn(headroom_predictor::auth::reload(s.clone()));
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let status = |token| {
        let s = s.clone();
        async move { send(&s, "POST", "/v1/report", Some(token), json!({"reports": []})).await.0 }
    };
    assert_eq!((status(GW_A).await, status(GW_B).await), (StatusCode::OK, StatusCode::OK));
    // gw-a's token leaked: it gets a new one and the old one goes.
    let rotated = "gw-a-token-rotated-0123";
    std::fs::write(&file, format!("gw-a {rotated}\ngw-b {GW_B}\n")).unwrap();
    tokio::time::sleep(headroom_predictor::tokens::RELOAD_INTERVAL * 2).await;
    assert_eq!(status(GW_A).await, StatusCode::UNAUTHORIZED, "the leaked token is revoked");
    assert_eq!((status(rotated).await, status(GW_B).await), (StatusCode::OK, StatusCode::OK));
    // A broken edit keeps what was in force.
    std::fs::write(&file, "gw-a short\n").unwrap();
    tokio::time::sleep(headroom_predictor::tokens::RELOAD_INTERVAL * 2).await;
    assert_eq!(status(rotated).await, StatusCode::OK);
    reload.abort();
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

#[tokio::test]
async fn reports_for_requests_never_dispatched_teach_nothing() {
    let s = state_with("");
    let forged: Vec<Value> = (0..300).map(|i| report(&format!("forged-{i}"), i)).collect();
    let (status, body) = send(&s, "POST", "/v1/report", None, json!({"reports": forged})).await;
    assert_eq!(status, StatusCode::OK, "still acknowledged (they end nothing in flight)");
    assert_eq!(body["accepted"], 300);
    let c = s.core.models.sample_counts();
    assert_eq!((c.train, c.holdout, c.filed), (0, 0, 0), "no sample filed from a forged report");

    // Predicted here, dispatched, reported: learned from (what this predictor kept of it).
    let predict = |id: &str| json!({"pool": "default", "request_id": id, "request": request()});
    send(&s, "POST", "/v1/predict", None, predict("real")).await;
    send(&s, "POST", "/v1/dispatch", None, dispatch("real", json!({}))).await;
    send(&s, "POST", "/v1/report", None, json!({"reports": [report("real", 1)]})).await;
    let c = s.core.models.sample_counts();
    assert_eq!((c.train + c.holdout, c.filed), (1, 1));
    // Dispatched and reported, but predicted elsewhere (another replica, or this one before
    // a restart): tracked as load, never learned from.
    send(&s, "POST", "/v1/dispatch", None, dispatch("failover", json!({}))).await;
    send(&s, "POST", "/v1/report", None, json!({"reports": [report("failover", 3)]})).await;
    let c = s.core.models.sample_counts();
    assert_eq!((c.train + c.holdout, c.filed), (1, 1), "no sample without a record");
    let metrics = s.core.metrics.render();
    assert!(metrics.contains("headroom_dispatches_without_record_total 1\n"), "{metrics}");
    assert!(metrics.contains("headroom_reports_total{result=\"no_record\"} 1\n"), "{metrics}");
    // Served by another endpoint than the one dispatched to: not learned either.
    send(&s, "POST", "/v1/predict", None, predict("moved")).await;
    send(&s, "POST", "/v1/dispatch", None, dispatch("moved", json!({}))).await;
    let mut o = report("moved", 2);
    o["endpoint"] = json!("127.0.0.1:2");
    send(&s, "POST", "/v1/report", None, json!({"reports": [o]})).await;
    let c = s.core.models.sample_counts();
    assert_eq!((c.train + c.holdout, c.filed), (1, 1));
}

fn data_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("headroom-hardening-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn store_config(dir: &std::path::Path, keep_versions: usize) -> ModelConfig {
    ModelConfig {
        data_dir: Some(dir.to_path_buf()),
        min_samples: 40,
        min_new_samples: 20,
        trees: 10,
        keep_versions,
        keep_margin: 10.0,
        ..ModelConfig::default()
    }
}

/// Feeds `n` samples whose latency follows the queue, so every round trains a model.
fn feed(store: &ModelStore, from: u64, n: u64) {
    for i in from..from + n {
        let mut o = report(&format!("f{i}"), i);
        // Completed as the predictor completes a report from its record.
        o["request"] = request();
        o["state_at_dispatch"] = json!({"running": i % 7, "waiting": i % 3, "kv_usage": 0.1, "prefix_match": 0.0,
            "in_flight": 1, "uncached_tokens_in_flight": 0, "tokens_in_flight": 100});
        let o: headroom_protocol::Observation = serde_json::from_value(o).unwrap();
        store.observe(&o);
    }
}

#[test]
fn disk_keeps_only_keep_versions_and_samples_after_every_round() {
    let dir = data_dir("prune");
    let store = ModelStore::open(store_config(&dir, 2), ort()).unwrap();
    assert!(dir.is_dir(), "the data dir is created at the start");
    for round in 0..4 {
        feed(&store, round * 100, 100);
        assert!(matches!(store.train_if_due(), TrainOutcome::Activated(_)), "round {round}");
        assert!(dir.join("samples.msgpack").exists(), "samples written after round {round}");
    }
    let mut files: Vec<String> = std::fs::read_dir(dir.join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["v3.json", "v3.onnx", "v4.json", "v4.onnx"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_model_file_whose_checksum_does_not_match_is_not_loaded() {
    let dir = data_dir("checksum");
    {
        let store = ModelStore::open(store_config(&dir, 5), ort()).unwrap();
        for round in 0..2 {
            feed(&store, round * 100, 100);
            assert!(matches!(store.train_if_due(), TrainOutcome::Activated(_)));
        }
    }
    // Swap v2's file for v1's: a valid ONNX model, but not the one recorded as v2.
    let v1 = std::fs::read(dir.join("models/v1.onnx")).unwrap();
    std::fs::write(dir.join("models/v2.onnx"), &v1).unwrap();
    std::fs::write(dir.join("models/.tmp-v9.onnx.1.1"), b"leftover of a crash").unwrap();
    let store = ModelStore::open(store_config(&dir, 5), ort()).unwrap();
    assert_eq!(store.active_name(), "v1", "v2 refused by its checksum, the last good one kept");
    assert!(!dir.join("models/.tmp-v9.onnx.1.1").exists(), "crash leftovers removed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_data_dir_is_a_metric_and_a_log_not_a_crash() {
    let dir = data_dir("readonly");
    // A data dir that cannot be created: a file stands where it should be.
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    let store = ModelStore::open(store_config(&dir, 5), ort()).unwrap();
    assert_eq!(store.persist_failures.get(), 1, "known at the start, not at the first round");
    feed(&store, 0, 100);
    assert!(matches!(store.train_if_due(), TrainOutcome::Activated(_)), "serves on from memory");
    store.persist_samples();
    assert!(store.persist_failures.get() >= 3, "failures counted: {}", store.persist_failures.get());
    let _ = std::fs::remove_file(&dir);
}

#[test]
fn arbitrary_bytes_in_the_data_dir_never_stop_the_start() {
    let dir = data_dir("garbage");
    let models = dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let junk: [&[u8]; 5] =
        [b"", b"\xc1\xff\x00", b"{\"version\": 1}", &[0x93, 0xff, 0xff, 0xff], &[0xdd, 0xff, 0xff, 0xff, 0xff]];
    for (i, bytes) in junk.iter().enumerate() {
        std::fs::write(dir.join("samples.msgpack"), bytes).unwrap();
        std::fs::write(dir.join("ACTIVE"), bytes).unwrap();
        std::fs::write(models.join("v1.json"), bytes).unwrap();
        std::fs::write(models.join("v1.onnx"), bytes).unwrap();
        let store = ModelStore::open(store_config(&dir, 5), ort()).unwrap();
        assert_eq!(store.active_name(), "analytic-prior", "case {i}");
        let c = store.sample_counts();
        assert_eq!((c.train, c.holdout, c.filed), (0, 0, 0), "case {i}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_panicking_handler_is_a_counted_500_not_a_dropped_connection() {
    let s = state_with("");
    let boom = axum::Router::new().route(
        "/boom",
        axum::routing::get(|| async {
            let v: Vec<u8> = Vec::new();
            #[allow(clippy::indexing_slicing)]
            v[3].to_string() // a bug stands in for any panic
        }),
    );
    let app = routes::guard(boom, s.clone());
    let res = app.oneshot(Request::get("/boom").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body: Value = serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["message"], "internal error");
    let metrics = s.core.metrics.render();
    assert!(metrics.contains("headroom_handler_panics_total 1"), "{metrics}");
}

#[tokio::test]
async fn a_metrics_body_over_the_cap_fails_the_scrape() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let big = format!("vllm:num_requests_running 1\n{}", "# padding\n".repeat(2000)); // about 20 KB
    let app = axum::Router::new().route("/metrics", axum::routing::get(move || async move { big.clone() }));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let err = headroom_predictor::scrape::scrape_one(
        &client,
        &addr.to_string(),
        4096,
        headroom_predictor_core::engine_metrics::vllm(),
    )
    .await
    .unwrap_err();
    assert!(err.message.contains("max_scrape_bytes") && !err.unreachable, "{err}");
    let ok = headroom_predictor::scrape::scrape_one(
        &client,
        &addr.to_string(),
        1 << 20,
        headroom_predictor_core::engine_metrics::vllm(),
    )
    .await
    .unwrap();
    assert_eq!(ok.running, 1);
    server.abort();
}

#[test]
fn concurrent_writes_never_leave_a_torn_file() {
    let dir = data_dir("concurrent");
    let store = Arc::new(ModelStore::open(store_config(&dir, 5), ort()).unwrap());
    feed(&store, 0, 200);
    let writers: Vec<_> = (0..6)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || (0..40).for_each(|_| store.persist_samples()))
        })
        .collect();
    // A training round persists too, racing the writers (as at shutdown).
    let trainer = {
        let store = store.clone();
        std::thread::spawn(move || store.train_if_due())
    };
    let mut reads = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        if let Ok(bytes) = std::fs::read(dir.join("samples.msgpack")) {
            let decoded = rmp_serde::from_slice::<headroom_predictor_core::model::sampler::Samples>(&bytes);
            assert!(decoded.is_ok(), "a reader saw a torn samples file");
            reads += 1;
        }
    }
    writers.into_iter().for_each(|w| w.join().unwrap());
    trainer.join().unwrap();
    assert!(reads > 0);
    assert_eq!(store.persist_failures.get(), 0, "no writer tripped over another's temp file");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_server_whose_metrics_hang_does_not_slow_the_others_scrapes() {
    let serve = |hang: bool| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                "vllm:num_requests_running 1\n"
            }),
        );
        (addr, tokio::spawn(async move { axum::serve(listener, app).await }))
    };
    let ((good, good_server), (hung, hung_server)) = (serve(false).await, serve(true).await);
    let config = format!(
        "scrape_interval_ms = 50\nscrape_timeout_ms = 2000\n[[pool]]\nname = \"default\"\nendpoints = [\"{good}\", \"{hung}\"]\n"
    );
    let state = Arc::new(AppState::new(Config::parse(&config).unwrap()).unwrap());
    let scraper = tokio::spawn(headroom_predictor::scrape::run(state.clone()));
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let (good_age, good_scrapes) = state
        .core
        .pools
        .with("default", |p| {
            let e = p.endpoints.iter().find(|e| e.address == good.to_string()).unwrap();
            (e.scraped_at.map(|t| t.elapsed()), e.scrape_errors)
        })
        .unwrap();
    // Refreshed every 50 ms although the other's scrape has hung for 1.5 s (timeout 2 s).
    let age = good_age.expect("the good server was scraped");
    assert!(age < std::time::Duration::from_millis(300), "the good server's metrics are {age:?} old");
    assert_eq!(good_scrapes, 0);
    let text = state.core.metrics.render();
    let ok = text.lines().find(|l| l.starts_with("headroom_scrapes_total{result=\"ok\"}")).unwrap_or_default();
    let n: f64 = ok.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(n >= 10.0, "the good server was scraped {n} times in 1.5 s");
    scraper.abort();
    good_server.abort();
    hung_server.abort();
}

#[tokio::test]
async fn a_server_that_refuses_connections_loses_its_prediction_at_the_next_scrape() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/metrics", axum::routing::get(|| async { "vllm:num_requests_running 1\n" }));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let config = format!(
        "scrape_interval_ms = 50\nscrape_timeout_ms = 500\nstale_after_ms = 60000\n[[pool]]\nname = \"default\"\nendpoints = [\"{addr}\"]\n"
    );
    let state = Arc::new(AppState::new(Config::parse(&config).unwrap()).unwrap());
    let scraper = tokio::spawn(headroom_predictor::scrape::run(state.clone()));
    let fresh = |state: &AppState| state.core.pools.with("default", |p| p.endpoints[0].scraped_at.is_some()).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(fresh(&state), "scraped while up");
    // The server goes away (its port now refuses connections). Its metrics would stay
    // "fresh" for a minute by age alone; a refused scrape drops them within an interval.
    server.abort();
    let _ = server.await;
    let gone = std::time::Instant::now();
    while fresh(&state) {
        assert!(gone.elapsed() < std::time::Duration::from_millis(1000), "still predicted a second after it went away");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // No metrics, so `service::predict` gives it no prediction (it says so for any endpoint
    // without fresh metrics; tested in api.rs).
    assert!(state.core.pools.with("default", |p| p.endpoints[0].metrics.is_none()).unwrap());
    scraper.abort();
}

/// `/v1/observations` copies at most a page under the log's lock (every report takes it):
/// a `limit` over the page is a 400 naming it, and a reader pages with `after`.
#[tokio::test]
async fn observations_come_in_bounded_pages() {
    let s = state_with("observations_kept = 5000\n");
    let reports: Vec<Value> = (0..2500).map(|i| report(&format!("o-{i}"), i)).collect();
    let (status, _) = send(&s, "POST", "/v1/report", None, json!({"reports": reports})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send(&s, "GET", "/v1/observations?limit=100000", None, Value::Null).await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("limit")), "{body}");
    let mut after = 0;
    let mut read = Vec::new();
    loop {
        let (status, page) =
            send(&s, "GET", &format!("/v1/observations?limit=1000&after={after}"), None, Value::Null).await;
        assert_eq!(status, StatusCode::OK);
        let list = page["observations"].as_array().cloned().unwrap_or_default();
        if list.is_empty() {
            break;
        }
        assert_eq!(page["first"].as_u64(), Some(after + 1));
        after += list.len() as u64;
        read.extend(list.into_iter().filter_map(|o| o["request_id"].as_str().map(str::to_string)));
    }
    assert_eq!(read.len(), 2500);
    assert_eq!((read[0].as_str(), read[2499].as_str()), ("o-0", "o-2499"), "every one, in order, once");
    // Without `after`, the newest.
    let (_, newest) = send(&s, "GET", "/v1/observations?limit=2", None, Value::Null).await;
    assert_eq!(newest["observations"][1]["request_id"], "o-2499");
    assert_eq!(newest["first"], 2499);
}

/// Word that a request left the queue of a pool this predictor does not serve creates no
/// queue (each such name used to add one, never removed).
#[tokio::test]
async fn abandoned_requests_of_unknown_pools_create_no_queue() {
    let s = state_with("");
    let abandoned: Vec<Value> = (0..50).map(|i| json!({"pool": format!("pool-{i}"), "request_id": "r"})).collect();
    let (status, _) = send(&s, "POST", "/v1/report", None, json!({"reports": [], "abandoned": abandoned})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(s.core.flows.queue_count(), 0);
}

/// Concurrent scrapes of `/metrics` each see every endpoint's in-flight series: the gauges
/// are refilled and rendered as one step, so one scrape never renders a family another has
/// just cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_scrapes_each_see_every_series() {
    let s = state_with("");
    send(&s, "POST", "/v1/dispatch", None, dispatch("held", json!({}))).await;
    let scrapes: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut missing = 0;
                for _ in 0..300 {
                    let req = Request::builder().uri("/metrics").body(Body::empty()).unwrap();
                    let res = routes::router(s.clone()).oneshot(req).await.unwrap();
                    let text = String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
                    let series = text.lines().filter(|l| l.starts_with("headroom_in_flight_requests{")).count();
                    missing += usize::from(series != 2);
                }
                missing
            })
        })
        .collect();
    let mut missing = 0;
    for t in scrapes {
        missing += t.await.unwrap();
    }
    assert_eq!(missing, 0, "scrapes that missed an endpoint's series");
}

/// A server whose `/metrics` redirects elsewhere fails its scrape: the predictor never reads
/// another address's load as this server's.
#[tokio::test]
async fn a_metrics_redirect_is_not_followed() {
    let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}/metrics", elsewhere.local_addr().unwrap());
    let app = axum::Router::new().route("/metrics", axum::routing::get(|| async { "vllm:num_requests_running 7\n" }));
    let other = tokio::spawn(async move { axum::serve(elsewhere, app).await });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let redirect = move || {
        let target = target.clone();
        async move { (StatusCode::FOUND, [(header::LOCATION, target)]) }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(redirect));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = headroom_predictor::scrape::scrape_client(std::time::Duration::from_secs(2)).unwrap();
    let err = headroom_predictor::scrape::scrape_one(
        &client,
        &addr.to_string(),
        1 << 20,
        headroom_predictor_core::engine_metrics::vllm(),
    )
    .await
    .unwrap_err();
    assert!(err.message.contains("302"), "{err}");
    server.abort();
    other.abort();
}

/// A pool served by another engine is read by that engine's series: an SGLang server's
/// load reaches the pool, and a pool naming an engine nobody defined is refused at start.
#[tokio::test]
async fn a_pool_of_another_engine_is_read_by_its_series() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = "sglang:num_running_reqs{model_name=\"m\"} 6\nsglang:num_queue_reqs{model_name=\"m\"} 3\n\
                sglang:token_usage{model_name=\"m\"} 0.4\n";
    let app = axum::Router::new().route("/metrics", axum::routing::get(move || async move { body }));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let pool = format!("[[pool]]\nname = \"default\"\nendpoints = [\"{addr}\"]\n");
    let config = format!("scrape_interval_ms = 50\n{pool}engine = \"sglang\"\n");
    let state = Arc::new(AppState::new(Config::parse(&config).unwrap()).unwrap());
    let scraper = tokio::spawn(headroom_predictor::scrape::run(state.clone()));
    let metrics = |state: &AppState| state.core.pools.with("default", |p| p.endpoints[0].metrics).flatten();
    let started = std::time::Instant::now();
    while metrics(&state).is_none() {
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "never scraped");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let m = metrics(&state).unwrap();
    assert_eq!((m.running, m.waiting, m.kv_usage), (6, 3, 0.4));
    scraper.abort();
    server.abort();
    let err = Config::parse(&format!("{pool}engine = \"tgi\"\n")).unwrap_err().to_string();
    assert!(err.contains("engine") && err.contains("tgi"), "{err}");
}
