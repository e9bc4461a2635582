//! The headroom proxy-wasm filter: glue between Envoy and `headroom-filter-core`.
//!
//! One root context per VM holds the configuration, the queues of dispatches
//! and observations (flushed to the predictor on a tick) and the last endpoint
//! state seen (for the fallback). One request context per HTTP stream runs the
//! flow in `request.rs`.

mod host;
mod request;
mod root;
mod stats;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> { Box::new(root::Root::default()) });
}}
