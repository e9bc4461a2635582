//! The headroom filter's logic, free of the proxy-wasm host ABI.
//!
//! The Wasm adapter (`filter/wasm`) forwards each host callback to [`vm::Vm`]
//! (configure, tick, batch answers) or [`flow::Flow`] (one per stream), handing
//! them an implementation of [`host::Host`], and carries out the [`flow::Step`]
//! they return. Every decision is here; the host is reached only through the
//! trait, so all of it is unit-tested natively and under wasm32 (`tests`).

pub mod coalesce;
pub mod config;
pub mod fallback;
pub mod flow;
pub mod header_map;
pub mod headers;
pub mod host;
pub mod outbox;
pub mod policy;
pub mod prefix_load;
#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests;
pub mod queue;
pub mod shards;
pub mod stats;
pub mod stream;
#[cfg(test)]
mod tests;
pub mod token_count;
pub mod vm;

pub use config::{ConfigError, FilterConfig};

use headroom_protocol::ErrorBody;

/// A JSON error body naming the field (or header) at fault.
pub fn error_json(field: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&ErrorBody::field(field, message)).unwrap_or_default()
}

/// A JSON error body not tied to one field.
pub fn error_message_json(message: &str) -> Vec<u8> {
    serde_json::to_vec(&ErrorBody::message(message)).unwrap_or_default()
}
