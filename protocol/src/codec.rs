//! Encoding of protocol messages: MessagePack by default, JSON on request.

use serde::{de::DeserializeOwned, Serialize};

/// Content type of MessagePack bodies.
pub const MSGPACK: &str = "application/msgpack";
/// Content type of JSON bodies.
pub const JSON: &str = "application/json";

/// A body encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    MsgPack,
    Json,
}

impl Format {
    /// The format named by a `content-type` value; `None` for anything else.
    pub fn from_content_type(value: &str) -> Option<Format> {
        let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match essence.as_str() {
            MSGPACK | "application/x-msgpack" | "application/vnd.msgpack" => Some(Format::MsgPack),
            JSON => Some(Format::Json),
            _ => None,
        }
    }

    /// The format a client prefers from its `accept` value, or `fallback`
    /// when it names neither.
    pub fn from_accept(value: &str, fallback: Format) -> Format {
        let lower = value.to_ascii_lowercase();
        if lower.contains("msgpack") {
            Format::MsgPack
        } else if lower.contains(JSON) {
            Format::Json
        } else {
            fallback
        }
    }

    /// The `content-type` header value for this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::MsgPack => MSGPACK,
            Format::Json => JSON,
        }
    }
}

/// A body that could not be encoded or decoded.
#[derive(Debug)]
pub struct CodecError {
    /// Path of the field at fault (`request.slo.ttft_ms`), when known.
    pub field: Option<String>,
    pub message: String,
}

impl CodecError {
    fn plain(message: impl ToString) -> Self {
        CodecError { field: None, message: message.to_string() }
    }

    fn at<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> Self {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        // serde names a missing field in its message, not in the path.
        let missing = message.strip_prefix("missing field `").and_then(|m| m.split('`').next());
        // "." is the top level; "?" means the decoder failed before reaching any field.
        let field = match (path.as_str(), missing) {
            ("." | "?", Some(name)) => Some(name.to_string()),
            ("." | "?", None) => None,
            (p, Some(name)) => Some(format!("{p}.{name}")),
            (p, None) => Some(p.to_string()),
        };
        CodecError { field, message }
    }
}

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{field}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for CodecError {}

/// Encodes a message (MessagePack with named fields, or JSON).
pub fn encode<T: Serialize>(format: Format, msg: &T) -> Result<Vec<u8>, CodecError> {
    match format {
        Format::MsgPack => rmp_serde::to_vec_named(msg).map_err(CodecError::plain),
        Format::Json => serde_json::to_vec(msg).map_err(CodecError::plain),
    }
}

/// Decodes a message; the error text names the offending field where the
/// decoder knows it.
///
/// Why two passes: tracking the path costs a wrapper around every value decoded (about
/// a third of a predict request's decoding), and only a body that fails needs it. A
/// good body is decoded once, plainly; a bad one again with the path, for the error.
pub fn decode<T: DeserializeOwned>(format: Format, body: &[u8]) -> Result<T, CodecError> {
    let plain = match format {
        Format::MsgPack => rmp_serde::from_slice(body).ok(),
        Format::Json => serde_json::from_slice(body).ok(),
    };
    match plain {
        Some(value) => Ok(value),
        None => decode_tracked(format, body),
    }
}

/// [`decode`] with the path of every value tracked, so that a failure names its field.
fn decode_tracked<T: DeserializeOwned>(format: Format, body: &[u8]) -> Result<T, CodecError> {
    match format {
        Format::MsgPack => {
            let mut de = rmp_serde::Deserializer::new(body);
            serde_path_to_error::deserialize(&mut de).map_err(CodecError::at)
        }
        Format::Json => {
            let mut de = serde_json::Deserializer::from_slice(body);
            let value = serde_path_to_error::deserialize(&mut de).map_err(CodecError::at)?;
            de.end().map_err(CodecError::plain)?;
            Ok(value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchAck, Slo};

    #[test]
    fn content_type_parsing() {
        assert_eq!(Format::from_content_type("application/json; charset=utf-8"), Some(Format::Json));
        assert_eq!(Format::from_content_type("application/msgpack"), Some(Format::MsgPack));
        assert_eq!(Format::from_content_type("text/plain"), None);
        assert_eq!(Format::from_accept("*/*", Format::MsgPack), Format::MsgPack);
        assert_eq!(Format::from_accept("application/json", Format::MsgPack), Format::Json);
    }

    #[test]
    fn round_trip_both_formats() {
        for format in [Format::MsgPack, Format::Json] {
            let slo = Slo { ttft_ms: Some(250.0), tpot_ms: None };
            let back: Slo = decode(format, &encode(format, &slo).unwrap()).unwrap();
            assert_eq!(back, slo);
            let ack = BatchAck { accepted: 3, rejected: 1 };
            let back: BatchAck = decode(format, &encode(format, &ack).unwrap()).unwrap();
            assert_eq!(back, ack);
        }
    }

    #[test]
    fn errors_name_the_field_path() {
        use crate::PredictRequest;
        let err = decode::<PredictRequest>(
            Format::Json,
            br#"{"pool":"p","request_id":"r","request":{"model":"m","input_tokens":"many"}}"#,
        )
        .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("request.input_tokens"));
        let err =
            decode::<PredictRequest>(Format::Json, br#"{"request_id":"r","request":{"model":"m","input_tokens":1}}"#)
                .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("pool"));
        let err =
            decode::<PredictRequest>(Format::Json, br#"{"pool":"p","request_id":"r","request":{"input_tokens":1}}"#)
                .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("request.model"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode::<Slo>(Format::MsgPack, b"\xc1\xff\x00").is_err());
        assert!(decode::<Slo>(Format::Json, b"{not json").is_err());
    }
}
