//! The headroom filter's logic, free of the proxy-wasm host ABI.
//!
//! The Wasm adapter (`filter/wasm`) feeds this crate what the host gives it
//! (header values, body bytes, the predictor's answer, timestamps) and carries
//! out what it returns (a destination, a local reply, a batch to send). Nothing
//! here calls the host, so all of it is unit-tested natively.

pub mod config;
pub mod fallback;
pub mod headers;
pub mod outbox;
pub mod policy;
#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests;
pub mod queue;
pub mod rng;
pub mod shards;

pub use config::{ConfigError, FilterConfig};

use headroom_protocol::ErrorBody;

/// A JSON error body naming the field (or header) at fault.
pub fn error_json(field: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&ErrorBody::field(field, message)).unwrap_or_default()
}
