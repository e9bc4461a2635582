//! The parts of OpenAI completions / chat request bodies headroom reads.
//!
//! The filter and the simulated model server both parse bodies here, so they
//! agree on the prompt text and hence on its token count.

use serde::Deserialize;
use serde_json::Value;

use crate::tokens::estimate_tokens;

/// What headroom needs from an inference request body.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceBody {
    pub model: String,
    /// The prompt as one string: the `prompt` of a completion, or each chat
    /// message rendered as `role: content\n`.
    pub prompt_text: String,
    /// Prompt tokens: [`estimate_tokens`] of the text, or the length of a
    /// pre-tokenised prompt.
    pub prompt_tokens: u32,
    /// The prompt came as token ids: `prompt_tokens` is the model's own count.
    pub pretokenised: bool,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
}

/// A body headroom refuses, naming the field at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct BodyError {
    pub field: String,
    pub message: String,
}

fn bad(field: &str, message: impl Into<String>) -> BodyError {
    BodyError { field: field.into(), message: message.into() }
}

#[derive(Deserialize)]
struct RawBody {
    model: Option<Value>,
    prompt: Option<Value>,
    messages: Option<Value>,
    stream: Option<Value>,
    stream_options: Option<Value>,
    max_tokens: Option<Value>,
    max_completion_tokens: Option<Value>,
}

/// Parses a `/v1/completions` (`chat == false`) or `/v1/chat/completions` body.
pub fn parse_inference_body(bytes: &[u8], chat: bool) -> Result<InferenceBody, BodyError> {
    let raw: RawBody = match serde_json::from_slice::<Value>(bytes) {
        Ok(v @ Value::Object(_)) => serde_json::from_value(v).map_err(|e| bad("body", e.to_string()))?,
        Ok(_) => return Err(bad("body", "must be a JSON object")),
        Err(e) => return Err(bad("body", format!("not valid JSON: {e}"))),
    };
    let model = match raw.model {
        Some(Value::String(m)) if !m.is_empty() => m,
        Some(_) => return Err(bad("model", "must be a non-empty string")),
        None => return Err(bad("model", "is required")),
    };
    let (prompt_text, pretokenised) =
        if chat { (render_messages(raw.messages.as_ref())?, None) } else { render_prompt(raw.prompt.as_ref())? };
    let prompt_tokens = pretokenised.unwrap_or_else(|| estimate_tokens(&prompt_text));
    let stream = match raw.stream {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(bad("stream", "must be a boolean")),
    };
    let include_usage = match raw.stream_options {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("stream_options.include_usage", "must be a boolean")),
        },
        Some(_) => return Err(bad("stream_options", "must be an object")),
    };
    let max_tokens = match (raw.max_completion_tokens, raw.max_tokens) {
        (Some(v), _) if !v.is_null() => Some(positive_u32(&v, "max_completion_tokens")?),
        (_, Some(v)) if !v.is_null() => Some(positive_u32(&v, "max_tokens")?),
        _ => None,
    };
    Ok(InferenceBody {
        model,
        prompt_text,
        prompt_tokens,
        pretokenised: pretokenised.is_some(),
        stream,
        include_usage,
        max_tokens,
    })
}

/// What a server's `GET /v1/models` says of the model it serves first: its id, and its context
/// length where it gives one (vLLM's and the simulator's `max_model_len`), held to the
/// contract's token bound. `None` when the body lists no model with an id.
pub fn served_model(body: &[u8]) -> Option<(String, Option<u32>)> {
    let models: Value = serde_json::from_slice(body).ok()?;
    let first = models.pointer("/data/0")?;
    let id = first.get("id").and_then(Value::as_str).filter(|id| !id.is_empty())?.to_string();
    let context = first
        .get("max_model_len")
        .and_then(Value::as_u64)
        .and_then(|t| u32::try_from(t).ok())
        .filter(|t| *t > 0 && *t <= crate::limits::MAX_TOKENS);
    Some((id, context))
}

fn positive_u32(v: &Value, field: &str) -> Result<u32, BodyError> {
    v.as_u64()
        .filter(|n| *n >= 1)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(field, "must be an integer >= 1"))
}

/// Completion prompts: a string, a list of strings, or token ids.
/// Returns the text and, for token ids, their exact count.
fn render_prompt(prompt: Option<&Value>) -> Result<(String, Option<u32>), BodyError> {
    match prompt {
        Some(Value::String(s)) => Ok((s.clone(), None)),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            Ok((items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"), None))
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            let text = items.iter().filter_map(Value::as_u64).map(|t| t.to_string()).collect::<Vec<_>>().join(" ");
            Ok((text, Some(u32::try_from(items.len()).unwrap_or(u32::MAX))))
        }
        Some(_) => Err(bad("prompt", "must be a string, a list of strings or a list of token ids")),
        None => Err(bad("prompt", "is required")),
    }
}

/// Chat messages rendered as `role: content\n` each; content may be a string
/// or a list of parts whose `text` fields are joined.
fn render_messages(messages: Option<&Value>) -> Result<String, BodyError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(bad("messages", "is required and must be a list"));
    };
    if messages.is_empty() {
        return Err(bad("messages", "must not be empty"));
    }
    let mut text = String::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("messages[{i}].role"), "must be a string"))?;
        text.push_str(role);
        text.push_str(": ");
        match message.get("content") {
            Some(Value::String(s)) => text.push_str(s),
            Some(Value::Array(parts)) => {
                for part in parts {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            None | Some(Value::Null) => {}
            Some(_) => return Err(bad(&format!("messages[{i}].content"), "must be a string or a list of parts")),
        }
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_body() {
        let b = parse_inference_body(
            br#"{"model":"m","prompt":"abcdefgh","stream":true,"stream_options":{"include_usage":true},"max_tokens":7}"#,
            false,
        )
        .unwrap();
        assert_eq!(b.model, "m");
        assert_eq!(b.prompt_tokens, 2);
        assert!(b.stream && b.include_usage);
        assert_eq!(b.max_tokens, Some(7));
    }

    #[test]
    fn chat_body_renders_roles() {
        let b = parse_inference_body(
            br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":3,"max_tokens":9}"#,
            true,
        )
        .unwrap();
        assert_eq!(b.prompt_text, "system: be brief\nuser: hi\n");
        assert_eq!(b.max_tokens, Some(3));
        assert!(!b.stream);
    }

    #[test]
    fn token_id_prompts_count_exactly() {
        let b = parse_inference_body(br#"{"model":"m","prompt":[1,2,3,4,5]}"#, false).unwrap();
        assert_eq!(b.prompt_tokens, 5);
    }

    #[test]
    fn errors_name_the_field() {
        let cases: &[(&[u8], bool, &str)] = &[
            (b"not json", false, "body"),
            (b"[1,2]", false, "body"),
            (br#"{"prompt":"x"}"#, false, "model"),
            (br#"{"model":"m"}"#, false, "prompt"),
            (br#"{"model":"m","prompt":{}}"#, false, "prompt"),
            (br#"{"model":"m","prompt":"x","stream":"yes"}"#, false, "stream"),
            (br#"{"model":"m","prompt":"x","max_tokens":0}"#, false, "max_tokens"),
            (br#"{"model":"m","prompt":"x","max_tokens":-3}"#, false, "max_tokens"),
            (br#"{"model":"m","messages":[]}"#, true, "messages"),
            (br#"{"model":"m","messages":[{"content":"x"}]}"#, true, "messages[0].role"),
            (
                br#"{"model":"m","prompt":"x","stream_options":{"include_usage":1}}"#,
                false,
                "stream_options.include_usage",
            ),
        ];
        for (body, chat, field) in cases {
            let err = parse_inference_body(body, *chat).unwrap_err();
            assert_eq!(err.field, *field, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn served_model_reads_the_first_models_id_and_context() {
        let vllm = br#"{"object":"list","data":[{"id":"tiny","max_model_len":4096},{"id":"other"}]}"#;
        assert_eq!(served_model(vllm), Some(("tiny".to_string(), Some(4096))));
        assert_eq!(served_model(br#"{"data":[{"id":"m"}]}"#), Some(("m".to_string(), None)));
        assert_eq!(served_model(br#"{"data":[{"id":"m","max_model_len":0}]}"#), Some(("m".to_string(), None)));
        assert_eq!(served_model(br#"{"data":[{"id":"m","max_model_len":99999999999}]}"#), Some(("m".into(), None)));
        for bad in [&br#"{"data":[]}"#[..], br#"{"data":[{"id":""}]}"#, b"garbage"] {
            assert_eq!(served_model(bad), None);
        }
    }
}
