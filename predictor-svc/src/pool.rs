//! Pools, their endpoints, and what is known of each endpoint: scraped engine
//! metrics, requests dispatched there and not yet reported, cached prefixes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use headroom_protocol::{Dispatch, EndpointState, RequestFeatures};

use crate::config::Config;
use headroom_protocol::prefix::PrefixCache;

/// Engine metrics read from an endpoint's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineMetrics {
    pub running: u32,
    pub waiting: u32,
    pub kv_usage: f64,
}

/// A request dispatched to an endpoint and not yet reported.
#[derive(Debug, Clone)]
struct InFlight {
    endpoint: usize,
    input_tokens: u32,
    uncached_tokens: u64,
    expected_output: u32,
    tpot_slo_ms: Option<f64>,
    /// After this instant the request is assumed to be past prefill.
    prefill_done_by: Option<Instant>,
    dispatched_at: Instant,
}

/// One model server.
#[derive(Debug)]
pub struct Endpoint {
    pub address: String,
    pub metrics: Option<EngineMetrics>,
    pub scraped_at: Option<Instant>,
    pub scrape_errors: u64,
    /// Hardware class id (0: unknown), a model feature.
    pub hardware_class: u32,
    prefix: PrefixCache,
}

/// Output tokens assumed for a request that gave no `max_tokens`.
const DEFAULT_EXPECTED_OUTPUT: u32 = 256;

/// A pool's endpoints and the requests in flight on them.
#[derive(Debug)]
pub struct Pool {
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    in_flight: HashMap<String, InFlight>,
    /// Requests reported recently; a late dispatch for one of them is ignored.
    finished: HashMap<String, Instant>,
}

/// What happened to one dispatch or report item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Accepted,
    UnknownEndpoint,
    AlreadyFinished,
}

/// How long a finished request id is remembered.
const FINISHED_MEMORY: Duration = Duration::from_secs(60);

impl Pool {
    pub fn new(name: &str, addresses: &[String], prefix_blocks: usize) -> Pool {
        Pool {
            name: name.to_string(),
            endpoints: addresses
                .iter()
                .map(|a| Endpoint {
                    address: a.clone(),
                    metrics: None,
                    scraped_at: None,
                    scrape_errors: 0,
                    hardware_class: 0,
                    prefix: PrefixCache::new(prefix_blocks),
                })
                .collect(),
            in_flight: HashMap::new(),
            finished: HashMap::new(),
        }
    }

    fn index_of(&self, address: &str) -> Option<usize> {
        self.endpoints.iter().position(|e| e.address == address)
    }

    /// Starts tracking a dispatched request.
    pub fn dispatch(&mut self, d: &Dispatch, now: Instant) -> Applied {
        let Some(i) = self.index_of(&d.endpoint) else { return Applied::UnknownEndpoint };
        if self.finished.contains_key(&d.request_id) {
            return Applied::AlreadyFinished;
        }
        let prefix = self.endpoints[i].prefix.match_fraction(&d.request.prefix_hashes);
        self.endpoints[i].prefix.insert(&d.request.prefix_hashes);
        let r = &d.request;
        self.in_flight.insert(
            d.request_id.clone(),
            InFlight {
                endpoint: i,
                input_tokens: r.input_tokens,
                uncached_tokens: (f64::from(r.input_tokens) * (1.0 - prefix)).round() as u64,
                expected_output: r.max_tokens.unwrap_or(DEFAULT_EXPECTED_OUTPUT),
                tpot_slo_ms: r.slo.tpot_ms.filter(|_| r.streaming),
                prefill_done_by: d.predicted_ttft_ms.map(|ms| now + Duration::from_secs_f64(ms.max(0.0) / 1000.0)),
                dispatched_at: now,
            },
        );
        Applied::Accepted
    }

    /// Ends tracking of a reported request (known or not).
    pub fn finish(&mut self, request_id: &str, now: Instant) {
        self.in_flight.remove(request_id);
        self.finished.insert(request_id.to_string(), now);
    }

    /// Forgets requests never reported within `ttl` and old finished ids.
    pub fn expire(&mut self, now: Instant, ttl: Duration) -> usize {
        let before = self.in_flight.len();
        self.in_flight.retain(|_, f| now.duration_since(f.dispatched_at) < ttl);
        self.finished.retain(|_, t| now.duration_since(*t) < FINISHED_MEMORY);
        before - self.in_flight.len()
    }

    /// Requests in flight on the endpoint at `address`.
    pub fn in_flight_on(&self, address: &str) -> usize {
        let Some(i) = self.index_of(address) else { return 0 };
        self.in_flight.values().filter(|f| f.endpoint == i).count()
    }

    /// The feature state of every endpoint for `request`, in endpoint order.
    pub fn states_for(&self, request: &RequestFeatures, now: Instant) -> Vec<EndpointState> {
        let mut states: Vec<EndpointState> = self
            .endpoints
            .iter()
            .map(|e| {
                let m = e.metrics.unwrap_or_default();
                EndpointState {
                    running: m.running,
                    waiting: m.waiting,
                    kv_usage: m.kv_usage,
                    prefix_match: e.prefix.match_fraction(&request.prefix_hashes),
                    metrics_age_ms: e.scraped_at.map(|t| now.duration_since(t).as_millis() as u64),
                    hardware_class: e.hardware_class,
                    ..Default::default()
                }
            })
            .collect();
        for f in self.in_flight.values() {
            let s = &mut states[f.endpoint];
            s.in_flight += 1;
            s.tokens_in_flight += u64::from(f.input_tokens) + u64::from(f.expected_output);
            if f.prefill_done_by.is_none_or(|t| now < t) {
                s.uncached_tokens_in_flight += f.uncached_tokens;
            }
            if let Some(slo) = f.tpot_slo_ms {
                s.tightest_tpot_slo_ms = Some(s.tightest_tpot_slo_ms.map_or(slo, |t: f64| t.min(slo)));
            }
        }
        states
    }
}

/// Every pool, each behind its own lock.
#[derive(Debug)]
pub struct Pools {
    pools: HashMap<String, Mutex<Pool>>,
}

impl Pools {
    pub fn from_config(config: &Config) -> Pools {
        let pools = config
            .pools
            .iter()
            .map(|p| {
                let mut pool = Pool::new(&p.name, &p.endpoints, config.prefix_blocks_per_endpoint);
                for e in &mut pool.endpoints {
                    e.hardware_class = p.hardware.get(&e.address).map_or(0, |name| config.hardware_class(name));
                }
                (p.name.clone(), Mutex::new(pool))
            })
            .collect();
        Pools { pools }
    }

    /// Runs `f` on the pool named `name`; `None` if there is no such pool.
    pub fn with<R>(&self, name: &str, f: impl FnOnce(&mut Pool) -> R) -> Option<R> {
        let pool = self.pools.get(name)?;
        let mut guard = pool.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(f(&mut guard))
    }

    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.pools.keys().cloned().collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::Slo;

    fn dispatch(id: &str, endpoint: &str, tokens: u32, tpot: Option<f64>) -> Dispatch {
        Dispatch {
            pool: "p".into(),
            request_id: id.into(),
            endpoint: endpoint.into(),
            request: RequestFeatures {
                input_tokens: tokens,
                prefix_hashes: vec![1, 2],
                streaming: true,
                max_tokens: Some(10),
                slo: Slo { ttft_ms: None, tpot_ms: tpot },
                ..Default::default()
            },
            predicted_ttft_ms: Some(100.0),
        }
    }

    fn pool() -> Pool {
        Pool::new("p", &["a:1".into(), "b:2".into()], 100)
    }

    #[test]
    fn dispatch_and_report_track_in_flight() {
        let mut p = pool();
        let now = Instant::now();
        assert_eq!(p.dispatch(&dispatch("r1", "a:1", 100, Some(20.0)), now), Applied::Accepted);
        assert_eq!(p.dispatch(&dispatch("r2", "a:1", 50, Some(10.0)), now), Applied::Accepted);
        assert_eq!(p.dispatch(&dispatch("r3", "zz:9", 50, None), now), Applied::UnknownEndpoint);
        let s = p.states_for(&RequestFeatures::default(), now);
        assert_eq!(s[0].in_flight, 2);
        assert_eq!(s[0].tokens_in_flight, 170);
        assert_eq!(s[0].tightest_tpot_slo_ms, Some(10.0));
        assert_eq!(s[1].in_flight, 0);
        p.finish("r1", now);
        p.finish("r2", now);
        assert_eq!(p.in_flight_on("a:1"), 0);
    }

    #[test]
    fn requests_without_a_tpot_slo_never_weaken_the_tightest() {
        let mut p = pool();
        let now = Instant::now();
        p.dispatch(&dispatch("with", "a:1", 10, Some(25.0)), now);
        p.dispatch(&dispatch("without", "a:1", 10, None), now);
        let mut non_streaming = dispatch("batch", "a:1", 10, Some(5.0));
        non_streaming.request.streaming = false; // its TPOT is never observed: it protects nothing
        p.dispatch(&non_streaming, now);
        assert_eq!(p.states_for(&RequestFeatures::default(), now)[0].tightest_tpot_slo_ms, Some(25.0));
        p.finish("with", now);
        assert_eq!(p.states_for(&RequestFeatures::default(), now)[0].tightest_tpot_slo_ms, None);
    }

    #[test]
    fn late_dispatch_after_report_is_ignored() {
        let mut p = pool();
        let now = Instant::now();
        p.finish("r1", now);
        assert_eq!(p.dispatch(&dispatch("r1", "a:1", 10, None), now), Applied::AlreadyFinished);
        assert_eq!(p.in_flight_on("a:1"), 0);
    }

    #[test]
    fn prefill_tokens_leave_after_predicted_ttft_and_prefix_is_remembered() {
        let mut p = pool();
        let now = Instant::now();
        p.dispatch(&dispatch("r1", "a:1", 100, None), now);
        let req = RequestFeatures { prefix_hashes: vec![1, 2], ..Default::default() };
        let s = p.states_for(&req, now);
        assert_eq!(s[0].uncached_tokens_in_flight, 100);
        assert_eq!(s[0].prefix_match, 1.0);
        assert_eq!(s[1].prefix_match, 0.0);
        let later = now + Duration::from_millis(150);
        assert_eq!(p.states_for(&req, later)[0].uncached_tokens_in_flight, 0);
        // A second request with the same prefix is mostly cached.
        p.dispatch(&dispatch("r2", "a:1", 100, None), later);
        assert_eq!(p.states_for(&req, later)[0].uncached_tokens_in_flight, 0);
    }

    #[test]
    fn unreported_requests_expire() {
        let mut p = pool();
        let now = Instant::now();
        p.dispatch(&dispatch("r1", "a:1", 1, None), now);
        assert_eq!(p.expire(now + Duration::from_secs(5), Duration::from_secs(10)), 0);
        assert_eq!(p.expire(now + Duration::from_secs(11), Duration::from_secs(10)), 1);
    }
}
