//! Flow control over real sockets: a request with no headroom waits in the queue, and a
//! caller that leaves takes its place out at once (docs/flow-control.md).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use headroom_predictor::config::Config;
use tokio::io::AsyncWriteExt;

/// A model server whose metrics say it is swamped: every prediction is far over any SLO.
const SWAMPED: &str = "vllm:num_requests_running 256\nvllm:num_requests_waiting 400\nvllm:kv_cache_usage_perc 0.99\n";
/// A model server with nothing running or waiting.
const IDLE: &str = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n";

/// A model server that answers only its metrics.
async fn server(metrics: &'static str) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/metrics", axum::routing::get(move || async move { metrics }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

type Running = (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>);

/// A predictor with flow control over one pool of `server`, ready (scraped).
async fn predictor(server: std::net::SocketAddr) -> Running {
    predictor_with(server, "").await
}

/// [`predictor`] with `sections` (whole TOML sections) in its configuration too.
async fn predictor_with(server: std::net::SocketAddr, sections: &str) -> Running {
    let config = Config::parse(&format!(
        "scrape_interval_ms = 50\n{sections}[flow]\nmax_wait_ms = 60000\n[[pool]]\nname = \"default\"\nendpoints = [\"{server}\"]\n"
    ))
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let predictor = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(headroom_predictor::serve(config, listener, async move { stopped.await.unwrap_or(()) }));
    until("scraped", async || {
        reqwest::get(format!("http://{predictor}/readyz")).await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    (predictor, stop, service)
}

async fn metrics(predictor: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{predictor}/metrics")).await.unwrap().text().await.unwrap()
}

fn value(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

async fn until(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !ok().await {
        assert!(start.elapsed() < Duration::from_secs(3), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_leaving_while_queued_leaves_the_queue_at_once() {
    let (predictor, stop, service) = predictor(server(SWAMPED).await).await;

    // A long SLO: it may wait up to a minute for headroom that will not come.
    let body = serde_json::json!({"pool": "default", "request_id": "r1",
        "request": {"model": "m", "input_tokens": 100, "streaming": true, "slo": {"ttft_ms": 60000.0}, "priority": 0},
        "flow": {"max_wait_ms": 60000, "tpot_buffer": 1.0, "dispatch_horizon_ms": 150, "fairness_id": "a"}})
    .to_string();
    let mut caller = tokio::net::TcpStream::connect(predictor).await.unwrap();
    let head = format!(
        "POST /v1/predict HTTP/1.1\r\nhost: p\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    caller.write_all(head.as_bytes()).await.unwrap();
    caller.write_all(body.as_bytes()).await.unwrap();
    until("queued", async || value(&metrics(predictor).await, "headroom_flow_queued_requests{") == 1.0).await;

    drop(caller);
    until("gone from the queue", async || value(&metrics(predictor).await, "headroom_flow_queued_requests{") == 0.0)
        .await;
    assert_eq!(value(&metrics(predictor).await, "headroom_flow_left_total"), 1.0);
    let _ = stop.send(());
    let _ = service.await;
}

/// The dispatch horizon bounds the queue ahead of a request, not its own prefill: a
/// prompt whose TTFT on an idle server is over the horizon goes at once. (Judged on the
/// whole predicted TTFT, it waited until its SLO pressed, and a sheddable one was shed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_on_an_idle_server_goes_at_once() {
    let idle = server(IDLE).await;
    let (predictor, stop, service) = predictor(idle).await;
    let body = serde_json::json!({"pool": "default", "request_id": "long",
        "request": {"model": "m", "input_tokens": 8000, "streaming": true, "slo": {"ttft_ms": 5000.0}, "priority": -1},
        "flow": {"max_wait_ms": 60000, "tpot_buffer": 1.0, "dispatch_horizon_ms": 150, "fairness_id": "a"}});
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{predictor}/v1/predict"))
        .json(&body)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ttft = answer["endpoints"][0]["ttft_ms"].as_f64().unwrap();
    assert!(ttft > 150.0, "the prompt's own prefill must exceed the horizon for this test to mean anything: {answer}");
    assert_eq!(answer["flow"]["outcome"], "immediate", "{answer}");
    assert_eq!(answer["flow"]["cleared"], serde_json::json!([idle.to_string()]), "where it may go: {answer}");
    let _ = stop.send(());
    let _ = service.await;
}

/// A graceful shutdown waits for the requests queued in flow control, which can outlast the
/// pod's grace period: the samples go to disk when the shutdown begins, not after the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_are_on_disk_as_the_shutdown_begins_while_the_queue_still_drains() {
    let server = server(SWAMPED).await;
    let dir = std::env::temp_dir().join(format!("headroom-flow-shutdown-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (predictor, stop, service) =
        predictor_with(server, &format!("[model]\ndata_dir = \"{}\"\n", dir.display())).await;

    // One request predicted, dispatched and reported: a sample, from the predictor's record.
    let http = reqwest::Client::new();
    let predict = serde_json::json!({"pool": "default", "request_id": "done",
        "request": {"model": "m", "input_tokens": 100, "streaming": true}});
    let dispatch = serde_json::json!({"dispatches": [{"pool": "default", "request_id": "done",
        "endpoint": server.to_string()}]});
    let report = serde_json::json!({"reports": [{"pool": "default", "request_id": "done",
        "endpoint": server.to_string(), "source": "predicted_positive", "ttft_ms": 50.0, "tpot_ms": 8.0,
        "e2e_ms": 900.0, "output_tokens": 100, "status": 200}]});
    for (path, body) in [("predict", predict), ("dispatch", dispatch), ("report", report)] {
        let r = http.post(format!("http://{predictor}/v1/{path}")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap_or_default());
    }
    assert!(value(&metrics(predictor).await, "headroom_reports_total{result=\"sampled\"}") >= 1.0);

    // One request waiting for headroom that will not come, for up to a minute.
    let waiting = http
        .post(format!("http://{predictor}/v1/predict"))
        .json(&serde_json::json!({"pool": "default", "request_id": "waits",
            "request": {"model": "m", "input_tokens": 100, "streaming": true, "slo": {"ttft_ms": 60000.0}, "priority": 0},
            "flow": {"max_wait_ms": 60000, "tpot_buffer": 1.0, "dispatch_horizon_ms": 150, "fairness_id": "a"}}))
        .send();
    let waiting = tokio::spawn(waiting);
    until("queued", async || value(&metrics(predictor).await, "headroom_flow_queued_requests{") == 1.0).await;

    let _ = stop.send(());
    let file = dir.join("samples.msgpack");
    until("samples on disk while the queue drains", async || file.exists()).await;
    let bytes = std::fs::read(&file).unwrap();
    let samples: headroom_predictor_core::model::sampler::Samples = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(samples.train.len() + samples.holdout.len(), 1);
    assert!(!service.is_finished(), "the drain still waits for the queued request");
    service.abort();
    waiting.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
