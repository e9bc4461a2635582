//! Latency models: features, training, ONNX export and inference.

pub mod features;
pub mod gbdt;
pub mod onnx;
pub mod runtime;
