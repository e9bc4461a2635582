//! How busy this host's CPUs were during a measurement (`headroom_stack::host`), and when
//! that makes a measurement host-bound.
//!
//! When the host's CPUs saturate, latencies measure the host rather than the routing (the
//! simulator's `--time-scale` is the remedy), so every measurement records the share of CPU
//! time the whole host spent busy, and the report names the measurements above [`BUSY`].

pub use headroom_stack::host::{CpuTimes, ProcessTimes};

/// Host CPU busy share above which a measurement is named in the report as host-bound.
pub const BUSY: f64 = 0.85;

/// On real engines, the share of the host's CPU outside the engines' own processes above which
/// a measurement is named host-bound instead: an engine that queues keeps its core busy, so the
/// whole host's share says only that the fleet is loaded (issue #84: at most 20%).
pub const OUTSIDE_ENGINES: f64 = 0.20;
