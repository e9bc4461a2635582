//! Pools, their endpoints, and what is known of each endpoint: scraped engine
//! metrics, requests dispatched there and not yet reported, cached prefixes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use headroom_protocol::health::{EjectionPolicy, Outcome, PassiveHealth, Recorded};
use headroom_protocol::{Dispatch, EndpointState, RequestFeatures};

use crate::callers::Caller;
use crate::config::Config;

mod books;
mod endpoint;
mod recent;
mod records;

use books::{Books, InFlight};
pub use endpoint::{DecodeCounter, Endpoint, EngineMetrics};
use recent::RecentIds;
pub use records::{Kept, MAX_RECORD_BYTES};
use records::{Record, RECORD_TTL};

/// A pool's engine state as the Gateway API Inference Extension's `inference_pool_*`
/// gauges show it ([`Pool::gauges`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolGauges {
    /// Endpoints with fresh engine metrics.
    pub ready: usize,
    /// Their mean KV-cache use (0..1).
    pub kv_usage: f64,
    /// Their mean requests waiting in the engine's queue.
    pub waiting: f64,
    /// Their mean requests running.
    pub running: f64,
    /// Each one's requests waiting, by address.
    pub waiting_by_endpoint: Vec<(String, u32)>,
}

/// How long a flow-control reservation counts without the dispatch that confirms it
/// (the filter flushes dispatches every `flush_interval_ms`, 20 ms by default).
const RESERVATION_TTL: Duration = Duration::from_secs(2);

/// How long a dispatched request may take to show in its engine's running or waiting count
/// (the gateway's send, the API server's tokenizing), on top of the scrape's own lag: a
/// request dispatched longer before a scrape than this and still tracked is running there,
/// or the books are wrong.
const SHOWS_WITHIN: Duration = Duration::from_secs(10);
/// Sequences the books may hold at an endpoint past what its engine showed: requests that
/// finished in the engine and whose report is a flush away.
const VOUCH_SLACK: u32 = 4;
/// A scrape older than this vouches for nothing (the endpoint went quiet; expiry still holds).
const VOUCH_FRESH: Duration = Duration::from_secs(5);

/// A pool whose gateway reported a first token this recently is taken to report them all.
const FIRST_TOKENS_RECENT: Duration = Duration::from_secs(60);

/// How long a dispatched request is tracked without its report. A report can go astray:
/// to another predictor replica (a rollout's overlap, a failover and failback), or never
/// be sent (an Envoy that exited). Until the request is forgotten it counts as load on its
/// endpoint, so the bound follows how long it should run, not one long fixed TTL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expiry {
    /// The most any request is tracked for (`in_flight_ttl_s`).
    pub ttl: Duration,
    /// Times its predicted end-to-end time a request with one is tracked for.
    pub multiple: f64,
    /// The least a request with a predicted end is tracked for (`in_flight_min_s`).
    pub floor: Duration,
}

impl Default for Expiry {
    fn default() -> Self {
        Expiry { ttl: Duration::from_secs(600), multiple: 4.0, floor: Duration::from_secs(30) }
    }
}

impl Expiry {
    /// How long a request is tracked unreported: `multiple` times its predicted end-to-end time
    /// (TTFT + TPOT x `max_tokens`) within `floor..=ttl`; `ttl` when that is not known (no
    /// prediction, or no `max_tokens`: its output is bounded only by the context).
    pub fn lifetime(&self, (ttft_ms, tpot_ms): (Option<f64>, Option<f64>), max_tokens: Option<u32>) -> Duration {
        let (Some(ttft), Some(tpot), Some(n)) = (ttft_ms, tpot_ms, max_tokens) else {
            return self.ttl;
        };
        let predicted_ms = ttft + tpot * f64::from(n);
        Duration::try_from_secs_f64(predicted_ms * self.multiple / 1000.0)
            .map_or(self.ttl, |t| t.max(self.floor).min(self.ttl))
    }
}

/// How a report's request stood in this pool's books.
#[derive(Debug, Clone, PartialEq)]
pub enum Finished {
    /// Tracked in flight until now, dispatched to this address, with what the predictor
    /// kept of it there (none: dispatched here without a record).
    Tracked(String, Option<Box<Kept>>),
    /// Dispatched to this address, and forgotten as overdue before its report came.
    Late(String, Option<Box<Kept>>),
    /// Never seen dispatched here (or forgotten too long ago).
    Unknown,
    /// Tracked, but dispatched by another caller: left as it was.
    OtherCaller,
}

impl Finished {
    /// The address it was dispatched to, when this pool saw the dispatch.
    pub fn address(&self) -> Option<&str> {
        match self {
            Finished::Tracked(a, _) | Finished::Late(a, _) => Some(a),
            Finished::Unknown | Finished::OtherCaller => None,
        }
    }

    /// What the predictor kept of it, when it was dispatched here with a record.
    pub fn kept(&self) -> Option<&Kept> {
        match self {
            Finished::Tracked(_, k) | Finished::Late(_, k) => k.as_deref(),
            Finished::Unknown | Finished::OtherCaller => None,
        }
    }
}

/// A pool's endpoints and the requests in flight on them.
#[derive(Debug)]
pub struct Pool {
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    /// Endpoints from the config file: `(address, hardware class)`.
    static_endpoints: Vec<(String, u32)>,
    /// Endpoints from each discovery source (by source index), as last seen.
    discovered: BTreeMap<usize, Vec<(String, u32)>>,
    prefix_blocks: usize,
    in_flight: Books,
    /// Most requests tracked in flight; beyond it a dispatch is refused.
    max_in_flight: usize,
    /// The share of them one caller's dispatches may hold (`CallerQuotas::in_flight_share`).
    caller_share: f64,
    /// Requests reported recently; a late dispatch for one of them is ignored.
    finished: RecentIds,
    /// Requests forgotten unreported (`expire`), with the address they were dispatched to,
    /// for `Expiry::ttl`: a report that comes after all (the request ran far longer than
    /// predicted) still teaches, and is counted late.
    overdue: RecentIds<(String, Option<Box<Kept>>)>,
    /// The newest predict answer of each request not yet dispatched (flow control answers
    /// at release what it predicted on arrival: the newer replaces the older), each for
    /// [`RECORD_TTL`].
    records: RecentIds<Record>,
    expiry: Expiry,
    /// When the last first-token event arrived: while recent, prefill ends when
    /// observed (or a grace period after the prediction), not at the prediction.
    last_first_token: Option<Instant>,
    /// What each hardware class's engine costs, by class id; classes past the end cost what
    /// class 0 does. Empty: the backlog is not drained (every prompt in prefill counts
    /// whole) and every running TPOT SLO tightens.
    costs: Vec<ClassCost>,
    /// What the gateways reported each endpoint answered: one that keeps failing gets no
    /// prediction while ejected (`headroom_protocol::health`), on milliseconds since
    /// `health_epoch`, the first outcome filed.
    health: PassiveHealth,
    health_epoch: Option<Instant>,
}

/// What a hardware class's engine costs, as the prior charges it (`model::prior`), so the
/// books and the prior cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassCost {
    /// One uncached prompt token's prefill (ms): the rate the prefill backlog drains at.
    pub prefill_ms_per_token: f64,
    /// The fastest decode step (ms), one request alone on an idle engine: a TPOT SLO under
    /// it cannot be kept there and tightens no one's target (`InFlight::tpot_slo_ms`).
    pub fastest_tpot_ms: f64,
}

/// What happened to one dispatch or report item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Accepted,
    /// Tracked, but this predictor holds no record of the request (its predict call went
    /// to another replica, or to this one before a restart, or the gateway fell back):
    /// it counts as load where it went, with the features the dispatch carried (none
    /// from a lean one: only the request count), and its report will teach nothing.
    AcceptedWithoutRecord,
    UnknownEndpoint,
    AlreadyFinished,
    /// `max_in_flight` requests are tracked already.
    PoolFull,
    /// Its caller's dispatches hold their share of the books already.
    CallerFull,
}

/// Tracked requests per pool when a pool is built without a configuration.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 100_000;

/// How long a finished request id is remembered.
const FINISHED_MEMORY: Duration = Duration::from_secs(60);

/// How an endpoint set change went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointChange {
    pub added: usize,
    pub removed: usize,
    /// Requests in flight on removed endpoints, no longer counted.
    pub dropped_in_flight: usize,
}

impl Pool {
    /// A pool of static endpoints, all of hardware class 0.
    pub fn new(name: &str, addresses: &[String], prefix_blocks: usize) -> Pool {
        Pool::with_hardware(name, addresses.iter().map(|a| (a.clone(), 0)).collect(), prefix_blocks)
    }

    /// A pool of static `(address, hardware class)` endpoints.
    pub fn with_hardware(name: &str, endpoints: Vec<(String, u32)>, prefix_blocks: usize) -> Pool {
        let mut pool = Pool {
            name: name.to_string(),
            endpoints: Vec::new(),
            static_endpoints: endpoints,
            discovered: BTreeMap::new(),
            prefix_blocks,
            in_flight: Books::default(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            caller_share: 1.0,
            finished: RecentIds::new(DEFAULT_MAX_IN_FLIGHT),
            overdue: RecentIds::new(DEFAULT_MAX_IN_FLIGHT),
            records: RecentIds::weighed(DEFAULT_MAX_IN_FLIGHT, MAX_RECORD_BYTES, Record::bytes),
            expiry: Expiry::default(),
            last_first_token: None,
            costs: Vec::new(),
            health: PassiveHealth::new(EjectionPolicy::default()),
            health_epoch: None,
        };
        pool.rebuild();
        pool
    }

    /// Replaces what discovery source `source` reports; the pool's endpoints become
    /// the static ones plus every source's (first listing wins a duplicate address).
    pub fn set_discovered(&mut self, source: usize, endpoints: Vec<(String, u32)>) -> EndpointChange {
        self.discovered.insert(source, endpoints);
        self.rebuild()
    }

    /// Recomputes the endpoint list. Endpoints that stay keep their metrics, prefix
    /// cache and requests in flight; those that go take their requests in flight along.
    fn rebuild(&mut self) -> EndpointChange {
        let mut wanted: Vec<(String, u32)> = Vec::new();
        for (address, class) in self.static_endpoints.iter().chain(self.discovered.values().flatten()) {
            if !wanted.iter().any(|(a, _)| a == address) {
                wanted.push((address.clone(), *class));
            }
        }
        let mut old: Vec<Option<Endpoint>> = std::mem::take(&mut self.endpoints).into_iter().map(Some).collect();
        let mut remap: HashMap<usize, usize> = HashMap::new();
        let mut change = EndpointChange::default();
        for (new_index, (address, class)) in wanted.into_iter().enumerate() {
            let kept = old.iter().position(|e| e.as_ref().is_some_and(|e| e.address == address));
            let endpoint = match kept.and_then(|i| old[i].take().map(|e| (i, e))) {
                Some((old_index, mut e)) => {
                    remap.insert(old_index, new_index);
                    e.hardware_class = class;
                    e
                }
                None => {
                    change.added += 1;
                    Endpoint::new(address, class, self.prefix_blocks)
                }
            };
            self.endpoints.push(endpoint);
        }
        change.removed = old.iter().flatten().count();
        let before = self.in_flight.len();
        self.in_flight.renumber(|i| remap.get(&i).copied());
        change.dropped_in_flight = before - self.in_flight.len();
        change
    }

    /// Bounds the requests tracked in flight (and the finished ids remembered) to `max`.
    pub fn with_max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.max(1);
        self.finished = RecentIds::new(max);
        self.overdue = RecentIds::new(max);
        self.records = RecentIds::weighed(max, MAX_RECORD_BYTES, Record::bytes);
        self
    }

    /// Holds each caller's dispatches to `share` of `max_in_flight` (at least one).
    pub fn with_caller_share(mut self, share: f64) -> Self {
        self.caller_share = share;
        self
    }

    /// Most requests one caller's dispatches may hold: its share of `max_in_flight`, at
    /// least one, at most all.
    fn max_in_flight_per_caller(&self) -> usize {
        ((self.max_in_flight as f64 * self.caller_share).ceil() as usize).clamp(1, self.max_in_flight)
    }

    /// Requests unreported are forgotten as `expiry` says.
    pub fn with_expiry(mut self, expiry: Expiry) -> Self {
        self.expiry = expiry;
        self
    }

    /// Each hardware class's engine costs `costs[class]`: its prefill backlog
    /// (`EndpointState::prefill_backlog_tokens`) drains at that class's cost per prompt token,
    /// and a TPOT SLO under its fastest decode step tightens no one.
    pub fn with_class_costs(mut self, costs: Vec<ClassCost>) -> Self {
        self.costs = costs;
        self
    }

    /// Endpoints failing requests are ejected as `policy` says.
    pub fn with_passive_health(mut self, policy: EjectionPolicy) -> Self {
        self.health = PassiveHealth::new(policy);
        self
    }

    /// Files what `address` answered a request at `now` (as a gateway reported it):
    /// whether that ejected it.
    pub fn answered(&mut self, address: &str, outcome: Outcome, now: Instant) -> bool {
        if self.index_of(address).is_none() {
            return false; // not an endpoint of this pool: nothing to keep
        }
        let ms = self.health_ms(now);
        self.health.record(address, outcome, ms) != Recorded::Nothing
    }

    /// `now` on passive health's clock (ms since its first use).
    fn health_ms(&mut self, now: Instant) -> u64 {
        let epoch = *self.health_epoch.get_or_insert(now);
        now.saturating_duration_since(epoch).as_millis() as u64
    }

    /// Which endpoints are ejected at `now`, in endpoint order: none when every one is
    /// (with the whole pool failing, placing by load beats answering nothing).
    pub fn ejected(&self, now: Instant) -> Vec<bool> {
        let Some(epoch) = self.health_epoch else { return vec![false; self.endpoints.len()] };
        let ms = now.saturating_duration_since(epoch).as_millis() as u64;
        self.health.ejected_among(self.endpoints.iter().map(|e| e.address.as_str()), ms)
    }

    /// What the engine of the endpoint at index `i` costs, if known.
    fn cost_of(&self, i: usize) -> Option<ClassCost> {
        let class = self.endpoints.get(i)?.hardware_class as usize;
        self.costs.get(class).or(self.costs.first()).copied()
    }

    fn index_of(&self, address: &str) -> Option<usize> {
        self.endpoints.iter().position(|e| e.address == address)
    }

    /// Keeps what a predict answer said for `request_id` (its features, and the state and
    /// predictions of each endpoint, in `states` order), for its dispatch.
    pub fn remember(
        &mut self,
        request_id: &str,
        request: &RequestFeatures,
        states: &[EndpointState],
        predicted: &[(Option<f64>, Option<f64>)],
        now: Instant,
    ) {
        let endpoints = self
            .endpoints
            .iter()
            .zip(states)
            .zip(predicted)
            .map(|((e, s), &(ttft, tpot))| (e.address.clone(), s.clone(), ttft, tpot))
            .collect();
        self.records.replace(request_id, Record { request: request.clone(), endpoints }, now);
    }

    /// [`Pool::dispatch_from`] the anonymous caller (a test's, a simulation's).
    pub fn dispatch(&mut self, d: &Dispatch, now: Instant) -> Applied {
        self.dispatch_from(d, &Caller::anonymous(), now)
    }

    /// Starts tracking a request `caller` dispatched: with this predictor's record of it, the
    /// features and predictions it answered; without one, the features the dispatch carries.
    pub fn dispatch_from(&mut self, d: &Dispatch, caller: &Caller, now: Instant) -> Applied {
        let Some(i) = self.index_of(&d.endpoint) else { return Applied::UnknownEndpoint };
        if self.finished.contains(&d.request_id) {
            return Applied::AlreadyFinished;
        }
        // The same dispatch again (a batch whose call timed out after the predictor applied it,
        // resent): the first stays, with its first-token state and its prefix match.
        if let Some(f) = self.in_flight.get(&d.request_id).filter(|f| !f.reserved && f.endpoint == i) {
            return if f.kept.is_some() { Applied::Accepted } else { Applied::AcceptedWithoutRecord };
        }
        if !self.in_flight.contains_key(&d.request_id) {
            if self.in_flight.len() >= self.max_in_flight {
                return Applied::PoolFull;
            }
            if self.in_flight.held_by(caller) >= self.max_in_flight_per_caller() {
                return Applied::CallerFull;
            }
        }
        let mut record = self.records.remove(&d.request_id);
        // Header-only routing predicted the prompt its `content-length` claimed; a body that
        // passed shorter is booked, and learned from, as it passed.
        if let Some(r) = record.as_mut().filter(|_| d.request.input_tokens > 0) {
            r.request.input_tokens = r.request.input_tokens.min(d.request.input_tokens);
        }
        let there = record.as_ref().and_then(|r| r.endpoints.iter().find(|(a, ..)| *a == d.endpoint));
        let (request, predicted, kept) = match (&record, there) {
            (Some(r), Some((_, state, ttft, tpot))) => {
                let kept = Kept {
                    request: RequestFeatures { prefix_hashes: Vec::new(), ..r.request.clone() },
                    state: state.clone(),
                    predicted_ttft_ms: *ttft,
                    predicted_tpot_ms: *tpot,
                };
                (&r.request, (*ttft, *tpot), Some(Box::new(kept)))
            }
            // No record of it, or of that endpoint (the filter's fallback placed it, or another
            // replica predicted it): the dispatch's features, and nothing predicted.
            _ => (&d.request, (None, None), None),
        };
        let prefix = self.endpoints[i].prefix.match_fraction(&request.prefix_hashes);
        self.endpoints[i].prefix.insert(&request.prefix_hashes);
        // On probation, this is its one probe (`PassiveHealth::sent`).
        let ms = self.health_ms(now);
        self.health.sent(&d.endpoint, ms);
        // Without a record, nothing says how long it runs, and this replica is likely not
        // where its report goes (calls are balanced over the replicas): its books hold it for
        // the least a request with a predicted end is held.
        let lifetime = match &kept {
            None => self.expiry.floor.min(self.expiry.ttl),
            Some(_) => self.expiry.lifetime(predicted, request.max_tokens),
        };
        let with_record = kept.is_some();
        let fastest = self.cost_of(i).map(|c| c.fastest_tpot_ms);
        let mut f = InFlight::new(i, request, prefix, (predicted.0, fastest), (now, lifetime), false, kept);
        f.caller = Some(caller.clone());
        self.endpoints[i].add_prefill(f.uncached_tokens, now);
        self.in_flight.insert(d.request_id.clone(), f);
        if with_record {
            Applied::Accepted
        } else {
            Applied::AcceptedWithoutRecord
        }
    }

    /// Counts a request flow control just released towards `endpoint` as in flight there,
    /// until its dispatch arrives (up to a flush interval later) and replaces the
    /// reservation, wherever the filter placed it. Without it, every queued request
    /// released before that flush would see the same free endpoint.
    pub fn reserve(&mut self, request_id: &str, endpoint: &str, r: &RequestFeatures, ttft_ms: f64, now: Instant) {
        let Some(i) = self.index_of(endpoint) else { return };
        let fastest = self.cost_of(i).map(|c| c.fastest_tpot_ms);
        if self.in_flight.contains_key(request_id) || self.in_flight.len() >= self.max_in_flight {
            return;
        }
        let prefix = self.endpoints[i].prefix.match_fraction(&r.prefix_hashes);
        self.in_flight.insert(
            request_id.to_string(),
            InFlight::new(i, r, prefix, (Some(ttft_ms), fastest), (now, RESERVATION_TTL), true, None),
        );
    }

    /// Drops the reservation of a request whose client left before it was dispatched.
    pub fn cancel_reservation(&mut self, request_id: &str) {
        if self.in_flight.get(request_id).is_some_and(|f| f.reserved) {
            self.in_flight.remove(request_id);
        }
    }

    /// A TPOT observed at `endpoint` at `now` (a report of a request dispatched there).
    pub fn observed_tpot(&mut self, endpoint: &str, tpot_ms: f64, now: Instant) {
        let Some(e) = self.index_of(endpoint).and_then(|i| self.endpoints.get_mut(i)) else { return };
        e.reported_tpot(tpot_ms, now);
    }

    /// A tracked request's first token passed the gateway at `endpoint`: it is past
    /// prefill. Returns whether it applied (tracked here, at that endpoint).
    pub fn first_token(&mut self, request_id: &str, endpoint: &str, now: Instant) -> bool {
        let Some(i) = self.index_of(endpoint) else { return false };
        if !self.in_flight.seen_first_token(request_id, i) {
            return false;
        }
        self.last_first_token = Some(now);
        true
    }

    /// Whether the gateway reports first tokens (one arrived recently).
    fn first_token_events(&self, now: Instant) -> bool {
        self.last_first_token.is_some_and(|t| now.saturating_duration_since(t) < FIRST_TOKENS_RECENT)
    }

    /// Ends tracking of a reported request (known or not): how it stood in the books.
    pub fn finish(&mut self, request_id: &str, now: Instant) -> Finished {
        self.finish_from(request_id, &Caller::anonymous(), now)
    }

    /// [`Pool::finish`] as reported by `caller`: a request another caller dispatched is left
    /// tracked ([`Finished::OtherCaller`]), so one gateway's token cannot end another's books.
    pub fn finish_from(&mut self, request_id: &str, caller: &Caller, now: Instant) -> Finished {
        if self.in_flight.get(request_id).and_then(|f| f.caller.as_ref()).is_some_and(|c| c != caller) {
            return Finished::OtherCaller;
        }
        let tracked = self.in_flight.remove(request_id).filter(|f| !f.reserved);
        self.finished.insert(request_id, (), now);
        self.records.remove(request_id);
        if let Some(f) = tracked {
            if let Some(e) = self.endpoints.get(f.endpoint) {
                return Finished::Tracked(e.address.clone(), f.kept);
            }
        }
        self.overdue.remove(request_id).map_or(Finished::Unknown, |(address, kept)| Finished::Late(address, kept))
    }

    /// Forgets requests unreported past their expiry (`Expiry`) or beyond what their engine
    /// shows ([`Pool::unvouched`]), and old finished and overdue ids. Returns how many
    /// requests in flight were forgotten.
    pub fn expire(&mut self, now: Instant) -> usize {
        // A reservation never confirmed (the client left, the filter fell back) is no
        // dispatch: dropped without counting.
        self.in_flight.retain(|f| !f.reserved || now.saturating_duration_since(f.dispatched_at) < RESERVATION_TTL);
        let mut due: Vec<String> =
            self.in_flight.iter().filter(|(_, f)| now >= f.expires_at).map(|(id, _)| id.clone()).collect();
        due.extend(
            self.unvouched(now).into_iter().filter(|id| self.in_flight.get(id).is_some_and(|f| now < f.expires_at)),
        );
        for id in &due {
            let Some(f) = self.in_flight.remove(id) else { continue };
            if let Some(e) = self.endpoints.get(f.endpoint) {
                self.overdue.insert(id, (e.address.clone(), f.kept), now);
            }
        }
        self.finished.expire(now, FINISHED_MEMORY);
        self.records.expire(now, RECORD_TTL);
        self.overdue.expire(now, self.expiry.ttl);
        due.len()
    }

    /// The tracked requests each endpoint's engine does not vouch for: the oldest of those
    /// dispatched [`SHOWS_WITHIN`] before its last fresh scrape, as many as their sequences
    /// exceed what that scrape showed running and waiting (plus [`VOUCH_SLACK`]). Reports
    /// can be lost (they went to another replica, the Envoy that held them exited) and a
    /// holder of the token can dispatch ids no client sent: either way the books would count
    /// load the engine does not have, for up to `in_flight_ttl_s`. The engine's own count is
    /// the one thing neither can forge, so it bounds the books to what it shows plus the last
    /// few seconds of dispatches. The oldest go first: a request that ended unreported ended
    /// before the ones still running.
    fn unvouched(&self, now: Instant) -> Vec<String> {
        // Per endpoint whose engine vouches: the dispatch time before which a request must
        // show, and the sequences it showed (plus the slack).
        let vouching: Vec<Option<(Instant, u32)>> = self
            .endpoints
            .iter()
            .map(|e| {
                let (m, at) = (e.metrics?, e.scraped_at?);
                if !m.queue_read || now.saturating_duration_since(at) > VOUCH_FRESH {
                    return None;
                }
                Some((at.checked_sub(SHOWS_WITHIN)?, m.running.saturating_add(m.waiting).saturating_add(VOUCH_SLACK)))
            })
            .collect();
        // One pass over the books, however many endpoints: the old enough requests of each.
        let mut old: Vec<Vec<(&String, Instant, u32)>> = vec![Vec::new(); vouching.len()];
        for (id, f) in self.in_flight.iter().filter(|(_, f)| !f.reserved) {
            if let Some(Some((cutoff, _))) = vouching.get(f.endpoint) {
                if f.dispatched_at <= *cutoff {
                    old[f.endpoint].push((id, f.dispatched_at, f.sequences));
                }
            }
        }
        let mut out = Vec::new();
        for (mut held_there, vouch) in old.into_iter().zip(&vouching) {
            let Some((_, shown)) = *vouch else { continue };
            let mut held: u32 = held_there.iter().fold(0u32, |n, (.., k)| n.saturating_add(*k));
            if held <= shown {
                continue;
            }
            held_there.sort_unstable_by_key(|(id, t, _)| (*t, *id));
            for (id, _, k) in held_there {
                if held <= shown {
                    break;
                }
                held = held.saturating_sub(k);
                out.push(id.clone());
            }
        }
        out
    }

    /// (requests dispatched and tracked in flight, finished ids remembered): both bounded
    /// by `max_in_flight`. Flow-control reservations are not dispatches and not counted.
    pub fn tracked(&self) -> (usize, usize) {
        (self.in_flight.values().filter(|f| !f.reserved).count(), self.finished.len())
    }

    /// Predict answers kept for their dispatch: bounded by `max_in_flight`, each for
    /// [`RECORD_TTL`] at most.
    pub fn records_kept(&self) -> usize {
        self.records.len()
    }

    /// About the bytes the records hold ([`Record::bytes`]): at most [`MAX_RECORD_BYTES`].
    pub fn records_bytes(&self) -> usize {
        self.records.weight()
    }

    /// What the Gateway API Inference Extension's `inference_pool_*` gauges show: the
    /// endpoints whose engine metrics are no older than `stale_after` (ready: the scrape
    /// reaches them), and their mean KV use, queue and running requests (0 with none ready).
    pub fn gauges(&self, now: Instant, stale_after: Duration) -> PoolGauges {
        let ready: Vec<(&str, EngineMetrics)> = self
            .endpoints
            .iter()
            .filter(|e| e.scraped_at.is_some_and(|t| now.saturating_duration_since(t) <= stale_after))
            .filter_map(|e| Some((e.address.as_str(), e.metrics?)))
            .collect();
        let n = ready.len().max(1) as f64;
        let mean = |f: fn(&EngineMetrics) -> f64| ready.iter().map(|(_, m)| f(m)).sum::<f64>() / n;
        PoolGauges {
            ready: ready.len(),
            kv_usage: mean(|m| m.kv_usage),
            waiting: mean(|m| f64::from(m.waiting)),
            running: mean(|m| f64::from(m.running)),
            waiting_by_endpoint: ready.iter().map(|(a, m)| (a.to_string(), m.waiting)).collect(),
        }
    }

    /// Requests in flight per endpoint, in endpoint order, in one pass over the requests
    /// (reservations not counted): what `/metrics` and `/v1/pools` show.
    pub fn in_flight_by_endpoint(&self) -> Vec<usize> {
        let mut counts = vec![0; self.endpoints.len()];
        for f in self.in_flight.values().filter(|f| !f.reserved) {
            if let Some(n) = counts.get_mut(f.endpoint) {
                *n += 1;
            }
        }
        counts
    }

    /// Requests dispatched to the endpoint at `address` and in flight (reservations aside).
    pub fn in_flight_on(&self, address: &str) -> usize {
        let Some(i) = self.index_of(address) else { return 0 };
        self.in_flight.values().filter(|f| f.endpoint == i && !f.reserved).count()
    }

    /// The feature state of every endpoint for `request`, in endpoint order. What the
    /// requests in flight add is summed once per moment and change of the books
    /// (`books::Books::booked`), so a round judging many waiting requests pays it once.
    pub fn states_for(&mut self, request: &RequestFeatures, now: Instant) -> Vec<EndpointState> {
        let events = self.first_token_events(now);
        let costs: Vec<Option<f64>> =
            (0..self.endpoints.len()).map(|i| self.cost_of(i).map(|c| c.prefill_ms_per_token)).collect();
        let booked = self.in_flight.booked(self.endpoints.len(), now, events, |i, prompts| {
            costs.get(i).copied().flatten().map(|ms| prefill_backlog(prompts, ms, now))
        });
        let own_tpot_slo = request.streamed_tpot_slo_ms();
        let tenant = books::tenant_key(&request.tenant);
        self.endpoints
            .iter()
            .zip(booked)
            .zip(costs)
            .map(|((e, b), prefill_ms_per_token)| {
                let m = e.metrics.unwrap_or_default();
                // Only a running request of a higher band, or of the asker's band and tenant,
                // tightens its target.
                let (tightest_tpot_slo_ms, tighter_tpot_in_flight) = b.slos_for(request.priority, tenant, own_tpot_slo);
                EndpointState {
                    running: m.running,
                    waiting: m.waiting,
                    kv_usage: m.kv_usage,
                    prefix_match: e.prefix.match_fraction(&request.prefix_hashes),
                    metrics_age_ms: e.scraped_at.map(|t| now.saturating_duration_since(t).as_millis() as u64),
                    hardware_class: e.hardware_class,
                    recent_tpot_ms: e.recent_tpot_ms,
                    prefill_tokens_per_s: e.prefill_rate(now),
                    max_context_tokens: e.max_context_tokens,
                    prefill_ms_per_token,
                    in_flight: b.in_flight,
                    tokens_in_flight: b.tokens_in_flight,
                    uncached_tokens_in_flight: b.uncached_tokens_in_flight,
                    prefill_backlog_tokens: Some(b.prefill_backlog_tokens.unwrap_or(b.uncached_tokens_in_flight)),
                    tightest_tpot_slo_ms,
                    tighter_tpot_in_flight,
                }
                // Held to the contract's bounds here, at the source: a filter leaves out an
                // endpoint whose state breaks them.
                .bounded()
            })
            .collect()
    }
}

/// Uncached prompt tokens of `prompts` (dispatch instant, tokens) the engine has likely not
/// prefilled by `now`: each starts when it was dispatched or when the one before it ends,
/// whichever is later (first come first served, as a vLLM engine schedules prefills), and
/// takes `ms_per_token` a token.
///
/// Why: a prompt counted whole until its first token is seen reads as work ahead of every
/// request placed meanwhile, though the engine may have finished most of it. On the
/// accuracy run the TTFT error was 23% where such a prompt was ahead at dispatch and 14%
/// where none was (docs/notebook/predictor.md, "Training replayed offline").
fn prefill_backlog(prompts: &mut [(Instant, u64)], ms_per_token: f64, now: Instant) -> u64 {
    if !(ms_per_token.is_finite() && ms_per_token > 0.0) {
        return prompts.iter().map(|p| p.1).sum();
    }
    // Prompts dispatched in the same instant (one dispatch batch) in a fixed order: the
    // books' order is a hash map's.
    prompts.sort_unstable();
    let mut free_at: Option<Instant> = None;
    let mut left = 0u64;
    for (i, &(dispatched, tokens)) in prompts.iter().enumerate() {
        let start = free_at.map_or(dispatched, |f| f.max(dispatched));
        let takes = Duration::try_from_secs_f64(tokens as f64 * ms_per_token / 1000.0).unwrap_or(Duration::MAX);
        let Some(end) = start.checked_add(takes) else {
            // Beyond what an Instant holds: none of it, nor what follows, is done.
            return prompts[i..].iter().fold(left, |sum, p| sum.saturating_add(p.1));
        };
        free_at = Some(end);
        let remaining_ms = end.saturating_duration_since(now).as_secs_f64() * 1000.0;
        left = left.saturating_add(((remaining_ms / ms_per_token).ceil() as u64).min(tokens));
    }
    left
}

/// Every pool, each behind its own lock.
#[derive(Debug)]
pub struct Pools {
    pools: HashMap<String, Mutex<Pool>>,
}

impl Pools {
    /// Every pool of `config`; each hardware class's engine costs `costs[class]`
    /// (`Pool::with_class_costs`).
    pub fn from_config(config: &Config, costs: &[ClassCost]) -> Pools {
        let pools = config
            .pools
            .iter()
            .map(|p| {
                let endpoints = p
                    .endpoints
                    .iter()
                    .map(|a| (a.clone(), p.hardware.get(a).map_or(0, |name| config.hardware_class(name))))
                    .collect();
                let pool = Pool::with_hardware(&p.name, endpoints, config.prefix_blocks_per_endpoint)
                    .with_max_in_flight(config.max_in_flight)
                    .with_caller_share(config.callers.in_flight_share)
                    .with_expiry(Expiry {
                        ttl: Duration::from_secs(config.in_flight_ttl_s),
                        multiple: config.in_flight_expiry_multiple,
                        floor: Duration::from_secs(config.in_flight_min_s),
                    })
                    .with_class_costs(costs.to_vec())
                    .with_passive_health(config.passive_health);
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
mod tests;

#[cfg(test)]
mod books_tests;
