//! The simulated server over real sockets on 127.0.0.1, in-process.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use headroom_sim::profile::Profile;
use headroom_sim::server::{serve, ServerConfig};
use serde_json::{json, Value};

struct Server {
    url: String,
    address: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn start(time_scale: f64) -> Server {
    start_with(Profile::h100(), time_scale).await
}

async fn start_with(profile: Profile, time_scale: f64) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let config = ServerConfig { address, profile, model: "sim".into(), time_scale };
    tokio::spawn(serve(config, listener, async move {
        let _ = rx.await;
    }));
    Server { url: format!("http://{address}"), address: address.to_string(), stop: Some(tx) }
}

async fn post(s: &Server, path: &str, body: &str) -> (u16, Option<String>, String) {
    let r = reqwest::Client::new().post(format!("{}{path}", s.url)).body(body.to_string()).send().await.unwrap();
    let served = r.headers().get("x-served-by").map(|v| v.to_str().unwrap().to_string());
    (r.status().as_u16(), served, r.text().await.unwrap())
}

#[tokio::test]
async fn bad_input_gets_openai_errors() {
    let s = start(50.0).await;
    let cases = [
        (json!({"model": "other", "prompt": "x"}).to_string(), 404, "model"),
        ("{not json".to_string(), 400, "body"),
        (json!({"model": "sim", "prompt": "x", "max_tokens": 40000}).to_string(), 400, "max_tokens"),
        (json!({"model": "sim"}).to_string(), 400, "prompt"),
    ];
    for (body, status, param) in cases {
        let (code, served, text) = post(&s, "/v1/completions", &body).await;
        assert_eq!(code, status, "{text}");
        assert_eq!(served.as_deref(), Some(s.address.as_str()), "x-served-by on errors too");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], param, "{text}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
}

#[tokio::test]
async fn streams_one_event_per_token_with_usage_and_cached_tokens() {
    let s = start(50.0).await;
    let system = "Answer as a pirate would, briefly. ".repeat(60);
    let body = |q: &str| {
        json!({"model": "sim", "prompt": format!("{system}{q}"), "max_tokens": 5, "stream": true,
               "stream_options": {"include_usage": true}})
        .to_string()
    };
    let (code, _, first) = post(&s, "/v1/completions", &body("Where is the gold?")).await;
    assert_eq!(code, 200);
    let events: Vec<Value> = first
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text_events = events.iter().filter(|e| e["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty())).count();
    assert_eq!(text_events, 5, "one SSE event per token");
    assert!(first.trim_end().ends_with("data: [DONE]"));
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

    let (_, _, second) = post(&s, "/v1/completions", &body("Who is the captain?")).await;
    let cached = second
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64())
        .unwrap();
    assert!(cached >= 500, "the shared system prompt is served from the prefix cache: {cached}");

    let chat = json!({"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).to_string();
    let (code, _, text) = post(&s, "/v1/chat/completions", &chat).await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn metrics_use_vllm_names_in_simulated_seconds() {
    let s = start(20.0).await;
    let (code, _, _) =
        post(&s, "/v1/completions", &json!({"model": "sim", "prompt": "hello", "max_tokens": 4}).to_string()).await;
    assert_eq!(code, 200);
    let text = reqwest::get(format!("{}/metrics", s.url)).await.unwrap().text().await.unwrap();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    let value = |prefix: &str| -> f64 {
        text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()).unwrap().parse().unwrap()
    };
    assert_eq!(value("vllm:generation_tokens_total"), 4.0);
    assert_eq!(value("vllm:time_to_first_token_seconds_count"), 1.0);
    // One engine step is >= 6.8 simulated ms; wall time was divided by 20, the histogram multiplies it back.
    assert!(value("vllm:time_to_first_token_seconds_sum") >= 0.0068, "{text}");
    let models: Value = reqwest::get(format!("{}/v1/models", s.url)).await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "sim");
}

#[tokio::test]
async fn full_kv_preempts_and_the_metric_shows_it() {
    let mut profile = Profile::h100();
    profile.kv_capacity_tokens = 4096;
    let s = start_with(profile, 50.0).await;
    let body = json!({"model": "sim", "prompt": "p".repeat(4 * 1000), "max_tokens": 600}).to_string();
    let sends: Vec<_> = (0..4).map(|_| post(&s, "/v1/completions", &body)).collect();
    for (code, _, text) in futures_util::future::join_all(sends).await {
        assert_eq!(code, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 600, "a preempted request still completes");
    }
    let text = reqwest::get(format!("{}/metrics", s.url)).await.unwrap().text().await.unwrap();
    let preemptions: f64 = text
        .lines()
        .find(|l| l.starts_with("vllm:num_preemptions_total"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(preemptions > 0.0, "4 x 1600 tokens in a 4096-token KV must preempt:\n{text}");
}
