//! headroom-sim: simulated vLLM-compatible model servers.
//!
//! `engine` is the pure continuous-batching model; `profile` its GPU constants
//! and step-cost formula; `server` the OpenAI-compatible HTTP front that runs an
//! engine in real time (optionally sped up by a time scale), split into HTTP,
//! engine driver, replies and metrics; `virtual_time` runs engines without a
//! clock for calibration; `floor` measures, on the engine, the prediction error
//! that nothing known at dispatch can go under.

pub mod engine;
pub mod floor;
pub mod histogram;
pub mod profile;
pub mod server;
pub mod virtual_time;
