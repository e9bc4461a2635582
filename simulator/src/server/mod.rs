//! One simulated server: an engine driven in (scaled) real time behind an
//! OpenAI-compatible HTTP API with vLLM's metric names.
//!
//! Every response carries `x-served-by: <ip:port>` so tests can prove where a
//! request went. This module is the HTTP side (routes, request checks, handing a
//! request to the engine); `driver` runs the engine, `replies` shapes the bodies,
//! `metrics` renders `/metrics`.

mod driver;
mod metrics;
mod replies;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use headroom_protocol::headers as names;
use headroom_protocol::openai::{parse_inference_body, Api};
use headroom_protocol::tokens::prefix_block_hashes;
use serde_json::json;
use tokio::sync::mpsc;

use crate::engine::NewRequest;
use crate::profile::Profile;
use driver::Command;
use metrics::Telemetry;
use replies::{openai_error, stream_reply, whole_reply, Reply};

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

struct Shared {
    config: ServerConfig,
    served_by: HeaderValue,
    commands: mpsc::UnboundedSender<Command>,
    telemetry: Arc<Telemetry>,
    next_id: AtomicU64,
    /// What `/metrics` does: a [`MetricsFault`] (tests make a server's scrape fail).
    metrics_fault: AtomicU8,
    /// What inference requests meet: a [`CompletionsFault`].
    completions_fault: AtomicU8,
    /// Inference requests the fault answered (failed or held).
    faulted: AtomicU64,
}

/// How `/metrics` misbehaves, set by `PUT /fault/metrics` with `ok`, `hang` or `garbage`:
/// the end-to-end tests' way to give the predictor a server whose metrics fail while its
/// completions work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MetricsFault {
    Ok = 0,
    /// Never answers (the scraper's timeout must cut it).
    Hang = 1,
    /// Answers 200 with bytes that are not the Prometheus text format.
    Garbage = 2,
}

/// How inference requests misbehave, set by `PUT /fault/completions` with `ok`, `fail` or
/// `hang` (`GET` says the mode and how many requests it met): the end-to-end tests' way to
/// give the gateway a server that fails while its metrics look idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CompletionsFault {
    Ok = 0,
    /// Answers `500` at once, as a server whose engine died behind a live API server does.
    Fail = 1,
    /// Never answers.
    Hang = 2,
}

impl CompletionsFault {
    const ALL: [(CompletionsFault, &'static str); 3] =
        [(CompletionsFault::Ok, "ok"), (CompletionsFault::Fail, "fail"), (CompletionsFault::Hang, "hang")];

    fn name(self) -> &'static str {
        Self::ALL.iter().find(|(f, _)| *f == self).map_or("ok", |(_, n)| n)
    }

    fn from_u8(v: u8) -> CompletionsFault {
        Self::ALL.iter().map(|(f, _)| *f).find(|f| *f as u8 == v).unwrap_or(CompletionsFault::Ok)
    }
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
        telemetry: Arc::new(Telemetry::new()),
        next_id: AtomicU64::new(1),
        metrics_fault: AtomicU8::new(MetricsFault::Ok as u8),
        completions_fault: AtomicU8::new(CompletionsFault::Ok as u8),
        faulted: AtomicU64::new(0),
    });
    let engine = tokio::spawn(driver::drive(
        shared.config.profile.clone(),
        shared.config.time_scale,
        shared.telemetry.clone(),
        rx,
    ));
    let served_by = shared.served_by.clone();
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "" }))
        .route("/metrics", get(metrics))
        .route("/fault/metrics", axum::routing::put(set_metrics_fault))
        .route("/fault/completions", get(completions_fault).put(set_completions_fault))
        .with_state(shared)
        .layer(axum::middleware::map_response(move |mut res: Response| {
            let served_by = served_by.clone();
            async move {
                res.headers_mut().insert(names::SERVED_BY, served_by);
                res
            }
        }));
    // Each token is its own small write: without TCP_NODELAY, Nagle's algorithm holds a
    // stream's next write until the client acknowledges the last, and a client delaying its
    // acknowledgements (on a reused connection) saw the first token ~40 ms late. vLLM's
    // server (uvicorn) sets it too.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set: {e}");
        }
    });
    let result = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    engine.abort();
    result.map_err(Into::into)
}

async fn completions(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.telemetry.count_leaked_hints(&headers);
    generate(shared, &body, Api::Completions).await
}

async fn chat_completions(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.telemetry.count_leaked_hints(&headers);
    generate(shared, &body, Api::Chat).await
}

async fn responses(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.telemetry.count_leaked_hints(&headers);
    generate(shared, &body, Api::Responses).await
}

async fn generate(shared: Arc<Shared>, raw: &[u8], api: Api) -> Response {
    match CompletionsFault::from_u8(shared.completions_fault.load(Ordering::Relaxed)) {
        CompletionsFault::Ok => {}
        CompletionsFault::Fail => {
            shared.faulted.fetch_add(1, Ordering::Relaxed);
            return openai_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError", None, "engine dead");
        }
        CompletionsFault::Hang => {
            shared.faulted.fetch_add(1, Ordering::Relaxed);
            std::future::pending::<()>().await;
        }
    }
    let body = match parse_inference_body(raw, api) {
        Ok(b) => b,
        Err(e) => return openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", Some(&e.field), &e.message),
    };
    if body.model != shared.config.model {
        let message = format!("The model `{}` does not exist.", body.model);
        return openai_error(StatusCode::NOT_FOUND, "NotFoundError", Some("model"), &message);
    }
    let max_tokens = body.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let limit = shared.config.profile.max_model_len;
    // The simulated engine counts text with the shared approximation, as its clients do.
    let prompt_tokens = body.approximate_prompt_tokens();
    if u64::from(prompt_tokens) + u64::from(max_tokens) > u64::from(limit) {
        let message = format!(
            "This model's maximum context length is {limit} tokens; the prompt ({prompt_tokens}) plus max_tokens ({max_tokens}) exceed it."
        );
        return openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", Some("max_tokens"), &message);
    }
    let scale = shared.config.time_scale;
    let overhead = Duration::from_secs_f64(shared.config.profile.api_overhead_ms / 1000.0 / scale);
    driver::sleep_until(tokio::time::Instant::now() + overhead).await;
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel();
    let max_blocks = shared.config.profile.max_model_len as usize;
    let block_hashes = prefix_block_hashes(&body.prompt_text, max_blocks);
    let request = NewRequest { id, prompt_tokens, max_tokens, block_hashes };
    if shared.commands.send(Command::Submit(request, tx)).is_err() {
        return openai_error(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", None, "engine stopped");
    }
    let reply = Reply { id: format!("cmpl-{id}"), model: body.model.clone(), api, prompt_tokens };
    if body.stream {
        stream_reply(reply, body, rx)
    } else {
        whole_reply(reply, rx).await
    }
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let body = json!({"object": "list", "data": [{"id": shared.config.model, "object": "model", "owned_by": "headroom-sim",
        "max_model_len": shared.config.profile.max_model_len}]});
    axum::Json(body).into_response()
}

async fn set_metrics_fault(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let fault = match body.as_ref() {
        b"ok" => MetricsFault::Ok,
        b"hang" => MetricsFault::Hang,
        b"garbage" => MetricsFault::Garbage,
        _ => {
            return openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", Some("body"), "ok, hang or garbage")
        }
    };
    shared.metrics_fault.store(fault as u8, Ordering::Relaxed);
    StatusCode::NO_CONTENT.into_response()
}

async fn set_completions_fault(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let Some((fault, _)) = CompletionsFault::ALL.iter().find(|(_, name)| name.as_bytes() == body.as_ref()) else {
        return openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", Some("body"), "ok, fail or hang");
    };
    shared.completions_fault.store(*fault as u8, Ordering::Relaxed);
    StatusCode::NO_CONTENT.into_response()
}

async fn completions_fault(State(shared): State<Arc<Shared>>) -> Response {
    let mode = CompletionsFault::from_u8(shared.completions_fault.load(Ordering::Relaxed));
    axum::Json(json!({"mode": mode.name(), "faulted": shared.faulted.load(Ordering::Relaxed)})).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match shared.metrics_fault.load(Ordering::Relaxed) {
        x if x == MetricsFault::Hang as u8 => std::future::pending::<()>().await,
        x if x == MetricsFault::Garbage as u8 => {
            let body: &'static [u8] = b"\xff\xfe{vllm:num_requests_running 12 ]] \x00 NaNNaN\nnot prometheus at all";
            return ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response();
        }
        _ => {}
    }
    let body = shared.telemetry.render(&shared.config.model);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}
