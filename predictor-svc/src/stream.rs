//! The predict stream (`headroom_protocol::stream`): a gateway worker's coalesced predict
//! batches as messages on one gRPC stream over HTTP/2, each answered in order, instead of
//! one HTTP call per batch. Same port as the HTTP API, behind the same token.
//!
//! Each stream gets a task that reads the messages as they arrive and answers each before
//! reading the next, as `/v1/predict/batch` would (`api::answer_batch`). A batch refused for
//! its content is answered in the stream (its status and error body) and the stream goes
//! on; broken framing ends it with a gRPC status, as does the service shutting down.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use headroom_predictor_core::callers::Caller;
use headroom_protocol::stream::{self as wire, status, Deframer, StreamAnswer};
use headroom_protocol::{codec, Format, PredictBatch};
use http_body::Frame;
use http_body_util::StreamBody;
use tokio::sync::mpsc;

use crate::api::{answer_batch, ApiError};
use crate::state::AppState;

/// Answers waiting to be written before the task waits for the gateway to read them.
const ANSWERS_BUFFERED: usize = 8;

/// `POST /headroom.v1.Predictor/PredictStream`: answers at once with the stream's headers;
/// the answers follow as the messages arrive.
pub async fn predict_stream(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.starts_with(wire::CONTENT_TYPE) {
        let message = format!("must be {}, got {content_type:?}", wire::CONTENT_TYPE);
        return ApiError::field(StatusCode::UNSUPPORTED_MEDIA_TYPE, "content-type", message).into_response();
    }
    let (tx, rx) = mpsc::channel(ANSWERS_BUFFERED);
    tokio::spawn(serve(state, caller, body, tx));
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (Ok::<_, Infallible>(frame), rx))
    });
    let mut response = Body::new(StreamBody::new(frames)).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(wire::CONTENT_TYPE));
    response
}

/// Reads the stream's messages and answers each; ends the stream with its gRPC status.
async fn serve(state: Arc<AppState>, caller: Caller, body: Body, tx: mpsc::Sender<Frame<Bytes>>) {
    let mut closing = state.closing.subscribe();
    let mut chunks = body.into_data_stream();
    let mut deframer = Deframer::default();
    let (code, message) = 'stream: loop {
        let chunk = tokio::select! {
            chunk = chunks.next() => chunk,
            _ = closing.wait_for(|c| *c) => break (status::UNAVAILABLE, "the predictor is shutting down".to_string()),
            // The gateway reset the stream: nobody is left to answer.
            _ = tx.closed() => return,
        };
        match chunk {
            None if deframer.is_empty() => break (status::OK, String::new()),
            None => break (status::INVALID_ARGUMENT, "the stream ended inside a message".to_string()),
            Some(Err(_)) => return,
            Some(Ok(bytes)) => deframer.push(&bytes),
        }
        loop {
            match deframer.next_message() {
                Ok(Some(message)) => {
                    let answer = answer(&state, &caller, &message);
                    let frame = match codec::encode(Format::MsgPack, &answer) {
                        Ok(bytes) => Frame::data(Bytes::from(wire::frame(&bytes))),
                        Err(e) => break 'stream (status::INVALID_ARGUMENT, e.message),
                    };
                    if tx.send(frame).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => break 'stream (e.status, e.message),
            }
        }
    };
    let _ = tx.send(Frame::trailers(trailers(code, &message))).await;
}

/// The answer to one message: what `/v1/predict/batch` would answer for it as a body.
fn answer(state: &AppState, caller: &Caller, message: &[u8]) -> StreamAnswer {
    let started = Instant::now();
    let answered = codec::decode::<PredictBatch>(Format::MsgPack, message)
        .map_err(ApiError::from)
        .and_then(|batch| answer_batch(state, caller, batch, wire::PATH, started));
    match answered {
        Ok(batch) => StreamAnswer { status: StatusCode::OK.as_u16(), answers: batch.answers, error: None },
        Err(e) => StreamAnswer { status: e.status.as_u16(), answers: Vec::new(), error: Some(e.body) },
    }
}

/// `grpc-status` and, when there is one, `grpc-message` (visible ASCII only, as the header allows).
fn trailers(code: u32, message: &str) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in wire::status_trailers(code, message) {
        if let Ok(value) = HeaderValue::from_str(&value) {
            map.insert(name, value);
        }
    }
    map
}
