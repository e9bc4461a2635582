//! The picker's gRPC and HTTP surface on one port (HTTP/2 cleartext and HTTP/1.1):
//! Envoy's ext_proc streams, gRPC health, and `/healthz`, `/readyz`, `/metrics`.
//!
//! Each ext_proc stream goes to one worker, in turn; its messages are handed over as they
//! are read, and the worker's answers are written back as they come. The stream ends with
//! `grpc-status` 0 when Envoy has closed its side and the worker has answered what it owed,
//! or with INVALID_ARGUMENT when a message does not decode.
//!
//! Streams are bounded ([`StreamLimits`]): how many are open at once (more are refused
//! RESOURCE_EXHAUSTED), how long one waits for Envoy's next message and how long one lives
//! (past either it ends DEADLINE_EXCEEDED and its worker forgets it). Without them a client
//! that opened requests and went quiet held a stream, and its worker's state, for ever.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use headroom_protocol::stream::{frame, status, status_trailers, Deframer, CONTENT_TYPE};
use http_body::Frame;
use http_body_util::StreamBody;
use prost::Message;
use tokio::sync::mpsc::{self, UnboundedSender};

use crate::inbox::Input;
use crate::proto::{
    HealthCheckRequest, HealthCheckResponse, ProcessingRequest, HEALTH_CHECK_PATH, PROCESS_PATH, PROCESS_SERVICE,
};
use crate::stats::Stats;

/// How many ext_proc streams the picker holds and for how long (`headroom-epp --max-streams`,
/// `--stream-idle-timeout-s`, `--stream-max-duration-s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Streams open at once; another is refused RESOURCE_EXHAUSTED (Envoy then applies
    /// `failure_mode_allow`).
    pub max_streams: usize,
    /// The longest wait for Envoy's next message on a stream. Envoy is quiet while the model
    /// server prefills, so this is as long as a gateway's own stream idle timeout.
    pub idle: Duration,
    /// The longest one stream lives: a request's whole life, its answer streamed included.
    pub total: Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        // 300 s: the shipped Envoy configs' `stream_idle_timeout`; an hour: the longest
        // request the contract knows (`limits::MAX_MS`); 10,000 streams: a picker's memory
        // of a few KB each, far past what two cores decide for at once.
        StreamLimits { max_streams: 10_000, idle: Duration::from_secs(300), total: Duration::from_secs(3600) }
    }
}

/// What the routes share.
pub struct Shared {
    pub workers: Vec<UnboundedSender<Input>>,
    pub stats: Arc<Stats>,
    pub limits: StreamLimits,
    next_worker: AtomicUsize,
    next_stream: AtomicU32,
    /// Streams open now (`StreamLimits::max_streams`).
    open: Arc<AtomicUsize>,
    /// Set on SIGTERM: health answers NOT_SERVING and `/readyz` 503, so new streams go to
    /// another replica, while the streams under way are still served.
    pub draining: Arc<AtomicBool>,
}

impl Shared {
    pub fn new(workers: Vec<UnboundedSender<Input>>, stats: Arc<Stats>, limits: StreamLimits) -> Shared {
        Shared {
            workers,
            stats,
            limits,
            next_worker: AtomicUsize::new(0),
            next_stream: AtomicU32::new(0),
            open: Arc::new(AtomicUsize::new(0)),
            draining: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// One open stream's place in [`Shared::open`], given back when its reading ends.
struct Open(Arc<AtomicUsize>);

impl Open {
    fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Open> {
        let taken = open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        taken.is_ok().then(|| Open(open.clone()))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(PROCESS_PATH, post(process))
        .route(HEALTH_CHECK_PATH, post(health_check))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(shared)
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let mut response = shared.stats.render().into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    response
}

/// A 415 naming the header, unless the request is gRPC.
fn refuse_non_grpc(headers: &HeaderMap) -> Option<Response> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type.starts_with(CONTENT_TYPE) {
        return None;
    }
    let message = format!("must be {CONTENT_TYPE}, got {content_type:?}");
    let body = headroom_protocol::ErrorBody::field("content-type", &message);
    Some((StatusCode::UNSUPPORTED_MEDIA_TYPE, axum::Json(body)).into_response())
}

/// `Process`: one stream per HTTP request Envoy processes.
async fn process(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    if let Some(refused) = refuse_non_grpc(&headers) {
        return refused;
    }
    let Some(open) = Open::take(&shared.open, shared.limits.max_streams) else {
        let message = format!("the picker holds {} streams, its most (--max-streams)", shared.limits.max_streams);
        return grpc_error(status::RESOURCE_EXHAUSTED, &message);
    };
    let n = shared.workers.len().max(1);
    let Some(worker) = shared.workers.get(shared.next_worker.fetch_add(1, Ordering::Relaxed) % n).cloned() else {
        return grpc_error(status::UNAVAILABLE, "no worker");
    };
    // 0 is the root context of every worker's VM.
    let stream = shared.next_stream.fetch_add(1, Ordering::Relaxed).wrapping_add(1).max(1);
    let (out, answers) = mpsc::unbounded_channel();
    if worker.send(Input::Open { stream, out }).is_err() {
        return grpc_error(status::UNAVAILABLE, "the picker is shutting down");
    }
    let (end_tx, end_rx) = tokio::sync::oneshot::channel::<(u32, String)>();
    tokio::spawn(read(body, (stream, open), worker, end_tx, shared.limits));
    // The worker's answers, then the trailers once it has dropped its end (the stream closed).
    let answers = futures_util::stream::unfold(answers, |mut rx| async move {
        let response = rx.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(frame(&response.encode_to_vec())))), rx))
    });
    let trailers = futures_util::stream::once(async move {
        let (code, message) = end_rx.await.unwrap_or((status::OK, String::new()));
        Ok::<_, Infallible>(Frame::trailers(trailers(code, &message)))
    });
    let mut response = Body::new(StreamBody::new(answers.chain(trailers))).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

/// Reads Envoy's messages on `stream` into the worker, within `limits`; when they end,
/// tells the worker (which drops the stream's answer channel) and says how the stream ends.
/// The stream's place among the open ones (`_open`) is given back then.
async fn read(
    body: Body,
    (stream, _open): (u32, Open),
    worker: UnboundedSender<Input>,
    end: tokio::sync::oneshot::Sender<(u32, String)>,
    limits: StreamLimits,
) {
    let mut chunks = body.into_data_stream();
    let mut deframer = Deframer::default();
    let deadline = tokio::time::Instant::now() + limits.total;
    let outcome = 'read: loop {
        let next = tokio::time::timeout(limits.idle, chunks.next());
        let next = match tokio::time::timeout_at(deadline, next).await {
            Ok(Ok(next)) => next,
            Ok(Err(_)) => {
                let why = format!("no message for {} s (--stream-idle-timeout-s)", limits.idle.as_secs());
                break (status::DEADLINE_EXCEEDED, why);
            }
            Err(_) => {
                let why = format!("open for {} s (--stream-max-duration-s)", limits.total.as_secs());
                break (status::DEADLINE_EXCEEDED, why);
            }
        };
        match next {
            None if deframer.is_empty() => break (status::OK, String::new()),
            None => break (status::INVALID_ARGUMENT, "the stream ended inside a message".to_string()),
            // Reset by Envoy: the request is over.
            Some(Err(_)) => break (status::OK, String::new()),
            Some(Ok(bytes)) => deframer.push(&bytes),
        }
        loop {
            match deframer.next_message() {
                Ok(Some(bytes)) => match ProcessingRequest::decode(bytes.as_slice()) {
                    Ok(message) => {
                        if worker.send(Input::Message { stream, message: Box::new(message) }).is_err() {
                            break 'read (status::UNAVAILABLE, "the picker is shutting down".to_string());
                        }
                    }
                    Err(e) => break 'read (status::INVALID_ARGUMENT, format!("not a ProcessingRequest: {e}")),
                },
                Ok(None) => break,
                Err(e) => break 'read (e.status, e.message),
            }
        }
    };
    let _ = worker.send(Input::Closed { stream });
    let _ = end.send(outcome);
}

/// `/readyz`: 503 while draining.
async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    if shared.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    "ok".into_response()
}

/// `grpc.health.v1.Health/Check`, by service as GIE's picker names them: `liveness` is
/// SERVING while the process runs; the server (""), `readiness` and the ext_proc service are
/// NOT_SERVING while draining.
async fn health_check(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = refuse_non_grpc(&headers) {
        return refused;
    }
    let mut deframer = Deframer::default();
    deframer.push(&body);
    let request = match deframer.next_message() {
        Ok(Some(bytes)) => HealthCheckRequest::decode(bytes.as_slice()).ok(),
        _ => None,
    };
    let Some(request) = request else {
        return grpc_error(status::INVALID_ARGUMENT, "not a HealthCheckRequest");
    };
    let draining = match request.service.as_str() {
        // Alive while it runs: a drain must not read as a hang and get the picker killed.
        LIVENESS_SERVICE => false,
        "" | READINESS_SERVICE | PROCESS_SERVICE => shared.draining.load(Ordering::SeqCst),
        other => return grpc_error(status::NOT_FOUND, &format!("unknown service {other:?}")),
    };
    let answer = HealthCheckResponse { status: if draining { NOT_SERVING } else { SERVING } };
    let frames = [
        Ok::<_, Infallible>(Frame::data(Bytes::from(frame(&answer.encode_to_vec())))),
        Ok(Frame::trailers(trailers(status::OK, ""))),
    ];
    let mut response = Body::new(StreamBody::new(futures_util::stream::iter(frames))).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: i32 = 1;
/// `...ServingStatus.NOT_SERVING`.
const NOT_SERVING: i32 = 2;
/// The health service a liveness probe names.
const LIVENESS_SERVICE: &str = "liveness";
/// The health service a readiness probe names.
const READINESS_SERVICE: &str = "readiness";

/// A gRPC error with no messages ("trailers-only").
fn grpc_error(code: u32, message: &str) -> Response {
    let mut response = Response::new(Body::empty());
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response.headers_mut().extend(trailers(code, message));
    response
}

/// `grpc-status` and, when there is one, `grpc-message` (visible ASCII only).
fn trailers(code: u32, message: &str) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in status_trailers(code, message) {
        if let Ok(value) = HeaderValue::from_str(&value) {
            map.insert(name, value);
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn shared(limits: StreamLimits) -> (Arc<Shared>, mpsc::UnboundedReceiver<Input>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Arc::new(Shared::new(vec![tx], Arc::new(Stats::default()), limits)), rx)
    }

    fn grpc() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        headers
    }

    /// A client that opened its stream and sends nothing more.
    fn quiet() -> Body {
        Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>())
    }

    /// A client that sends an empty chunk every 10 ms, for ever: never idle.
    fn chatty() -> Body {
        Body::from_stream(futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Some((Ok::<_, std::io::Error>(Bytes::new()), ()))
        }))
    }

    /// The stream's grpc-status once its worker has let it go (as a worker does on `Closed`);
    /// a stream still open after 5 s fails the test.
    async fn ended(response: Response, rx: &mut mpsc::UnboundedReceiver<Input>) -> String {
        tokio::time::timeout(Duration::from_secs(5), ended_now(response, rx)).await.expect("the stream never ended")
    }

    async fn ended_now(response: Response, rx: &mut mpsc::UnboundedReceiver<Input>) -> String {
        let Some(Input::Open { out, .. }) = rx.recv().await else { panic!("the worker was not told of the stream") };
        assert!(matches!(rx.recv().await, Some(Input::Closed { .. })), "the worker is told it ended");
        drop(out);
        let body = response.into_body().collect().await.unwrap();
        let trailers = body.trailers().cloned().unwrap_or_default();
        trailers.get("grpc-status").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    }

    const SHORT: StreamLimits =
        StreamLimits { max_streams: 10, idle: Duration::from_millis(50), total: Duration::from_secs(10) };

    #[tokio::test]
    async fn a_stream_quiet_past_the_idle_timeout_ends_and_its_worker_forgets_it() {
        let (shared, mut rx) = shared(SHORT);
        let response = process(State(shared), grpc(), quiet()).await;
        assert_eq!(ended(response, &mut rx).await, status::DEADLINE_EXCEEDED.to_string());
    }

    #[tokio::test]
    async fn a_stream_past_its_longest_life_ends_however_busy() {
        let (shared, mut rx) = shared(StreamLimits { total: Duration::from_millis(100), ..SHORT });
        let response = process(State(shared), grpc(), chatty()).await;
        assert_eq!(ended(response, &mut rx).await, status::DEADLINE_EXCEEDED.to_string());
    }

    #[tokio::test]
    async fn streams_past_the_most_at_once_are_refused_until_one_ends() {
        let (shared, mut rx) = shared(StreamLimits { max_streams: 1, ..SHORT });
        let first = process(State(shared.clone()), grpc(), quiet()).await;
        let refused = process(State(shared.clone()), grpc(), quiet()).await;
        let code = refused.headers().get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_string);
        assert_eq!(code, Some(status::RESOURCE_EXHAUSTED.to_string()));
        assert_eq!(ended(first, &mut rx).await, status::DEADLINE_EXCEEDED.to_string());
        let again = process(State(shared), grpc(), quiet()).await;
        assert_eq!(ended(again, &mut rx).await, status::DEADLINE_EXCEEDED.to_string(), "its place was given back");
    }

    /// What a health check answers for `service`, as a status number.
    async fn health(shared: &Arc<Shared>, service: &str) -> i32 {
        let request = HealthCheckRequest { service: service.to_string() };
        let body = Bytes::from(frame(&request.encode_to_vec()));
        let response = health_check(State(shared.clone()), grpc(), body).await;
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let mut deframer = Deframer::default();
        deframer.push(&bytes);
        let message = deframer.next_message().unwrap().expect("one answer");
        HealthCheckResponse::decode(message.as_slice()).unwrap().status
    }

    /// On SIGTERM the picker drains: gRPC health NOT_SERVING for the server, readiness and
    /// the ext_proc service (liveness still SERVING), `/readyz` 503, so probes and the gateway send new streams elsewhere while
    /// the streams under way are served; before it, both serve.
    #[tokio::test]
    async fn a_draining_picker_says_not_serving_and_unready() {
        let (shared, _rx) = shared(SHORT);
        let ready = |shared: Arc<Shared>| async move { readyz(State(shared)).await.status() };
        for service in ["", READINESS_SERVICE, LIVENESS_SERVICE, PROCESS_SERVICE] {
            assert_eq!(health(&shared, service).await, SERVING);
        }
        assert_eq!(ready(shared.clone()).await, StatusCode::OK);
        shared.draining.store(true, Ordering::SeqCst);
        for service in ["", READINESS_SERVICE, PROCESS_SERVICE] {
            assert_eq!(health(&shared, service).await, NOT_SERVING, "{service:?}");
        }
        assert_eq!(health(&shared, LIVENESS_SERVICE).await, SERVING, "alive while it drains");
        assert_eq!(ready(shared.clone()).await, StatusCode::SERVICE_UNAVAILABLE);
    }
}
