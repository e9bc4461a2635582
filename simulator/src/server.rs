//! One simulated server: an engine driven in (scaled) real time behind an
//! OpenAI-compatible HTTP API with vLLM's metric names.
//!
//! Every response carries `x-served-by: <ip:port>` so tests can prove where a
//! request went.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use headroom_protocol::headers as names;
use headroom_protocol::openai::{parse_inference_body, InferenceBody};
use headroom_protocol::tokens::prefix_block_hashes;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::engine::{Engine, NewRequest, RequestId, Token};
use crate::histogram::Histogram;
use crate::profile::Profile;

/// Output tokens produced when a request gives no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 128;

/// How one simulated server is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub address: SocketAddr,
    pub profile: Profile,
    /// The model name served (`/v1/models`; others get 404).
    pub model: String,
    /// Simulated time runs this many times faster than real time.
    pub time_scale: f64,
}

enum Command {
    Submit(NewRequest, mpsc::UnboundedSender<Token>),
}

/// A snapshot of engine gauges and counters for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
struct Gauges {
    running: usize,
    waiting: usize,
    kv_usage: f64,
    counters: crate::engine::Counters,
}

/// Request latency histograms, in simulated seconds, with vLLM's buckets.
struct Latencies {
    ttft: Histogram,
    inter_token: Histogram,
    e2e: Histogram,
}

impl Latencies {
    fn new() -> Self {
        Latencies {
            ttft: Histogram::new(&[
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0,
            ]),
            inter_token: Histogram::new(&[
                0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0,
            ]),
            e2e: Histogram::new(&[
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                960.0, 1920.0, 7680.0,
            ]),
        }
    }
}

/// A request the engine is working on, as the server tracks it.
struct Stream {
    tx: mpsc::UnboundedSender<Token>,
    arrived: Instant,
    last_token: Instant,
}

struct Shared {
    config: ServerConfig,
    served_by: HeaderValue,
    commands: mpsc::UnboundedSender<Command>,
    gauges: Mutex<Gauges>,
    latencies: Mutex<Latencies>,
    next_id: AtomicU64,
    /// Requests that arrived still carrying a gateway routing hint header.
    leaked_hints: AtomicU64,
}

/// Binds `config.address` and serves until `shutdown` resolves.
pub async fn run(
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.address)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.address))?;
    serve(config, listener, shutdown).await
}

/// Serves on an already bound listener.
pub async fn serve(
    config: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let address = listener.local_addr()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        served_by: HeaderValue::from_str(&address.to_string())?,
        config: ServerConfig { address, ..config },
        commands: tx,
        gauges: Mutex::new(Gauges::default()),
        latencies: Mutex::new(Latencies::new()),
        next_id: AtomicU64::new(1),
        leaked_hints: AtomicU64::new(0),
    });
    let engine = tokio::spawn(drive_engine(shared.clone(), rx));
    let served_by = shared.served_by.clone();
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "" }))
        .route("/metrics", get(metrics))
        .with_state(shared)
        .layer(axum::middleware::map_response(move |mut res: Response| {
            let served_by = served_by.clone();
            async move {
                res.headers_mut().insert(names::SERVED_BY, served_by);
                res
            }
        }));
    let result = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    engine.abort();
    result.map_err(Into::into)
}

/// Runs the engine: one step at a time, each taking its simulated duration
/// divided by the time scale; tokens go to their requests' channels.
async fn drive_engine(shared: Arc<Shared>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut engine = Engine::new(shared.config.profile.clone());
    let mut streams: HashMap<RequestId, Stream> = HashMap::new();
    let scale = shared.config.time_scale;
    let mut deadline = Instant::now();
    loop {
        if engine.is_idle() {
            match commands.recv().await {
                Some(cmd) => accept(&mut engine, &mut streams, cmd),
                None => return,
            }
            deadline = Instant::now();
        }
        while let Ok(cmd) = commands.try_recv() {
            accept(&mut engine, &mut streams, cmd);
        }
        let Some(step) = engine.step() else { continue };
        deadline += Duration::from_secs_f64(step.duration_ms / 1000.0 / scale);
        let now = Instant::now();
        if deadline < now {
            deadline = now; // the host fell behind: do not race to catch up
        }
        tokio::time::sleep_until(deadline).await;
        let now = Instant::now();
        let simulated = |d: Duration| d.as_secs_f64() * scale;
        {
            let mut lat = shared.latencies.lock().unwrap_or_else(|p| p.into_inner());
            for token in step.tokens {
                let Some(stream) = streams.get_mut(&token.id) else { continue };
                if token.index == 1 {
                    lat.ttft.observe(simulated(now - stream.arrived));
                } else {
                    lat.inter_token.observe(simulated(now - stream.last_token));
                }
                stream.last_token = now;
                let delivered = stream.tx.send(token).is_ok();
                if token.last {
                    lat.e2e.observe(simulated(now - stream.arrived));
                }
                if token.last || !delivered {
                    streams.remove(&token.id);
                    if !delivered {
                        engine.abort(token.id); // client went away
                    }
                }
            }
        }
        publish(&shared, &engine);
    }
}

fn accept(engine: &mut Engine, streams: &mut HashMap<RequestId, Stream>, cmd: Command) {
    match cmd {
        Command::Submit(req, tx) => {
            let now = Instant::now();
            streams.insert(req.id, Stream { tx, arrived: now, last_token: now });
            engine.submit(req);
        }
    }
}

fn publish(shared: &Shared, engine: &Engine) {
    let mut g = shared.gauges.lock().unwrap_or_else(|p| p.into_inner());
    *g = Gauges {
        running: engine.num_running(),
        waiting: engine.num_waiting(),
        kv_usage: engine.kv_usage(),
        counters: engine.counters,
    };
}

/// An OpenAI-style error response.
fn openai_error(status: StatusCode, kind: &str, param: Option<&str>, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

async fn completions(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    count_leaked_hints(&shared, &headers);
    generate(shared, &body, false).await
}

async fn chat_completions(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    count_leaked_hints(&shared, &headers);
    generate(shared, &body, true).await
}

fn count_leaked_hints(shared: &Shared, headers: &HeaderMap) {
    // A gateway routes by these and must not forward them to model servers.
    if headers.keys().any(|k| names::is_routing_hint(k.as_str(), names::PRIORITY)) {
        shared.leaked_hints.fetch_add(1, Ordering::Relaxed);
    }
}

async fn generate(shared: Arc<Shared>, raw: &[u8], chat: bool) -> Response {
    let body = match parse_inference_body(raw, chat) {
        Ok(b) => b,
        Err(e) => return openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", Some(&e.field), &e.message),
    };
    if body.model != shared.config.model {
        let message = format!("The model `{}` does not exist.", body.model);
        return openai_error(StatusCode::NOT_FOUND, "NotFoundError", Some("model"), &message);
    }
    let max_tokens = body.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let limit = shared.config.profile.max_model_len;
    if u64::from(body.prompt_tokens) + u64::from(max_tokens) > u64::from(limit) {
        let message = format!(
            "This model's maximum context length is {limit} tokens; the prompt ({}) plus max_tokens ({max_tokens}) exceed it.",
            body.prompt_tokens
        );
        return openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", Some("max_tokens"), &message);
    }
    let scale = shared.config.time_scale;
    tokio::time::sleep(Duration::from_secs_f64(shared.config.profile.api_overhead_ms / 1000.0 / scale)).await;
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel();
    let max_blocks = shared.config.profile.max_model_len as usize;
    let block_hashes = prefix_block_hashes(&body.prompt_text, max_blocks);
    let request = NewRequest { id, prompt_tokens: body.prompt_tokens, max_tokens, block_hashes };
    if shared.commands.send(Command::Submit(request, tx)).is_err() {
        return openai_error(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", None, "engine stopped");
    }
    let reply = Reply { id: format!("cmpl-{id}"), model: body.model.clone(), chat, prompt_tokens: body.prompt_tokens };
    if body.stream {
        stream_reply(reply, body, rx)
    } else {
        whole_reply(reply, rx).await
    }
}

/// What every chunk or body of one reply shares.
struct Reply {
    id: String,
    model: String,
    chat: bool,
    prompt_tokens: u32,
}

/// Text of one simulated token (4 bytes, so it counts as one token).
const TOKEN_TEXT: &str = " tok";

impl Reply {
    fn usage(&self, completion: u32, cached: u32) -> serde_json::Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn chunk(&self, text: Option<&str>, finish: Option<&str>) -> serde_json::Value {
        let choice = if self.chat {
            json!({"index": 0, "delta": text.map_or(json!({}), |t| json!({"content": t})), "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish})
        };
        let object = if self.chat { "chat.completion.chunk" } else { "text_completion" };
        json!({"id": self.id, "object": object, "model": self.model, "choices": [choice]})
    }
}

fn stream_reply(reply: Reply, body: InferenceBody, mut rx: mpsc::UnboundedReceiver<Token>) -> Response {
    let include_usage = body.include_usage;
    let stream = async_stream(move |tx: mpsc::Sender<Result<Bytes, std::io::Error>>| async move {
        let event = |v: serde_json::Value| Ok::<_, std::io::Error>(Bytes::from(format!("data: {v}\n\n")));
        if reply.chat {
            let role = json!({"id": reply.id, "object": "chat.completion.chunk", "model": reply.model,
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": null}]});
            if tx.send(event(role)).await.is_err() {
                return;
            }
        }
        let (mut generated, mut cached) = (0, 0);
        while let Some(token) = rx.recv().await {
            (generated, cached) = (token.index, token.cached_tokens);
            if tx.send(event(reply.chunk(Some(TOKEN_TEXT), None))).await.is_err() {
                return; // client gone: dropping rx aborts the request in the engine
            }
            if token.last {
                break;
            }
        }
        let _ = tx.send(event(reply.chunk(None, Some("length")))).await;
        if include_usage {
            let usage = json!({"id": reply.id, "object": if reply.chat { "chat.completion.chunk" } else { "text_completion" },
                "model": reply.model, "choices": [], "usage": reply.usage(generated, cached)});
            let _ = tx.send(event(usage)).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A body stream fed by a task; the task ends when the client goes away.
fn async_stream<F, Fut>(produce: F) -> tokio_stream::wrappers::ReceiverStream<Result<Bytes, std::io::Error>>
where
    F: FnOnce(mpsc::Sender<Result<Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(produce(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

async fn whole_reply(reply: Reply, mut rx: mpsc::UnboundedReceiver<Token>) -> Response {
    let (mut generated, mut cached) = (0, 0);
    while let Some(token) = rx.recv().await {
        (generated, cached) = (token.index, token.cached_tokens);
        if token.last {
            break;
        }
    }
    let text = TOKEN_TEXT.repeat(generated as usize);
    let (object, choice) = if reply.chat {
        (
            "chat.completion",
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}),
        )
    } else {
        ("text_completion", json!({"index": 0, "text": text, "finish_reason": "length"}))
    };
    let body = json!({"id": reply.id, "object": object, "model": reply.model, "choices": [choice], "usage": reply.usage(generated, cached)});
    axum::Json(body).into_response()
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let body = json!({"object": "list", "data": [{"id": shared.config.model, "object": "model", "owned_by": "headroom-sim",
        "max_model_len": shared.config.profile.max_model_len}]});
    axum::Json(body).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let g = *shared.gauges.lock().unwrap_or_else(|p| p.into_inner());
    let c = g.counters;
    let labels = format!("model_name=\"{}\"", shared.config.model);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}\n"));
    };
    metric("vllm:num_requests_running", "gauge", "Requests in the running batch.", g.running.to_string());
    metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", g.waiting.to_string());
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 = full.", format!("{:.6}", g.kv_usage));
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        c.prefix_queries.to_string(),
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        c.prefix_hits.to_string(),
    );
    metric("vllm:num_preemptions_total", "counter", "Requests preempted (KV full).", c.preemptions.to_string());
    metric("vllm:prompt_tokens_total", "counter", "Prompt tokens received.", c.prompt_tokens.to_string());
    metric("vllm:generation_tokens_total", "counter", "Tokens generated.", c.generation_tokens.to_string());
    let leaked = shared.leaked_hints.load(Ordering::Relaxed).to_string();
    metric(
        "sim:requests_with_routing_hints_total",
        "counter",
        "Requests that arrived with SLO/priority routing headers (a gateway should strip them).",
        leaked,
    );
    let lat = shared.latencies.lock().unwrap_or_else(|p| p.into_inner());
    lat.ttft.render(&mut out, "vllm:time_to_first_token_seconds", "Time to first token (simulated s).", &labels);
    lat.inter_token.render(&mut out, "vllm:inter_token_latency_seconds", "Time between tokens (simulated s).", &labels);
    lat.e2e.render(&mut out, "vllm:e2e_request_latency_seconds", "End-to-end request latency (simulated s).", &labels);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
