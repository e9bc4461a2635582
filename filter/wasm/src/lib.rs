//! The headroom proxy-wasm filter: an adapter from Envoy's ABI to `headroom-filter-core`.
//!
//! Nothing here decides anything. `host` binds the ABI; `envoy` implements the
//! core's `Host` trait over it; `root` forwards the VM's callbacks (configure, tick, batch
//! answers, wake-ups) to `core::vm::Vm` and hands each request its share of a coalesced
//! predict call; `request` forwards each stream's callbacks to `core::flow::Flow` and
//! carries out the step it returns; `stats` maps the core's events to Envoy stats.

mod envoy;
mod host;
mod request;
mod root;
mod stats;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn proxy_wasm::traits::RootContext> { Box::new(root::Root::new(context_id)) });
}}
