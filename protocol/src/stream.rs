//! The predict stream: one long-lived gRPC stream per gateway worker and predictor replica
//! that carries the worker's coalesced predict batches, instead of one HTTP call per batch.
//!
//! Why: Envoy spends about 100 us of CPU on each HTTP call the filter makes (its async
//! client sets up a stream, a request and a response) and about 40 us on proxying a whole
//! request (docs/performance.md); a message on a stream that is already open costs a frame
//! each way. gRPC because it is the one long-lived bidirectional stream proxy-wasm offers.
//!
//! Each request message is a [`crate::PredictBatch`] and each answer a [`StreamAnswer`],
//! in MessagePack as on `/v1/predict/batch`, inside gRPC's length-prefixed framing (no
//! protobuf: gRPC leaves the payload's encoding to the method). Answers come in the order
//! of the messages. A batch refused for its content is answered in the stream with the
//! status and error body the HTTP route would give, so one bad batch does not end the
//! stream; broken framing ends it with a gRPC status.

use serde::{Deserialize, Serialize};

use crate::limits::MAX_BODY_BYTES;
use crate::{ErrorBody, PredictResponse};

/// The gRPC service the predictor serves the stream under.
pub const SERVICE: &str = "headroom.v1.Predictor";
/// The stream's method.
pub const METHOD: &str = "PredictStream";
/// Its HTTP/2 path, `/<SERVICE>/<METHOD>`.
pub const PATH: &str = "/headroom.v1.Predictor/PredictStream";

/// gRPC's content type, which the stream's requests carry and its answers give.
pub const CONTENT_TYPE: &str = "application/grpc";

/// gRPC status codes the predictor and the endpoint picker end a stream with.
pub mod status {
    pub const OK: u32 = 0;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const NOT_FOUND: u32 = 5;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const UNAVAILABLE: u32 = 14;
}

/// The answer to one [`crate::PredictBatch`] message: `status` is what `/v1/predict/batch`
/// would have answered; on 200 `answers[i]` is for `requests[i]`, otherwise `error` says why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamAnswer {
    pub status: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<PredictResponse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// The trailers that end a gRPC stream with `code`: `grpc-status`, and `grpc-message` when
/// there is one (visible ASCII only, as the header allows: anything else becomes `?`).
pub fn status_trailers(code: u32, message: &str) -> Vec<(&'static str, String)> {
    let mut out = vec![("grpc-status", code.to_string())];
    let printable: String = message.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect();
    if !printable.is_empty() {
        out.push(("grpc-message", printable));
    }
    out
}

/// `message` in gRPC's framing: a zero byte (not compressed), its length as a big-endian
/// u32, the message.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Why a stream's framing cannot be read on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramingError {
    /// The gRPC status to end the stream with.
    pub status: u32,
    pub message: String,
}

/// Splits a stream's bytes, in whatever chunks they arrive, into its messages.
#[derive(Debug, Default)]
pub struct Deframer {
    buffer: Vec<u8>,
}

impl Deframer {
    /// Appends bytes that arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Whether bytes of an incomplete message are left (at the stream's end: it was cut).
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// The next whole message, `None` until one has arrived. A compressed message (no
    /// compression is negotiated) or one over the body limit is an error; the stream ends.
    pub fn next_message(&mut self) -> Result<Option<Vec<u8>>, FramingError> {
        let Some(prefix) = self.buffer.get(..5) else { return Ok(None) };
        if prefix[0] != 0 {
            return Err(FramingError {
                status: status::UNIMPLEMENTED,
                message: "compressed messages are not supported".into(),
            });
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > MAX_BODY_BYTES {
            return Err(FramingError {
                status: status::RESOURCE_EXHAUSTED,
                message: format!("a message of {len} bytes is over the limit of {MAX_BODY_BYTES}"),
            });
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        let message = self.buffer[5..5 + len].to_vec();
        self.buffer.drain(..5 + len);
        Ok(Some(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_is_the_service_and_method() {
        assert_eq!(PATH, format!("/{SERVICE}/{METHOD}"));
    }

    #[test]
    fn messages_come_out_whole_however_the_bytes_are_split() {
        let mut bytes = frame(b"first");
        bytes.extend(frame(b""));
        bytes.extend(frame(&[7u8; 300]));
        for chunk in [1, 2, 5, 6, 7, 64, bytes.len()] {
            let mut d = Deframer::default();
            let mut got = Vec::new();
            for piece in bytes.chunks(chunk) {
                d.push(piece);
                while let Some(m) = d.next_message().unwrap() {
                    got.push(m);
                }
            }
            assert_eq!(got, vec![b"first".to_vec(), Vec::new(), vec![7u8; 300]], "chunks of {chunk}");
            assert!(d.is_empty());
        }
    }

    #[test]
    fn compressed_or_oversized_messages_end_the_stream() {
        let mut d = Deframer::default();
        d.push(&[1, 0, 0, 0, 1, 9]);
        assert_eq!(d.next_message().unwrap_err().status, status::UNIMPLEMENTED);
        let mut d = Deframer::default();
        d.push(&[0]);
        d.push(&((MAX_BODY_BYTES as u32) + 1).to_be_bytes());
        assert_eq!(d.next_message().unwrap_err().status, status::RESOURCE_EXHAUSTED);
    }
}
