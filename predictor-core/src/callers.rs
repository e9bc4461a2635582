//! What one caller (a gateway, named by its token: `predictor-config`'s `callers.rs`) may
//! dispatch: a rate, kept here, and a share of each pool's books (`Pool::dispatch_from`). A leaked token so
//! costs what its caller's quotas allow, not the whole pool, and is revoked alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::config::CallerQuotas;

/// A caller's name, shared by every request it dispatched.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller(Arc<str>);

impl Caller {
    pub fn new(name: &str) -> Caller {
        Caller(Arc::from(name))
    }

    /// Whoever calls when the guarded routes are open (no token configured), and the one
    /// caller of a simulation.
    pub fn anonymous() -> Caller {
        Caller::new("")
    }

    pub fn name(&self) -> &str {
        &self.0
    }
}

/// Each caller's dispatch rate, as token buckets on the predictor's clock.
#[derive(Debug)]
pub struct Callers {
    quotas: CallerQuotas,
    /// `(dispatches left, when last filled)` by caller. Callers are the configured names
    /// (and the anonymous one), so the map is as small as the callers file.
    buckets: Mutex<HashMap<Caller, (f64, Instant)>>,
}

impl Callers {
    pub fn new(quotas: CallerQuotas) -> Callers {
        Callers { quotas, buckets: Mutex::new(HashMap::new()) }
    }

    /// How many of `wanted` dispatches `caller` may post at `now`, taken from its bucket.
    pub fn take(&self, caller: &Caller, wanted: usize, now: Instant) -> usize {
        let CallerQuotas { dispatches_per_s: rate, dispatch_burst: depth, .. } = self.quotas;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (left, at) = buckets.entry(caller.clone()).or_insert((depth, now));
        *left = (*left + now.saturating_duration_since(*at).as_secs_f64() * rate).min(depth);
        *at = now.max(*at);
        let granted = (*left).floor().clamp(0.0, wanted as f64) as usize;
        *left -= granted as f64;
        granted
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_caller_dispatches_at_its_rate_after_its_burst_and_apart_from_others() {
        let callers =
            Callers::new(CallerQuotas { dispatches_per_s: 100.0, dispatch_burst: 50.0, in_flight_share: 0.5 });
        let (a, b) = (Caller::new("a"), Caller::new("b"));
        let t0 = Instant::now();
        assert_eq!(callers.take(&a, 10_000, t0), 50, "the burst");
        assert_eq!(callers.take(&a, 10, t0), 0, "then nothing at once");
        assert_eq!(callers.take(&b, 30, t0), 30, "another caller's bucket is its own");
        assert_eq!(callers.take(&a, 10_000, t0 + Duration::from_millis(200)), 20, "then its rate");
        assert_eq!(callers.take(&a, 10_000, t0 + Duration::from_secs(60)), 50, "never more than the burst");
    }
}
