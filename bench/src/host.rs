//! How busy this host's CPUs were during a measurement (`headroom_stack::host`), and when
//! that makes a measurement host-bound.
//!
//! When the host's CPUs saturate, latencies measure the host rather than the routing (the
//! simulator's `--time-scale` is the remedy), so every measurement records the share of CPU
//! time the whole host spent busy, and the report names the measurements above [`BUSY`].

pub use headroom_stack::host::CpuTimes;

/// Host CPU busy share above which a measurement is named in the report as host-bound.
pub const BUSY: f64 = 0.85;
