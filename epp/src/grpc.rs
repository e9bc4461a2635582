//! The picker's gRPC and HTTP surface on one port (HTTP/2 cleartext and HTTP/1.1):
//! Envoy's ext_proc streams, gRPC health, and `/healthz`, `/readyz`, `/metrics`.
//!
//! Each ext_proc stream goes to one worker, in turn; its messages are handed over as they
//! are read, and the worker's answers are written back as they come. The stream ends with
//! `grpc-status` 0 when Envoy has closed its side and the worker has answered what it owed,
//! or with INVALID_ARGUMENT when a message does not decode.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

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

/// What the routes share.
pub struct Shared {
    pub workers: Vec<UnboundedSender<Input>>,
    pub stats: Arc<Stats>,
    next_worker: AtomicUsize,
    next_stream: AtomicU32,
}

impl Shared {
    pub fn new(workers: Vec<UnboundedSender<Input>>, stats: Arc<Stats>) -> Shared {
        Shared { workers, stats, next_worker: AtomicUsize::new(0), next_stream: AtomicU32::new(0) }
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(PROCESS_PATH, post(process))
        .route(HEALTH_CHECK_PATH, post(health_check))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
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
    tokio::spawn(read(body, stream, worker, end_tx));
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

/// Reads Envoy's messages on `stream` into the worker; when they end, tells the worker
/// (which drops the stream's answer channel) and says how the stream ends.
async fn read(
    body: Body,
    stream: u32,
    worker: UnboundedSender<Input>,
    end: tokio::sync::oneshot::Sender<(u32, String)>,
) {
    let mut chunks = body.into_data_stream();
    let mut deframer = Deframer::default();
    let outcome = 'read: loop {
        match chunks.next().await {
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

/// `grpc.health.v1.Health/Check`: SERVING for the server ("") and the ext_proc service.
async fn health_check(headers: HeaderMap, body: Bytes) -> Response {
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
    if !request.service.is_empty() && request.service != PROCESS_SERVICE {
        return grpc_error(NOT_FOUND, &format!("unknown service {:?}", request.service));
    }
    let answer = HealthCheckResponse { status: SERVING };
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
/// gRPC's NOT_FOUND, for a health check of a service the picker does not serve.
const NOT_FOUND: u32 = 5;

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
