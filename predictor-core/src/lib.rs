//! predictor-core: the predictor's decisions as plain Rust, with no async runtime and no
//! sockets. Time comes from an injected [`clock::Clock`] and models run behind
//! [`model::runtime::Runtime`], so every decision runs the same in the service, under a
//! test's manual clock, and in a simulation. The service (`predictor-svc`) adds the
//! transport (HTTP, the predict stream), the background tasks and the process.
//!
//! Modules, one job each, layered one way: `config` (the file format, its own crate) and
//! `clock` at the bottom; `callers` (what one gateway may dispatch); `pool` (endpoint state and in-flight books); `model` (features,
//! the analytic prior, training, ONNX export, the runtime trait, the model store); `flow`
//! (the flow-control queue and its decisions); `metrics` (every Prometheus series the
//! predictor exports); `predictor` (the state the decisions share); `service` (what
//! predict, dispatch and report do); `admission` (what a predict call that offers to wait
//! does with the queue, on top of the service).

pub mod admission;
pub mod callers;
pub mod clock;
pub mod engine_metrics;
/// The configuration file, parsed in its own crate (`predictor-config/`).
pub use headroom_predictor_config as config;
pub mod flow;
pub mod metrics;
pub mod model;
pub mod pool;
pub mod predictor;
pub mod service;
