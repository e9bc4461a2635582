//! Latency models: features, the analytic prior, training, ONNX export and
//! inference, and the store that keeps the active model, its history and the
//! training samples.

pub mod features;
pub mod gbdt;
pub mod onnx;
pub mod prior;
pub mod runtime;
pub mod sampler;
pub mod store;
