//! The OpenAI-shaped bodies a simulated server answers with: completion, chat and responses
//! events for a stream, a whole body otherwise, errors as OpenAI writes them.

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use headroom_protocol::openai::{Api, InferenceBody};
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
    pub api: Api,
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

    /// A responses body's usage, as that API names the counts.
    fn responses_usage(&self, output: u32, cached: u32) -> serde_json::Value {
        json!({
            "input_tokens": self.prompt_tokens,
            "output_tokens": output,
            "total_tokens": self.prompt_tokens + output,
            "input_tokens_details": {"cached_tokens": cached},
        })
    }

    /// A whole responses object: `status` and, once done, its text and usage.
    fn response(&self, status: &str, text: &str, usage: Option<serde_json::Value>) -> serde_json::Value {
        let output = if text.is_empty() {
            json!([])
        } else {
            json!([{"type": "message", "role": "assistant", "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": []}]}])
        };
        json!({"id": self.id, "object": "response", "model": self.model, "status": status, "output": output, "usage": usage})
    }

    fn chunk(&self, text: Option<&str>, finish: Option<&str>) -> serde_json::Value {
        let chat = self.api == Api::Chat;
        let choice = if chat {
            json!({"index": 0, "delta": text.map_or(json!({}), |t| json!({"content": t})), "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish})
        };
        let object = if chat { "chat.completion.chunk" } else { "text_completion" };
        json!({"id": self.id, "object": object, "model": self.model, "choices": [choice]})
    }
}

/// A streamed responses reply: `response.created`, a text delta per token, then
/// `response.completed` (`incomplete`: it stopped at its token limit) with the usage.
fn stream_responses(reply: Reply, mut rx: mpsc::UnboundedReceiver<Token>) -> Response {
    let stream = async_stream(move |tx: mpsc::Sender<Result<Bytes, std::io::Error>>| async move {
        let event = |v: serde_json::Value| {
            let kind = v["type"].as_str().unwrap_or("").to_string();
            Ok::<_, std::io::Error>(Bytes::from(format!("event: {kind}\ndata: {v}\n\n")))
        };
        let created = json!({"type": "response.created", "response": reply.response("in_progress", "", None)});
        if tx.send(event(created)).await.is_err() {
            return;
        }
        let (mut generated, mut cached) = (0, 0);
        while let Some(token) = rx.recv().await {
            (generated, cached) = (token.index, token.cached_tokens);
            let delta = json!({"type": "response.output_text.delta", "item_id": format!("msg-{}", reply.id),
                "output_index": 0, "content_index": 0, "delta": TOKEN_TEXT});
            if tx.send(event(delta)).await.is_err() {
                return; // client gone: dropping rx aborts the request in the engine
            }
            if token.last {
                break;
            }
        }
        let text = TOKEN_TEXT.repeat(generated as usize);
        let usage = reply.responses_usage(generated, cached);
        let done = json!({"type": "response.completed", "response": reply.response("incomplete", &text, Some(usage))});
        let _ = tx.send(event(done)).await;
    });
    event_stream(stream)
}

fn event_stream(stream: tokio_stream::wrappers::ReceiverStream<Result<Bytes, std::io::Error>>) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A streamed (SSE) reply: a chunk per token, then usage if asked, then `[DONE]`.
pub fn stream_reply(reply: Reply, body: InferenceBody, mut rx: mpsc::UnboundedReceiver<Token>) -> Response {
    if reply.api == Api::Responses {
        return stream_responses(reply, rx);
    }
    let include_usage = body.include_usage;
    let chat = reply.api == Api::Chat;
    let stream = async_stream(move |tx: mpsc::Sender<Result<Bytes, std::io::Error>>| async move {
        let event = |v: serde_json::Value| Ok::<_, std::io::Error>(Bytes::from(format!("data: {v}\n\n")));
        if chat {
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
            let usage = json!({"id": reply.id, "object": if chat { "chat.completion.chunk" } else { "text_completion" },
                "model": reply.model, "choices": [], "usage": reply.usage(generated, cached)});
            let _ = tx.send(event(usage)).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    event_stream(stream)
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
    if reply.api == Api::Responses {
        let usage = reply.responses_usage(generated, cached);
        return axum::Json(reply.response("incomplete", &text, Some(usage))).into_response();
    }
    let (object, choice) = if reply.api == Api::Chat {
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
