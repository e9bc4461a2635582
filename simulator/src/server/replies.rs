//! The OpenAI-shaped bodies a simulated server answers with: completion and chat
//! chunks for a stream, a whole body otherwise, errors as OpenAI writes them.

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use headroom_protocol::openai::InferenceBody;
use serde_json::json;
use tokio::sync::mpsc;

use crate::engine::Token;

/// An OpenAI-style error response.
pub fn openai_error(status: StatusCode, kind: &str, param: Option<&str>, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// What every chunk or body of one reply shares.
pub struct Reply {
    pub id: String,
    pub model: String,
    pub chat: bool,
    pub prompt_tokens: u32,
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

/// A streamed (SSE) reply: a chunk per token, then usage if asked, then `[DONE]`.
pub fn stream_reply(reply: Reply, body: InferenceBody, mut rx: mpsc::UnboundedReceiver<Token>) -> Response {
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

/// A whole reply once the last token is out.
pub async fn whole_reply(reply: Reply, mut rx: mpsc::UnboundedReceiver<Token>) -> Response {
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
