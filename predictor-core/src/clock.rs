//! The predictor's time. Every decision that depends on time (what is in flight and
//! for how long, the flow queue's deadlines, the live correction's windows, the contest
//! between a trained model and the prior, stale metrics) reads it from a [`Clock`] the
//! service is built with, never from the runtime: the process runs on the wall clock
//! ([`WallClock`]), a test steps a [`ManualClock`], and a simulation can run the
//! predictor in its own time. Durations measured for metrics (how long a prediction
//! took) and the rate of log lines stay on the wall clock: they describe the process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the predictor's decisions read the time.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The process's monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to ([`ManualClock::advance`]), from the moment it
/// was made: `Instant` has no constructor, so its times are that moment plus what it
/// was moved by.
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    elapsed_ns: AtomicU64,
}

impl ManualClock {
    pub fn new() -> ManualClock {
        ManualClock { start: Instant::now(), elapsed_ns: AtomicU64::new(0) }
    }

    /// Moves the clock on by `by`.
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + Duration::from_nanos(self.elapsed_ns.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new();
        let t0 = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(clock.now(), t0, "the wall clock ran; this one did not");
        clock.advance(Duration::from_secs(90));
        assert_eq!(clock.now() - t0, Duration::from_secs(90));
    }
}
