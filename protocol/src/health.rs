//! Passive health: what the gateway saw each endpoint answer decides whether it gets
//! traffic, whatever its metrics say.
//!
//! Why: a server that answers `500` at once while its `/metrics` look idle is, to every
//! load signal, the idlest server in the pool. Routing on load alone sent it 46% of the
//! requests of a three-server pool (more than round robin's third). So the gateway counts
//! what it sees: after [`EjectionPolicy::consecutive_failures`] failures in a row an endpoint
//! is ejected for [`EjectionPolicy::base_ejection_ms`], doubled at each ejection that follows
//! without a success in between, up to [`EjectionPolicy::max_ejection_ms`]. When the ejection
//! ends the endpoint is on probation: it takes one request (the probe) until that request's
//! outcome comes; a success clears its record, a failure ejects it again at once (the next,
//! longer term). This is Envoy's outlier detection with a
//! half-open probe, kept here once so that the filter (and its fallback), the endpoint
//! picker and the predictor eject alike.
//!
//! Time is the caller's, in milliseconds of a monotonic clock, so the same code runs in a
//! Wasm VM (the host's clock) and in the predictor (its injected clock).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// How an endpoint is ejected. Configured on the filter (`passive_health`) and the
/// predictor (`[passive_health]`); both default to these values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EjectionPolicy {
    /// Failures in a row that eject an endpoint; 0 turns passive health off.
    pub consecutive_failures: u32,
    /// The first ejection's length (ms).
    pub base_ejection_ms: u64,
    /// The longest an ejection lasts (ms), however often the endpoint failed.
    pub max_ejection_ms: u64,
}

impl Default for EjectionPolicy {
    fn default() -> Self {
        // Three failures: one is a transient error, three in a row at a server that
        // answers at once is a pattern, and at 20 requests a second it costs under a
        // quarter of a second of traffic. Five seconds, then 10, 20, 40, 60: a server
        // that stays broken draws one probe request a minute.
        EjectionPolicy { consecutive_failures: 3, base_ejection_ms: 5_000, max_ejection_ms: 60_000 }
    }
}

impl EjectionPolicy {
    /// The field and why, when a value is out of its range.
    pub fn invalid(&self) -> Option<(&'static str, &'static str)> {
        if self.consecutive_failures > 1_000 {
            return Some(("passive_health.consecutive_failures", "must be within 0..=1000"));
        }
        if !(1..=3_600_000).contains(&self.base_ejection_ms) {
            return Some(("passive_health.base_ejection_ms", "must be within 1..=3600000"));
        }
        if !(self.base_ejection_ms..=3_600_000).contains(&self.max_ejection_ms) {
            return Some(("passive_health.max_ejection_ms", "must be within base_ejection_ms..=3600000"));
        }
        None
    }

    /// The length of ejection number `ejections` (1 for the first).
    fn term_ms(&self, ejections: u32) -> u64 {
        let doublings = ejections.saturating_sub(1).min(32);
        self.base_ejection_ms.saturating_mul(1u64 << doublings).min(self.max_ejection_ms)
    }
}

/// What one answer says of the endpoint that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It served the request (2xx, 3xx).
    Success,
    /// It failed: a 5xx (Envoy's own 503 for a refused or reset connection included).
    Failure,
    /// Nothing about the endpoint: a 4xx is the client's request (a 429 is the server
    /// pushing back, which load routing already answers), and a status 0 (no whole
    /// response) comes as much from a client that left as from a server that died (which
    /// its refused scrape and Envoy's retry handle).
    Neutral,
}

impl Outcome {
    /// What one finished request says of its endpoints: a failure of `failed_at` (the
    /// gateway's choice, where it failed before a retry served it elsewhere), then the
    /// status's outcome for `endpoint`, the one that answered (none when unknown).
    pub fn of_request<'a>(
        failed_at: Option<&'a str>,
        endpoint: &'a str,
        status: u16,
    ) -> impl Iterator<Item = (&'a str, Outcome)> {
        let served = (!endpoint.is_empty()).then_some((endpoint, Outcome::of_status(status)));
        failed_at.map(|f| (f, Outcome::Failure)).into_iter().chain(served)
    }

    /// The outcome of an HTTP status as the gateway reports it (0: no whole response).
    pub fn of_status(status: u16) -> Outcome {
        match status {
            500..=599 => Outcome::Failure,
            100..=399 => Outcome::Success,
            _ => Outcome::Neutral,
        }
    }
}

/// One endpoint's record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Record {
    /// Failures since the last success.
    failures: u32,
    /// Ejections since the last success.
    ejections: u32,
    /// Ejected until then (ms); 0: never ejected since the last success.
    until_ms: u64,
    /// On probation, its one probe is out until then (ms): the endpoint takes no other
    /// request meanwhile.
    probe_until_ms: u64,
}

impl Record {
    fn ejected(&self, now_ms: u64) -> bool {
        now_ms < self.until_ms || now_ms < self.probe_until_ms
    }
}

/// The most endpoints remembered: records beyond are dropped with their successes, so
/// answers naming invented endpoints cannot grow it (a real pool is far smaller).
const MAX_ENDPOINTS: usize = 4_096;

/// Every endpoint's record of failures and ejections.
#[derive(Debug, Clone, Default)]
pub struct PassiveHealth {
    policy: EjectionPolicy,
    records: HashMap<String, Record>,
    /// Ejections so far, for the caller's counters.
    pub ejections: u64,
}

/// What recording one outcome did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Nothing changed in whether the endpoint gets traffic.
    Nothing,
    /// The endpoint was just ejected, for this long (ms).
    Ejected(u64),
}

impl PassiveHealth {
    pub fn new(policy: EjectionPolicy) -> PassiveHealth {
        PassiveHealth { policy, ..PassiveHealth::default() }
    }

    /// Takes a new policy; the records stay.
    pub fn set_policy(&mut self, policy: EjectionPolicy) {
        self.policy = policy;
    }

    /// Records what `endpoint` answered at `now_ms`.
    pub fn record(&mut self, endpoint: &str, outcome: Outcome, now_ms: u64) -> Recorded {
        if self.policy.consecutive_failures == 0 {
            return Recorded::Nothing;
        }
        match outcome {
            Outcome::Neutral => Recorded::Nothing,
            Outcome::Success => {
                // A clean record is no record: the map holds only endpoints that failed.
                self.records.remove(endpoint);
                Recorded::Nothing
            }
            Outcome::Failure => {
                if !self.records.contains_key(endpoint) && self.records.len() >= MAX_ENDPOINTS {
                    return Recorded::Nothing;
                }
                let policy = self.policy;
                let r = self.records.entry(endpoint.to_string()).or_default();
                if now_ms < r.until_ms {
                    // A request sent before the ejection, failing now: already counted.
                    return Recorded::Nothing;
                }
                r.failures = r.failures.saturating_add(1);
                // On probation (ejected before, no success since), one failure ejects again.
                let on_probation = r.ejections > 0;
                if !on_probation && r.failures < policy.consecutive_failures {
                    return Recorded::Nothing;
                }
                r.ejections = r.ejections.saturating_add(1);
                let term = policy.term_ms(r.ejections);
                r.until_ms = now_ms.saturating_add(term);
                r.probe_until_ms = 0;
                self.ejections += 1;
                Recorded::Ejected(term)
            }
        }
    }

    /// Files that a request was sent to `endpoint` at `now_ms`. On probation it is the one
    /// probe: the endpoint takes nothing else until its outcome comes, or until a term has
    /// passed without one. Why: a hung server's failure is known only when its request
    /// times out, and an endpoint open to all meanwhile, its metrics idle, drew a request
    /// from every client in that time.
    pub fn sent(&mut self, endpoint: &str, now_ms: u64) {
        let policy = self.policy;
        if let Some(r) = self.records.get_mut(endpoint) {
            if r.ejections > 0 && now_ms >= r.until_ms && now_ms >= r.probe_until_ms {
                r.probe_until_ms = now_ms.saturating_add(policy.term_ms(r.ejections));
            }
        }
    }

    /// Whether `endpoint` is ejected at `now_ms` (or, on probation, has its probe out).
    pub fn is_ejected(&self, endpoint: &str, now_ms: u64) -> bool {
        self.records.get(endpoint).is_some_and(|r| r.ejected(now_ms))
    }

    /// Endpoints ejected at `now_ms`.
    pub fn ejected(&self, now_ms: u64) -> usize {
        self.records.values().filter(|r| r.ejected(now_ms)).count()
    }

    /// Which of `addresses` are ejected at `now_ms`, in their order: none when every one is.
    /// With the whole pool failing, ejecting it all would only turn each request into a local
    /// error (Envoy's panic threshold does the same).
    pub fn ejected_among<'a>(&self, addresses: impl Iterator<Item = &'a str>, now_ms: u64) -> Vec<bool> {
        let ejected: Vec<bool> = addresses.map(|a| self.is_ejected(a, now_ms)).collect();
        if ejected.iter().all(|&x| x) {
            return vec![false; ejected.len()];
        }
        ejected
    }

    /// The items of `items` whose endpoint (`address`) is not ejected at `now_ms`
    /// ([`PassiveHealth::ejected_among`]: all of them when every one is).
    pub fn keep_healthy<T>(&self, items: &mut Vec<T>, address: impl Fn(&T) -> &str, now_ms: u64) {
        let ejected = self.ejected_among(items.iter().map(&address), now_ms);
        let mut flags = ejected.into_iter();
        items.retain(|_| !flags.next().unwrap_or(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> PassiveHealth {
        PassiveHealth::new(EjectionPolicy { consecutive_failures: 3, base_ejection_ms: 1_000, max_ejection_ms: 4_000 })
    }

    #[test]
    fn statuses_say_success_failure_or_nothing() {
        assert_eq!(Outcome::of_status(200), Outcome::Success);
        assert_eq!(Outcome::of_status(0), Outcome::Neutral);
        assert_eq!(Outcome::of_status(500), Outcome::Failure);
        assert_eq!(Outcome::of_status(503), Outcome::Failure);
        assert_eq!(Outcome::of_status(400), Outcome::Neutral);
        assert_eq!(Outcome::of_status(429), Outcome::Neutral);
    }

    #[test]
    fn three_failures_in_a_row_eject_and_a_success_between_resets() {
        let mut h = health();
        h.record("a", Outcome::Failure, 0);
        h.record("a", Outcome::Failure, 1);
        h.record("a", Outcome::Success, 2);
        h.record("a", Outcome::Failure, 3);
        assert_eq!(h.record("a", Outcome::Failure, 4), Recorded::Nothing);
        assert!(!h.is_ejected("a", 5), "two in a row since the success");
        assert_eq!(h.record("a", Outcome::Failure, 5), Recorded::Ejected(1_000));
        assert!(h.is_ejected("a", 5) && h.is_ejected("a", 1_004));
        assert!(!h.is_ejected("a", 1_005), "the term ends");
        assert!(!h.is_ejected("b", 5), "other endpoints are not touched");
        assert_eq!(h.ejections, 1);
    }

    #[test]
    fn on_probation_one_probe_at_a_time_until_its_outcome_or_a_term() {
        let mut h = health();
        for t in 0..3 {
            h.record("a", Outcome::Failure, t);
        }
        assert!(!h.is_ejected("a", 1_002), "the term ended: on probation");
        h.sent("a", 1_002);
        assert!(h.is_ejected("a", 1_003), "its probe is out: nothing else goes there");
        h.sent("b", 1_003);
        assert!(!h.is_ejected("b", 1_004), "a healthy endpoint takes any number");
        assert!(!h.is_ejected("a", 2_002), "a probe without an outcome for a term frees it");
        h.sent("a", 2_002);
        // The probe fails: ejected again, twice as long.
        assert_eq!(h.record("a", Outcome::Failure, 2_500), Recorded::Ejected(2_000));
        assert!(h.is_ejected("a", 4_499) && !h.is_ejected("a", 4_500));
        h.sent("a", 4_500);
        h.record("a", Outcome::Success, 4_600);
        h.sent("a", 4_601);
        assert!(!h.is_ejected("a", 4_602), "a successful probe clears it: no probe after");
    }

    #[test]
    fn on_probation_one_failure_ejects_again_for_twice_as_long_up_to_the_cap() {
        let mut h = health();
        for t in 0..3 {
            h.record("a", Outcome::Failure, t);
        }
        // Failures of requests sent before the ejection do not stack.
        assert_eq!(h.record("a", Outcome::Failure, 500), Recorded::Nothing);
        assert_eq!(h.record("a", Outcome::Failure, 1_002), Recorded::Ejected(2_000));
        assert_eq!(h.record("a", Outcome::Failure, 3_002), Recorded::Ejected(4_000));
        assert_eq!(h.record("a", Outcome::Failure, 7_002), Recorded::Ejected(4_000), "capped");
        // One success after the term clears it: three failures are needed again.
        h.record("a", Outcome::Success, 11_002);
        h.record("a", Outcome::Failure, 11_003);
        assert!(!h.is_ejected("a", 11_004));
        assert_eq!(h.ejected(11_004), 0);
    }

    #[test]
    fn a_client_error_says_nothing_and_zero_failures_turns_it_off() {
        let mut h = health();
        for t in 0..10 {
            h.record("a", Outcome::Neutral, t);
        }
        assert!(!h.is_ejected("a", 10));
        let mut off = PassiveHealth::new(EjectionPolicy { consecutive_failures: 0, ..EjectionPolicy::default() });
        for t in 0..10 {
            off.record("a", Outcome::Failure, t);
        }
        assert!(!off.is_ejected("a", 10));
    }

    #[test]
    fn keep_healthy_drops_ejected_endpoints_unless_all_are() {
        let mut h = health();
        for t in 0..3 {
            h.record("a", Outcome::Failure, t);
        }
        let mut some = vec!["a", "b"];
        h.keep_healthy(&mut some, |s| s, 10);
        assert_eq!(some, vec!["b"]);
        let mut all = vec!["a"];
        h.keep_healthy(&mut all, |s| s, 10);
        assert_eq!(all, vec!["a"], "a pool all ejected keeps every endpoint");
    }

    #[test]
    fn invented_endpoints_cannot_grow_the_records() {
        let mut h = health();
        for i in 0..(MAX_ENDPOINTS + 100) {
            h.record(&format!("10.0.0.{i}:8000"), Outcome::Failure, 0);
        }
        assert_eq!(h.records.len(), MAX_ENDPOINTS);
    }

    #[test]
    fn policies_out_of_range_name_their_field() {
        let bad = EjectionPolicy { base_ejection_ms: 0, ..EjectionPolicy::default() };
        assert_eq!(bad.invalid().map(|(f, _)| f), Some("passive_health.base_ejection_ms"));
        let bad = EjectionPolicy { max_ejection_ms: 10, ..EjectionPolicy::default() };
        assert_eq!(bad.invalid().map(|(f, _)| f), Some("passive_health.max_ejection_ms"));
        assert_eq!(EjectionPolicy::default().invalid(), None);
    }
}
