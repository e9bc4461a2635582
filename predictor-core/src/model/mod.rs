//! Latency models, bottom up: `columns` (the feature row's layout), `features` (one
//! definition at predict and train time), `prior` (the analytic formula that serves
//! before any model), `gbdt` (training), `onnx` (export), `runtime` (what runs a
//! model: a trait, ONNX Runtime in the service), `native` (the exported models run in
//! plain Rust), `sampler` (the sample reservoirs), `spread` (how far errors reach),
//! `registry` (which model serves), `training` (one round's fit, scores and export),
//! `persistence` (the data directory), `calibration` (the live correction of served
//! predictions), `duel` (the corrected prior against the trained model, judged live),
//! `store`, which composes them for the service, and `replay` (recorded observations
//! read back by the offline tools).

pub mod calibration;
pub mod columns;
pub mod duel;
pub mod features;
pub mod gbdt;
pub mod native;
pub mod onnx;
pub mod persistence;
pub mod prior;
pub mod registry;
pub mod replay;
pub mod runtime;
pub mod sampler;
pub mod spread;
pub mod store;
pub mod training;
