//! The parts of OpenAI completions / chat / responses request bodies headroom reads.
//!
//! The filter and the simulated model server both parse bodies here, so they
//! agree on the prompt text and its size. The parser counts no tokens: text is measured
//! in bytes, and each reader turns bytes into tokens once, at its own ratio (the filter at
//! the one it learned for the model, the simulator at the shared approximation).

use serde::Deserialize;
use serde_json::Value;

/// What headroom needs from an inference request body.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceBody {
    pub model: String,
    /// The prompt as one string: the `prompt` of a completion, or each chat
    /// message rendered as `role: content\n`.
    pub prompt_text: String,
    /// How long the prompts are, in the unit the body gives them.
    pub prompt_size: PromptSize,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
    /// The sequences the engine will run for it: each prompt of a list (or of a batch of
    /// token-id lists) times `max(n, best_of)`. 1 for one prompt and one answer.
    pub sequences: u32,
}

impl InferenceBody {
    /// All prompts' tokens at the shared approximation: what the simulated engine counts.
    pub fn approximate_prompt_tokens(&self) -> u32 {
        self.prompt_size.approximate_tokens().0
    }
}

/// The size of a request's prompts: all of them together, and the longest alone (what must
/// fit a server's context with `max_tokens`: vLLM judges each prompt of a list alone; for
/// one prompt, the two are equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptSize {
    /// Given as token ids: the model's own count.
    Tokens { total: u32, longest: u32 },
    /// Given as text: UTF-8 bytes (a list's prompts joined one per line).
    Bytes { total: u64, longest: u64 },
}

impl PromptSize {
    /// `(total, longest)` in tokens: text converted by `tokens_of_bytes`, token ids as given.
    pub fn tokens(self, tokens_of_bytes: impl Fn(u64) -> u32) -> (u32, u32) {
        match self {
            PromptSize::Tokens { total, longest } => (total, longest),
            PromptSize::Bytes { total, longest } => (tokens_of_bytes(total), tokens_of_bytes(longest)),
        }
    }

    /// `(total, longest)` in tokens at the shared approximation
    /// ([`crate::tokens::tokens_of_bytes`]): how the simulated engine counts them.
    pub fn approximate_tokens(self) -> (u32, u32) {
        self.tokens(crate::tokens::tokens_of_bytes)
    }
}

/// Which OpenAI API a request is for, by its path: each writes its prompt its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`: `prompt`.
    Completions,
    /// `/v1/chat/completions`: `messages`.
    Chat,
    /// `/v1/responses`: `input` (and `instructions`), `max_output_tokens`.
    Responses,
}

impl Api {
    /// The API of a request path (its query left out); completions for any path not
    /// ending like chat's or responses' (an inference path configured by the operator).
    pub fn of_path(path: &str) -> Api {
        let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Api::Chat
        } else if path.ends_with("/responses") {
            Api::Responses
        } else {
            Api::Completions
        }
    }
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
    input: Option<Value>,
    instructions: Option<Value>,
    max_output_tokens: Option<Value>,
    n: Option<Value>,
    best_of: Option<Value>,
}

/// Parses the body of a request for `api`.
pub fn parse_inference_body(bytes: &[u8], api: Api) -> Result<InferenceBody, BodyError> {
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
    let prompts = match api {
        Api::Completions => render_prompt(raw.prompt.as_ref())?,
        Api::Chat => Prompts::text(render_messages(raw.messages.as_ref())?),
        Api::Responses => Prompts::text(render_input(raw.instructions.as_ref(), raw.input.as_ref())?),
    };
    let Prompts { text: prompt_text, count, size: prompt_size } = prompts;
    // Every answer the engine generates is a sequence it runs: `n` of them, or `best_of`
    // (of which it returns `n`), for each prompt of a list. The responses API has neither.
    let choices = |v: &Option<Value>, field: &str| match v {
        Some(v) if api != Api::Responses && !v.is_null() => positive_u32(v, field),
        _ => Ok(1),
    };
    let n = choices(&raw.n, "n")?;
    let best_of = if api == Api::Completions { choices(&raw.best_of, "best_of")? } else { 1 };
    let sequences = count.saturating_mul(n.max(best_of));
    let stream = match raw.stream {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(bad("stream", "must be a boolean")),
    };
    // A responses stream always ends with its usage (`response.completed`).
    let include_usage = api == Api::Responses;
    let include_usage = include_usage
        || match raw.stream_options {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(bad("stream_options.include_usage", "must be a boolean")),
            },
            Some(_) => return Err(bad("stream_options", "must be an object")),
        };
    let max_tokens = match (raw.max_output_tokens, raw.max_completion_tokens, raw.max_tokens) {
        (Some(v), _, _) if api == Api::Responses && !v.is_null() => Some(positive_u32(&v, "max_output_tokens")?),
        (_, Some(v), _) if api != Api::Responses && !v.is_null() => Some(positive_u32(&v, "max_completion_tokens")?),
        (_, _, Some(v)) if api != Api::Responses && !v.is_null() => Some(positive_u32(&v, "max_tokens")?),
        _ => None,
    };
    Ok(InferenceBody { model, prompt_text, prompt_size, stream, include_usage, max_tokens, sequences })
}

/// A request's prompts as headroom reads them.
struct Prompts {
    /// All of them as one text (a list's prompts one per line, token ids as numbers).
    text: String,
    /// How many prompts the engine runs (a list's length; 1 for one prompt).
    count: u32,
    size: PromptSize,
}

impl Prompts {
    fn text(text: String) -> Prompts {
        let bytes = text.len() as u64;
        Prompts { text, count: 1, size: PromptSize::Bytes { total: bytes, longest: bytes } }
    }
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

/// Completion prompts: a string, a list of strings, token ids, or a list of token-id lists
/// (a batch, as vLLM takes it: each list one prompt).
fn render_prompt(prompt: Option<&Value>) -> Result<Prompts, BodyError> {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let ids = |items: &[Value]| items.iter().filter_map(Value::as_u64).map(|t| t.to_string()).collect::<Vec<_>>();
    let refused = || {
        bad(
            "prompt",
            "must be a string, a list of strings, a list of token ids or a list of token-id lists, none empty",
        )
    };
    match prompt {
        Some(Value::String(s)) => Ok(Prompts::text(s.clone())),
        Some(Value::Array(items)) if items.is_empty() => Err(refused()),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            let longest = items.iter().filter_map(Value::as_str).map(|p| p.len() as u64).max().unwrap_or(0);
            let text = items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n");
            let size = PromptSize::Bytes { total: text.len() as u64, longest };
            Ok(Prompts { text, count: count(items.len()), size })
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            let n = count(items.len());
            Ok(Prompts { text: ids(items).join(" "), count: 1, size: PromptSize::Tokens { total: n, longest: n } })
        }
        // Otherwise a batch: every item a list of token ids, none empty.
        Some(Value::Array(items)) => {
            let lists = items
                .iter()
                .map(|l| l.as_array().filter(|ids| !ids.is_empty() && ids.iter().all(Value::is_u64)))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(refused)?;
            let total = count(lists.iter().map(|l| l.len()).sum());
            let longest = lists.iter().map(|l| count(l.len())).max().unwrap_or(0);
            let text = lists.iter().map(|l| ids(l).join(" ")).collect::<Vec<_>>().join("\n");
            Ok(Prompts { text, count: count(lists.len()), size: PromptSize::Tokens { total, longest } })
        }
        Some(_) => Err(refused()),
        None => Err(bad("prompt", "is required")),
    }
}

/// A responses request's prompt: its `instructions` (the system prompt) then its `input`,
/// a string or a list of items; a message item (`role` and `content`) is rendered as a chat
/// message is, any other item (a tool call's output, ...) by the text it carries.
fn render_input(instructions: Option<&Value>, input: Option<&Value>) -> Result<String, BodyError> {
    let mut text = match instructions {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => format!("system: {s}\n"),
        Some(_) => return Err(bad("instructions", "must be a string")),
    };
    match input {
        Some(Value::String(s)) => text.push_str(s),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                if !item.is_object() {
                    return Err(bad(&format!("input[{i}]"), "must be an object"));
                }
                if let Some(role) = item.get("role") {
                    let role = role.as_str().ok_or_else(|| bad(&format!("input[{i}].role"), "must be a string"))?;
                    text.push_str(role);
                    text.push_str(": ");
                    push_content(&mut text, item.get("content"), &format!("input[{i}].content"))?;
                } else {
                    for key in ["text", "output", "arguments"] {
                        if let Some(t) = item.get(key).and_then(Value::as_str) {
                            text.push_str(t);
                        }
                    }
                }
                text.push('\n');
            }
        }
        Some(Value::Array(_)) => return Err(bad("input", "must not be empty")),
        Some(_) => return Err(bad("input", "must be a string or a list of items")),
        None => return Err(bad("input", "is required")),
    }
    Ok(text)
}

/// A message's content: a string, or a list of parts whose `text` fields are joined.
fn push_content(text: &mut String, content: Option<&Value>, field: &str) -> Result<(), BodyError> {
    match content {
        Some(Value::String(s)) => text.push_str(s),
        Some(Value::Array(parts)) => {
            for part in parts {
                if let Some(t) = part.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
        }
        None | Some(Value::Null) => {}
        Some(_) => return Err(bad(field, "must be a string or a list of parts")),
    }
    Ok(())
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
        push_content(&mut text, message.get("content"), &format!("messages[{i}].content"))?;
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
            Api::Completions,
        )
        .unwrap();
        assert_eq!(b.model, "m");
        assert_eq!(b.prompt_size, PromptSize::Bytes { total: 8, longest: 8 });
        assert_eq!(b.prompt_size.approximate_tokens(), (2, 2));
        assert_eq!(b.prompt_size.tokens(|bytes| bytes as u32), (8, 8), "text is converted at the reader's ratio");
        assert!(b.stream && b.include_usage);
        assert_eq!(b.max_tokens, Some(7));
    }

    #[test]
    fn chat_body_renders_roles() {
        let b = parse_inference_body(
            br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":3,"max_tokens":9}"#,
            Api::Chat,
        )
        .unwrap();
        assert_eq!(b.prompt_text, "system: be brief\nuser: hi\n");
        assert_eq!(b.max_tokens, Some(3));
        assert!(!b.stream);
    }

    #[test]
    fn responses_body_renders_instructions_and_input_items() {
        let b = parse_inference_body(
            br#"{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call_output","call_id":"c","output":"42"}],"max_output_tokens":5,"max_tokens":9,"stream":true}"#,
            Api::Responses,
        )
        .unwrap();
        assert_eq!(b.prompt_text, "system: be brief\nuser: hi\n42\n");
        assert_eq!(b.max_tokens, Some(5), "max_output_tokens, not a field of the other APIs");
        assert!(b.stream && b.include_usage, "a responses stream always ends with its usage");
        let plain = parse_inference_body(br#"{"model":"m","input":"hello there"}"#, Api::Responses).unwrap();
        assert_eq!((plain.prompt_text.as_str(), plain.max_tokens), ("hello there", None));
    }

    #[test]
    fn the_api_comes_from_the_path() {
        assert_eq!(Api::of_path("/v1/completions"), Api::Completions);
        assert_eq!(Api::of_path("/v1/chat/completions?x=1"), Api::Chat);
        assert_eq!(Api::of_path("/v1/responses"), Api::Responses);
        assert_eq!(Api::of_path("/v1/responses/"), Api::Responses);
        assert_eq!(Api::of_path("/openai/v1/generate"), Api::Completions);
    }

    #[test]
    fn token_id_prompts_count_exactly() {
        let b = parse_inference_body(br#"{"model":"m","prompt":[1,2,3,4,5]}"#, Api::Completions).unwrap();
        assert_eq!(b.prompt_size, PromptSize::Tokens { total: 5, longest: 5 });
        assert_eq!(b.prompt_size.tokens(|_| 0), (5, 5), "the model's own count, whatever the ratio");
    }

    /// vLLM runs every answer of `n`, every candidate of `best_of` and every prompt of a
    /// list or batch as its own sequence: booked as one, they were load nobody saw.
    #[test]
    fn every_sequence_the_engine_runs_is_counted() {
        let parse = |body: &str, api| parse_inference_body(body.as_bytes(), api).unwrap();
        let one = parse(r#"{"model":"m","prompt":"abcdefgh"}"#, Api::Completions);
        assert_eq!((one.sequences, one.prompt_size.approximate_tokens()), (1, (2, 2)));
        let n = parse(r#"{"model":"m","prompt":"x","n":4,"best_of":6}"#, Api::Completions);
        assert_eq!(n.sequences, 6, "best_of candidates run, n of them return");
        let chat = parse(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":3}"#, Api::Chat);
        assert_eq!(chat.sequences, 3);
        let list = parse(r#"{"model":"m","prompt":["abcdefgh","abcdefghabcdefgh","a"],"n":2}"#, Api::Completions);
        // 8 + 16 + 1 bytes and the two newlines that join them; the longest alone 16.
        assert_eq!((list.sequences, list.prompt_size), (6, PromptSize::Bytes { total: 27, longest: 16 }));
        assert_eq!(list.prompt_size.approximate_tokens(), (7, 4));
        let batch = parse(r#"{"model":"m","prompt":[[1,2],[3],[4,5,6]]}"#, Api::Completions);
        assert_eq!((batch.sequences, batch.prompt_size), (3, PromptSize::Tokens { total: 6, longest: 3 }));
        assert_eq!(batch.prompt_text, "1 2\n3\n4 5 6");
        let responses = parse(r#"{"model":"m","input":"x","n":5}"#, Api::Responses);
        assert_eq!(responses.sequences, 1, "the responses API has no n");
    }

    #[test]
    fn errors_name_the_field() {
        let (c, chat, r) = (Api::Completions, Api::Chat, Api::Responses);
        let cases: &[(&[u8], Api, &str)] = &[
            (b"not json", c, "body"),
            (b"[1,2]", c, "body"),
            (br#"{"prompt":"x"}"#, c, "model"),
            (br#"{"model":"m"}"#, c, "prompt"),
            (br#"{"model":"m","prompt":{}}"#, c, "prompt"),
            (br#"{"model":"m","prompt":[]}"#, c, "prompt"),
            (br#"{"model":"m","prompt":[[1],[]]}"#, c, "prompt"),
            (br#"{"model":"m","prompt":[[1],"x"]}"#, c, "prompt"),
            (br#"{"model":"m","prompt":"x","n":0}"#, c, "n"),
            (br#"{"model":"m","prompt":"x","best_of":"2"}"#, c, "best_of"),
            (br#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":-1}"#, chat, "n"),
            (br#"{"model":"m","prompt":"x","stream":"yes"}"#, c, "stream"),
            (br#"{"model":"m","prompt":"x","max_tokens":0}"#, c, "max_tokens"),
            (br#"{"model":"m","prompt":"x","max_tokens":-3}"#, c, "max_tokens"),
            (br#"{"model":"m","messages":[]}"#, chat, "messages"),
            (br#"{"model":"m","messages":[{"content":"x"}]}"#, chat, "messages[0].role"),
            (br#"{"model":"m","prompt":"x","stream_options":{"include_usage":1}}"#, c, "stream_options.include_usage"),
            (br#"{"model":"m"}"#, r, "input"),
            (br#"{"model":"m","input":[]}"#, r, "input"),
            (br#"{"model":"m","input":7}"#, r, "input"),
            (br#"{"model":"m","input":["x"]}"#, r, "input[0]"),
            (br#"{"model":"m","input":[{"role":3,"content":"x"}]}"#, r, "input[0].role"),
            (br#"{"model":"m","input":[{"role":"user","content":3}]}"#, r, "input[0].content"),
            (br#"{"model":"m","input":"x","instructions":["a"]}"#, r, "instructions"),
            (br#"{"model":"m","input":"x","max_output_tokens":0}"#, r, "max_output_tokens"),
        ];
        for (body, api, field) in cases {
            let err = parse_inference_body(body, *api).unwrap_err();
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
