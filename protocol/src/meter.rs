//! Measuring TTFT / TPOT from a response body as it streams past.
//!
//! Streaming (SSE): the first event carrying generated text marks the first
//! token; the last such event the last token. The token count comes from the
//! `usage` block (`completion_tokens`), not from counting events, because one
//! event may carry several tokens. Without a usage block the count of
//! text-bearing events stands in. Non-streaming: the body is kept (up to a cap)
//! and its `usage` read at the end; its first token is seen with the body.

use serde_json::Value;

const NS_PER_MS: f64 = 1_000_000.0;

/// Latencies and counts measured for one response.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measurement {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    pub output_tokens: Option<u32>,
    pub cached_tokens: Option<u32>,
    /// The prompt as the model counted it (`usage.prompt_tokens`): what the filter learns
    /// each model's bytes per token from (`filter/core`'s `token_count`).
    pub prompt_tokens: Option<u32>,
    /// The response reached its end: `data: [DONE]` for a stream, a whole JSON body
    /// otherwise. A response cut off (the server or its connection failed mid-body) is not
    /// complete, and its latencies describe a failure, not the server.
    pub complete: bool,
}

/// Watches one response body; feed it chunks with their arrival times.
#[derive(Debug)]
pub struct ResponseMeter {
    streaming: bool,
    started_ns: u64,
    max_buffer: usize,
    first_token_ns: Option<u64>,
    last_token_ns: Option<u64>,
    token_events: u32,
    completion_tokens: Option<u32>,
    cached_tokens: Option<u32>,
    prompt_tokens: Option<u32>,
    buffer: Vec<u8>,
    overflowed: bool,
    saw_done: bool,
}

impl ResponseMeter {
    /// A meter for a response forwarded upstream at `started_ns`.
    /// `streaming` is true for `text/event-stream` responses.
    pub fn new(streaming: bool, started_ns: u64, max_buffer: usize) -> Self {
        ResponseMeter {
            streaming,
            started_ns,
            max_buffer,
            first_token_ns: None,
            last_token_ns: None,
            token_events: 0,
            completion_tokens: None,
            cached_tokens: None,
            prompt_tokens: None,
            buffer: Vec::new(),
            overflowed: false,
            saw_done: false,
        }
    }

    /// Takes the next body chunk, received at `now_ns`.
    pub fn on_chunk(&mut self, chunk: &[u8], now_ns: u64) {
        if self.overflowed {
            return;
        }
        if self.buffer.len() + chunk.len() > self.max_buffer {
            // An SSE event larger than the cap, or a huge JSON body: stop parsing, keep timing.
            self.overflowed = true;
            self.buffer = Vec::new();
            return;
        }
        self.buffer.extend_from_slice(chunk);
        if self.streaming {
            self.drain_events(now_ns);
        }
    }

    fn drain_events(&mut self, now_ns: u64) {
        while let Some((end, sep)) = find_event_end(&self.buffer) {
            let event: Vec<u8> = self.buffer.drain(..end + sep).take(end).collect();
            self.on_event(&event, now_ns);
        }
    }

    fn on_event(&mut self, event: &[u8], now_ns: u64) {
        let Ok(text) = std::str::from_utf8(event) else { return };
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data:") else { continue };
            let data = data.trim();
            if data == "[DONE]" {
                self.saw_done = true;
                continue;
            }
            let Ok(value) = serde_json::from_str::<Value>(data) else { continue };
            // A responses stream ends with its last event, not `[DONE]`.
            if matches!(value.get("type").and_then(Value::as_str), Some("response.completed" | "response.incomplete")) {
                self.saw_done = true;
            }
            if carries_text(&value) {
                self.first_token_ns.get_or_insert(now_ns);
                self.last_token_ns = Some(now_ns);
                self.token_events += 1;
            }
            self.read_usage(&value);
        }
    }

    /// The `usage` block of a completions or chat body or chunk, or of a responses body (or
    /// its stream's last event, under `response`), which names its counts differently.
    fn read_usage(&mut self, value: &Value) {
        let usage = value.get("usage").or_else(|| value.pointer("/response/usage"));
        let Some(usage) = usage.filter(|u| u.is_object()) else { return };
        let count = |names: [&str; 2]| names.iter().find_map(|n| usage.pointer(n).and_then(Value::as_u64));
        if let Some(n) = count(["/completion_tokens", "/output_tokens"]) {
            self.completion_tokens = u32::try_from(n).ok();
        }
        if let Some(n) = count(["/prompt_tokens", "/input_tokens"]) {
            self.prompt_tokens = u32::try_from(n).ok();
        }
        if let Some(n) = count(["/prompt_tokens_details/cached_tokens", "/input_tokens_details/cached_tokens"]) {
            self.cached_tokens = u32::try_from(n).ok();
        }
    }

    /// Time from forwarding to the first token event, once one has passed (streaming).
    pub fn ttft_ms(&self) -> Option<f64> {
        self.first_token_ns.map(|t| t.saturating_sub(self.started_ns) as f64 / NS_PER_MS)
    }

    /// Ends the response at `now_ns` and returns what was measured.
    pub fn finish(mut self, now_ns: u64) -> Measurement {
        let e2e_ms = now_ns.saturating_sub(self.started_ns) as f64 / NS_PER_MS;
        if !self.streaming {
            // A body too large to parse is taken as whole: nothing says otherwise.
            let mut complete = self.overflowed;
            if !self.overflowed {
                if let Ok(value) = serde_json::from_slice::<Value>(&self.buffer) {
                    self.read_usage(&value);
                    complete = true;
                }
            }
            return Measurement {
                ttft_ms: Some(e2e_ms),
                tpot_ms: None,
                e2e_ms,
                output_tokens: self.completion_tokens,
                cached_tokens: self.cached_tokens,
                prompt_tokens: self.prompt_tokens,
                complete,
            };
        }
        self.drain_events(now_ns);
        let ttft_ms = self.first_token_ns.map(|t| t.saturating_sub(self.started_ns) as f64 / NS_PER_MS);
        let tokens = self.completion_tokens.or((self.token_events > 0).then_some(self.token_events));
        let tpot_ms = match (self.first_token_ns, self.last_token_ns, tokens) {
            (Some(first), Some(last), Some(n)) if n >= 2 && last > first => {
                Some((last - first) as f64 / NS_PER_MS / f64::from(n - 1))
            }
            _ => None,
        };
        // An event larger than the cap stopped parsing: its end cannot be seen, so not judged.
        let complete = self.saw_done || self.overflowed;
        Measurement {
            ttft_ms,
            tpot_ms,
            e2e_ms,
            output_tokens: tokens,
            cached_tokens: self.cached_tokens,
            prompt_tokens: self.prompt_tokens,
            complete,
        }
    }
}

/// Position of the first event terminator (`\n\n` or `\r\n\r\n`) and its length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// True when a completions or chat chunk, or a responses text delta, carries generated text.
fn carries_text(chunk: &Value) -> bool {
    if chunk.get("type").and_then(Value::as_str) == Some("response.output_text.delta") {
        return chunk.get("delta").and_then(Value::as_str).is_some_and(|t| !t.is_empty());
    }
    let Some(choices) = chunk.get("choices").and_then(Value::as_array) else { return false };
    choices.iter().any(|c| {
        let text = c.get("text").or_else(|| c.pointer("/delta/content"));
        text.and_then(Value::as_str).is_some_and(|t| !t.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const MS: u64 = 1_000_000;

    fn event(text: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{text}\"}}]}}\n\n")
    }

    #[test]
    fn streaming_uses_usage_tokens_not_chunks() {
        let mut m = ResponseMeter::new(true, 0, 1 << 20);
        m.on_chunk(b"data: {\"choices\":[{\"text\":\"\"}]}\n\n", 5 * MS); // role-only chunk: no token
        m.on_chunk(event("a").as_bytes(), 100 * MS);
        // One chunk carrying several tokens, split mid-event.
        let two = event("bcd");
        m.on_chunk(&two.as_bytes()[..10], 150 * MS);
        m.on_chunk(&two.as_bytes()[10..], 160 * MS);
        m.on_chunk(event("e").as_bytes(), 200 * MS);
        m.on_chunk(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":6,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n", 201 * MS);
        let r = m.finish(210 * MS);
        assert_eq!(r.ttft_ms, Some(100.0));
        assert_eq!(r.output_tokens, Some(6));
        assert_eq!(r.cached_tokens, Some(4));
        assert_eq!(r.prompt_tokens, Some(9));
        assert_eq!(r.tpot_ms, Some(20.0)); // (200 - 100) / (6 - 1)
        assert_eq!(r.e2e_ms, 210.0);
        assert!(r.complete);
    }

    #[test]
    fn a_response_cut_off_is_not_complete() {
        // A stream whose server died after two tokens: no `[DONE]`.
        let mut m = ResponseMeter::new(true, 0, 1 << 20);
        m.on_chunk(event("a").as_bytes(), 100 * MS);
        m.on_chunk(event("b").as_bytes(), 120 * MS);
        let r = m.finish(5000 * MS);
        assert_eq!(r.ttft_ms, Some(100.0));
        assert!(!r.complete);
        // Half a JSON body.
        let mut m = ResponseMeter::new(false, 0, 1 << 20);
        m.on_chunk(br#"{"choices":[{"text":"ab"#, 300 * MS);
        assert!(!m.finish(301 * MS).complete);
        let mut m = ResponseMeter::new(false, 0, 1 << 20);
        m.on_chunk(br#"{"choices":[]}"#, 300 * MS);
        assert!(m.finish(301 * MS).complete);
    }

    #[test]
    fn chat_deltas_and_crlf_events() {
        let mut m = ResponseMeter::new(true, 10 * MS, 1 << 20);
        m.on_chunk(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n", 12 * MS);
        m.on_chunk(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\n", 30 * MS);
        m.on_chunk(b"data: {\"choices\":[{\"delta\":{\"content\":\"yo\"}}]}\r\n\r\n", 40 * MS);
        let r = m.finish(41 * MS);
        assert_eq!(r.ttft_ms, Some(20.0));
        assert_eq!(r.output_tokens, Some(2), "without usage, text events stand in");
        assert_eq!(r.tpot_ms, Some(10.0));
    }

    #[test]
    fn a_responses_stream_is_timed_by_its_text_deltas_and_ends_with_its_last_event() {
        let mut m = ResponseMeter::new(true, 0, 1 << 16);
        let event = |kind: &str, data: &str| format!("event: {kind}\ndata: {data}\n\n");
        let created = r#"{"type":"response.created","response":{"id":"r","status":"in_progress"}}"#;
        m.on_chunk(event("response.created", created).as_bytes(), 5 * MS);
        for (i, at) in [40, 50, 60].iter().enumerate() {
            let delta = format!(r#"{{"type":"response.output_text.delta","output_index":0,"delta":"t{i}"}}"#);
            m.on_chunk(event("response.output_text.delta", &delta).as_bytes(), at * MS);
        }
        assert_eq!(m.ttft_ms(), Some(40.0), "the first text, not the created event");
        let done = r#"{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":11,"output_tokens":3,"input_tokens_details":{"cached_tokens":8}}}}"#;
        m.on_chunk(event("response.completed", done).as_bytes(), 61 * MS);
        let r = m.finish(62 * MS);
        assert!(r.complete, "no [DONE] in a responses stream");
        assert_eq!((r.output_tokens, r.prompt_tokens, r.cached_tokens), (Some(3), Some(11), Some(8)));
        assert_eq!(r.tpot_ms, Some(10.0));
        // Cut off before its last event: not complete.
        let mut cut = ResponseMeter::new(true, 0, 1 << 16);
        cut.on_chunk(event("response.created", created).as_bytes(), 5 * MS);
        assert!(!cut.finish(10 * MS).complete);
    }

    #[test]
    fn a_whole_responses_body_gives_its_usage() {
        let mut m = ResponseMeter::new(false, 0, 1 << 16);
        m.on_chunk(br#"{"object":"response","status":"completed","usage":{"input_tokens":4,"output_tokens":9}}"#, MS);
        let r = m.finish(20 * MS);
        assert_eq!((r.output_tokens, r.prompt_tokens), (Some(9), Some(4)));
    }

    #[test]
    fn non_streaming_reads_usage_at_end() {
        let mut m = ResponseMeter::new(false, 0, 1 << 20);
        let body = br#"{"choices":[{"text":"abc"}],"usage":{"prompt_tokens":3,"completion_tokens":12}}"#;
        m.on_chunk(&body[..20], 300 * MS);
        m.on_chunk(&body[20..], 301 * MS);
        let r = m.finish(302 * MS);
        assert_eq!(r.output_tokens, Some(12));
        assert_eq!(r.prompt_tokens, Some(3));
        assert_eq!(r.ttft_ms, Some(302.0));
        assert_eq!(r.tpot_ms, None);
    }

    #[test]
    fn oversized_or_garbage_bodies_keep_timing() {
        let mut m = ResponseMeter::new(false, 0, 8);
        m.on_chunk(b"0123456789", MS);
        let r = m.finish(2 * MS);
        assert_eq!(r.output_tokens, None);
        assert_eq!(r.e2e_ms, 2.0);
        let mut m = ResponseMeter::new(true, 0, 1 << 20);
        m.on_chunk(b"data: {broken\n\n: comment\n\n", MS);
        assert_eq!(m.finish(2 * MS).ttft_ms, None);
    }
}
