//! Pools, their endpoints, and what is known of each endpoint: scraped engine
//! metrics, requests dispatched there and not yet reported, cached prefixes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use headroom_protocol::health::{EjectionPolicy, Outcome, PassiveHealth, Recorded};
use headroom_protocol::{Dispatch, EndpointState, RequestFeatures};

use crate::config::Config;
use headroom_protocol::prefix::PrefixCache;

mod books;
use books::Books;

/// Engine metrics read from an endpoint's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineMetrics {
    pub running: u32,
    pub waiting: u32,
    pub kv_usage: f64,
    /// vLLM's inter-token latency histogram as read (cumulative); `None` when the server
    /// exposes none.
    pub decode: Option<DecodeCounter>,
    /// Whether the scrape read the engine's running or waiting count (a server whose metrics
    /// name neither leaves both 0): only a count read can vouch for the books ([`Pool::expire`]).
    pub queue_read: bool,
}

/// The cumulative sum and count of a server's inter-token latency histogram: the time
/// between consecutive output tokens of each request, summed over every token it made.
/// Between two scrapes, the sum's growth over the count's is the mean time between tokens
/// of what was decoded meanwhile: the step time the server runs at now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeCounter {
    pub sum_s: f64,
    pub tokens: f64,
}

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

/// A request dispatched to an endpoint and not yet reported.
#[derive(Debug, Clone)]
struct InFlight {
    endpoint: usize,
    input_tokens: u32,
    uncached_tokens: u64,
    expected_output: u32,
    /// The sequences the engine runs for it (`n`, `best_of`, a list's prompts): each counts
    /// as a request in flight, with its own output tokens.
    sequences: u32,
    /// Its TPOT SLO where it may tighten later requests' targets (`states_for`): only a
    /// request placed by its goals (`prediction_based`), and only a goal that leaves the
    /// endpoint room for others, at least [`CLAIM_FLOOR`] times its fastest decode step
    /// ([`ClassCost::fastest_tpot_ms`]). A goal under that can be kept only with a batch of a
    /// few: honoured, it would hand the endpoint to one client (two streams asking the
    /// simulated H100's fastest step sent 181 of 198 other tenants' streams to the A100), and
    /// a client asking 1 ms a token would make every later request there look negative. A
    /// goal the endpoint keeps only while lightly loaded does tighten: that is what
    /// protecting it is for. (Judged on the prediction under load
    /// instead, a p90 objective put two thirds of long-short's interactive streams past
    /// their 40 ms near the cliff; they protected nothing, and batch and sheddable work
    /// piled onto them: interactive attainment 84% instead of 96% at 42.5 req/s.)
    tpot_slo_ms: Option<f64>,
    /// Its priority: its SLO tightens the targets of requests in its band and below only.
    priority: i32,
    /// Predicted end of prefill (dispatch + predicted TTFT).
    prefill_done_by: Option<Instant>,
    /// Its first token passed the gateway: past prefill, observed.
    past_prefill: bool,
    dispatched_at: Instant,
    /// When it is forgotten if no report came (`Expiry::lifetime`).
    expires_at: Instant,
    /// Reserved by flow control when it released the request (`Pool::reserve`), not yet
    /// confirmed by the gateway's dispatch batch: forgotten after [`RESERVATION_TTL`].
    reserved: bool,
    /// What the predictor saw of it where it went, from its record; `None`: dispatched
    /// without a record here (the gateway fell back, or another replica predicted it).
    kept: Option<Box<Kept>>,
}

/// What the predictor itself saw of a request at the endpoint it was dispatched to, at
/// predict time: what a report of it is completed with before the predictor learns from
/// it, so training rows and calibration come from the predictor's own values, never from
/// an echo of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    /// The request's features (prefix hashes dropped: they served placement).
    pub request: RequestFeatures,
    /// The endpoint's state then: the model's input.
    pub state: EndpointState,
    pub predicted_ttft_ms: Option<f64>,
    pub predicted_tpot_ms: Option<f64>,
}

/// What one predict answer said for a request: its features and, per endpoint address,
/// the state and the predictions (TTFT, TPOT) answered.
#[derive(Debug, Clone)]
struct Record {
    request: RequestFeatures,
    endpoints: Vec<(String, EndpointState, Option<f64>, Option<f64>)>,
}

impl Record {
    /// About the bytes it holds: its prefix hashes and its endpoints' states grow with the
    /// prompt and the pool (a pool of 1,000 endpoints makes each record some 200 KB).
    fn bytes(&self) -> usize {
        let endpoint = std::mem::size_of::<(String, EndpointState, Option<f64>, Option<f64>)>();
        std::mem::size_of::<Record>()
            + self.request.prefix_hashes.len() * std::mem::size_of::<u64>()
            + self.request.model.len()
            + self.endpoints.iter().map(|(a, ..)| endpoint + a.len()).sum::<usize>()
    }
}

/// Most bytes a pool's records hold ([`Record::bytes`]); past it the oldest are forgotten,
/// and their dispatches are tracked without a record. Counted alone, 100,000 records of
/// 4,096 prefix hashes held 3.3 GB.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// How long a predict answer's record waits for its dispatch: the gateway dispatches on
/// its next tick (20 ms by default) after the answer; a record not dispatched by then
/// belongs to a request the gateway placed without it, or never sent.
const RECORD_TTL: Duration = Duration::from_secs(10);

impl InFlight {
    /// `r` sent to endpoint `endpoint` at `now`, `prefix` of its prompt cached there, with
    /// its predicted TTFT there, tracked for `lifetime` without a report; the endpoint's
    /// fastest decode step `fastest_tpot_ms` (none known: every SLO protects);
    /// `reserved`: by flow control, not yet dispatched.
    fn new(
        endpoint: usize,
        r: &RequestFeatures,
        prefix: f64,
        (ttft_ms, fastest_tpot_ms): (Option<f64>, Option<f64>),
        (now, lifetime): (Instant, Duration),
        reserved: bool,
        kept: Option<Box<Kept>>,
    ) -> Self {
        let protects =
            |slo: &f64| r.prediction_based && fastest_tpot_ms.is_none_or(|fastest| *slo >= fastest * CLAIM_FLOOR);
        InFlight {
            endpoint,
            input_tokens: r.input_tokens,
            uncached_tokens: (f64::from(r.input_tokens) * (1.0 - prefix)).round() as u64,
            expected_output: r.max_tokens.unwrap_or(DEFAULT_EXPECTED_OUTPUT),
            sequences: r.sequence_count(),
            tpot_slo_ms: r.streamed_tpot_slo_ms().filter(protects),
            priority: r.priority,
            // Checked: a prediction too large for an Instant means "not known", never a panic.
            prefill_done_by: ttft_ms
                .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok())
                .and_then(|d| now.checked_add(d)),
            past_prefill: false,
            dispatched_at: now,
            expires_at: now.checked_add(lifetime).unwrap_or(now),
            reserved,
            kept,
        }
    }
}

/// The tightest TPOT goal a running request may hold its endpoint's later requests to, as a
/// multiple of the endpoint's fastest decode step (one sequence alone): twice leaves a batch
/// of many (the simulated H100 decodes 32 sequences of 1,000 tokens in under twice its
/// single step), and no workload's tightest class (40 ms on 7) comes near it.
const CLAIM_FLOOR: f64 = 2.0;

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
    /// The time between tokens it runs at now: from its inter-token latency histogram
    /// between scrapes where it exposes one, else a moving average of the TPOTs reported
    /// there (which arrive when requests end, seconds after the steps they describe).
    recent_tpot_ms: Option<f64>,
    /// The histogram as of the start of the window being measured.
    decode_from: Option<(DecodeCounter, Instant)>,
    /// When the histogram last moved `recent_tpot_ms`: reports do not, while it does.
    decode_seen_at: Option<Instant>,
    /// Uncached prompt tokens dispatched there per second, decaying with [`PREFILL_RATE_TAU`],
    /// as of `prefill_rate_at`.
    prefill_rate: f64,
    prefill_rate_at: Option<Instant>,
    /// Its model's context length (`/v1/models`' `max_model_len`), once read.
    pub max_context_tokens: Option<u32>,
}

/// Weight of the newest TPOT report in an endpoint's moving average.
const RECENT_TPOT_WEIGHT: f64 = 0.2;
/// Time constant of the step time read from the histogram: long enough to average over
/// the steps that carry a prefill chunk and those that do not (tens of steps at real
/// speed), short enough to follow a batch that fills within seconds.
const DECODE_TAU: Duration = Duration::from_secs(1);
/// Tokens a window of the histogram must hold before it says anything: fewer (a nearly
/// idle server) are a step or two, noise.
const DECODE_MIN_TOKENS: f64 = 32.0;
/// A window that takes longer to reach [`DECODE_MIN_TOKENS`] describes no "now": it is
/// dropped and the next one starts.
const DECODE_MAX_WINDOW: Duration = Duration::from_secs(5);
/// While the histogram moved `recent_tpot_ms` this recently, reports leave it alone.
const DECODE_FRESH: Duration = Duration::from_secs(10);
/// Time constant of an endpoint's recent prefill rate. 30 s was tried (2026-11-27): flow
/// control on the prior held more of mixed traffic past the cliff, less of the bursty
/// azure trace, and the trained models' TTFT lost accuracy (docs/predictor.md, "The
/// prefill rate over 30 seconds").
const PREFILL_RATE_TAU: Duration = Duration::from_secs(5);

impl Endpoint {
    /// The server refused a connection: it is down, or back as a new process. Its engine
    /// state is unknown from now on, and so is its prefix cache: a restarted server starts
    /// with an empty one, so the blocks remembered for it would draw requests there for
    /// cache hits it no longer has.
    pub fn unreachable(&mut self) {
        self.metrics = None;
        self.scraped_at = None;
        self.decode_from = None;
        self.prefix.shrink_to(0);
    }

    /// Files a successful scrape read at `now`.
    pub fn scraped(&mut self, m: EngineMetrics, now: Instant) {
        self.metrics = Some(m);
        self.scraped_at = Some(now);
        self.fold_decode(m.decode, now);
    }

    /// Moves `recent_tpot_ms` towards the mean time between tokens decoded since the
    /// window began, once the window holds [`DECODE_MIN_TOKENS`]. A histogram that went
    /// backwards (the server restarted) or a window too old starts a new window.
    fn fold_decode(&mut self, now_counter: Option<DecodeCounter>, now: Instant) {
        let Some(c) = now_counter else {
            self.decode_from = None;
            return;
        };
        let Some((from, at)) = self.decode_from else {
            self.decode_from = Some((c, now));
            return;
        };
        let (tokens, sum_s) = (c.tokens - from.tokens, c.sum_s - from.sum_s);
        let span = now.saturating_duration_since(at);
        if tokens < 0.0 || sum_s < 0.0 || span > DECODE_MAX_WINDOW {
            self.decode_from = Some((c, now));
            return;
        }
        if tokens < DECODE_MIN_TOKENS {
            return;
        }
        self.decode_from = Some((c, now));
        let step_ms = sum_s / tokens * 1000.0;
        if !(step_ms.is_finite() && step_ms > 0.0) {
            return;
        }
        let w = 1.0 - (-span.as_secs_f64() / DECODE_TAU.as_secs_f64()).exp();
        self.recent_tpot_ms = Some(match self.decode_seen_at.and(self.recent_tpot_ms) {
            Some(avg) => (1.0 - w) * avg + w * step_ms,
            // The first reading replaces what reports said.
            None => step_ms,
        });
        self.decode_seen_at = Some(now);
    }

    /// A TPOT reported for a request served there, at `now`: moves `recent_tpot_ms`
    /// unless the histogram does.
    fn reported_tpot(&mut self, tpot_ms: f64, now: Instant) {
        if self.decode_seen_at.is_some_and(|t| now.saturating_duration_since(t) < DECODE_FRESH) {
            return;
        }
        self.decode_seen_at = None;
        if tpot_ms.is_finite() && tpot_ms > 0.0 {
            let w = RECENT_TPOT_WEIGHT;
            self.recent_tpot_ms = Some(self.recent_tpot_ms.map_or(tpot_ms, |avg| (1.0 - w) * avg + w * tpot_ms));
        }
    }

    /// The recent prefill rate decayed to `now`.
    fn prefill_rate(&self, now: Instant) -> f64 {
        self.prefill_rate_at.map_or(0.0, |t| {
            let dt = now.saturating_duration_since(t).as_secs_f64();
            self.prefill_rate * (-dt / PREFILL_RATE_TAU.as_secs_f64()).exp()
        })
    }

    /// Adds `tokens` of prefill dispatched at `now` to the rate.
    fn add_prefill(&mut self, tokens: u64, now: Instant) {
        self.prefill_rate = self.prefill_rate(now) + tokens as f64 / PREFILL_RATE_TAU.as_secs_f64();
        self.prefill_rate_at = Some(now);
    }
}

/// Output tokens assumed for a request that gave no `max_tokens`.
const DEFAULT_EXPECTED_OUTPUT: u32 = 256;

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
}

impl Finished {
    /// The address it was dispatched to, when this pool saw the dispatch.
    pub fn address(&self) -> Option<&str> {
        match self {
            Finished::Tracked(a, _) | Finished::Late(a, _) => Some(a),
            Finished::Unknown => None,
        }
    }

    /// What the predictor kept of it, when it was dispatched here with a record.
    pub fn kept(&self) -> Option<&Kept> {
        match self {
            Finished::Tracked(_, k) | Finished::Late(_, k) => k.as_deref(),
            Finished::Unknown => None,
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

/// Request ids seen recently, each with a value, oldest first: bounded in count and
/// forgotten after a time, so a flood of reports for unknown ids cannot grow memory. An id
/// keeps its first value ([`RecentIds::insert`]) or takes the newest ([`RecentIds::replace`]);
/// each entry of the order names the value it was made for, so one removed or replaced
/// since does not take a newer value with it when it comes round. Values can also be weighed
/// ([`RecentIds::weighed`]): past the weight allowed, the oldest go too.
#[derive(Debug)]
struct RecentIds<V = ()> {
    order: VecDeque<(String, Instant, u64)>,
    ids: HashMap<String, (V, u64)>,
    cap: usize,
    next: u64,
    weigh: fn(&V) -> usize,
    weight: usize,
    max_weight: usize,
}

impl<V> RecentIds<V> {
    fn new(cap: usize) -> Self {
        RecentIds::weighed(cap, usize::MAX, |_| 0)
    }

    /// At most `cap` ids, whose values `weigh` at most `max_weight` together.
    fn weighed(cap: usize, max_weight: usize, weigh: fn(&V) -> usize) -> Self {
        RecentIds {
            order: VecDeque::new(),
            ids: HashMap::new(),
            cap: cap.max(1),
            next: 0,
            weigh,
            weight: 0,
            max_weight,
        }
    }

    /// Remembers `value` for `id` unless `id` has one already.
    fn insert(&mut self, id: &str, value: V, now: Instant) {
        if !self.ids.contains_key(id) {
            self.replace(id, value, now);
        }
    }

    /// Remembers `value` for `id`, in place of any it had, as of `now`.
    fn replace(&mut self, id: &str, value: V, now: Instant) {
        self.next += 1;
        self.weight = self.weight.saturating_add((self.weigh)(&value));
        if let Some((old, _)) = self.ids.insert(id.to_string(), (value, self.next)) {
            self.weight = self.weight.saturating_sub((self.weigh)(&old));
        }
        self.order.push_back((id.to_string(), now, self.next));
        while self.order.len() > self.cap || (self.weight > self.max_weight && !self.order.is_empty()) {
            self.pop_oldest();
        }
    }

    fn contains(&self, id: &str) -> bool {
        self.ids.contains_key(id)
    }

    /// Takes `id`'s value; its place in the order goes when it is the oldest.
    fn remove(&mut self, id: &str) -> Option<V> {
        let (v, _) = self.ids.remove(id)?;
        self.weight = self.weight.saturating_sub((self.weigh)(&v));
        Some(v)
    }

    fn pop_oldest(&mut self) {
        if let Some((id, _, seq)) = self.order.pop_front() {
            if self.ids.get(&id).is_some_and(|(_, s)| *s == seq) {
                self.remove(&id);
            }
        }
    }

    fn expire(&mut self, now: Instant, memory: Duration) {
        while self.order.front().is_some_and(|(_, t, _)| now.saturating_duration_since(*t) >= memory) {
            self.pop_oldest();
        }
    }

    /// Ids remembered.
    fn len(&self) -> usize {
        self.ids.len()
    }
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
                    Endpoint {
                        address,
                        metrics: None,
                        scraped_at: None,
                        scrape_errors: 0,
                        hardware_class: class,
                        prefix: PrefixCache::new(self.prefix_blocks),
                        recent_tpot_ms: None,
                        decode_from: None,
                        decode_seen_at: None,
                        prefill_rate: 0.0,
                        prefill_rate_at: None,
                        max_context_tokens: None,
                    }
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

    /// Starts tracking a dispatched request: with this predictor's record of it, the
    /// features and predictions it answered; without one, the features the dispatch carries.
    pub fn dispatch(&mut self, d: &Dispatch, now: Instant) -> Applied {
        let Some(i) = self.index_of(&d.endpoint) else { return Applied::UnknownEndpoint };
        if self.finished.contains(&d.request_id) {
            return Applied::AlreadyFinished;
        }
        // The same dispatch again (a batch whose call timed out after the predictor applied it,
        // resent): the first stays, with its first-token state and its prefix match.
        if let Some(f) = self.in_flight.get(&d.request_id).filter(|f| !f.reserved && f.endpoint == i) {
            return if f.kept.is_some() { Applied::Accepted } else { Applied::AcceptedWithoutRecord };
        }
        if self.in_flight.len() >= self.max_in_flight && !self.in_flight.contains_key(&d.request_id) {
            return Applied::PoolFull;
        }
        let record = self.records.remove(&d.request_id);
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
        let f = InFlight::new(i, request, prefix, (predicted.0, fastest), (now, lifetime), false, kept);
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
        self.records.weight
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
        self.endpoints
            .iter()
            .zip(booked)
            .zip(costs)
            .map(|((e, b), prefill_ms_per_token)| {
                let m = e.metrics.unwrap_or_default();
                // Only a running request of the asker's band or a higher one tightens its target.
                let (tightest_tpot_slo_ms, tighter_tpot_in_flight) = b.slos_for(request.priority, own_tpot_slo);
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

/// Test set-up: `d`'s request as this predictor answered it (`predicted`, TTFT and TPOT, at
/// `d.endpoint`; nothing elsewhere), then dispatched.
#[cfg(test)]
impl Pool {
    pub(crate) fn predicted_then_dispatched(
        &mut self,
        d: &Dispatch,
        predicted: (Option<f64>, Option<f64>),
        now: Instant,
    ) -> Applied {
        let states = vec![EndpointState::default(); self.endpoints.len()];
        let answers: Vec<_> =
            self.endpoints.iter().map(|e| if e.address == d.endpoint { predicted } else { (None, None) }).collect();
        self.remember(&d.request_id, &d.request, &states, &answers, now);
        self.dispatch(d, now)
    }
}

#[cfg(test)]
mod tests {
    use super::books::FIRST_TOKEN_GRACE;
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
                prediction_based: true,
                ..Default::default()
            },
        }
    }

    fn pool() -> Pool {
        Pool::new("p", &["a:1".into(), "b:2".into()], 100)
    }

    /// A dispatch of a request the predictor answered: the request and the endpoint, nothing else.
    fn lean(id: &str, endpoint: &str) -> Dispatch {
        Dispatch { request: RequestFeatures::default(), ..dispatch(id, endpoint, 0, None) }
    }

    /// What a predict answer for `id` said: 500 tokens, `b:2` at `ttft` ms.
    fn remember(p: &mut Pool, id: &str, ttft: f64, now: Instant) {
        let request = RequestFeatures { input_tokens: 500, max_tokens: Some(10), ..Default::default() };
        let states =
            [EndpointState { running: 1, ..Default::default() }, EndpointState { running: 7, ..Default::default() }];
        p.remember(id, &request, &states, &[(Some(10.0), Some(5.0)), (Some(ttft), Some(6.0))], now);
    }

    /// Predict batches of 4,096 prefix hashes a request, 100,000 of them, took the predictor
    /// to 3.3 GB: the records are weighed, and past [`MAX_RECORD_BYTES`] the oldest go (their
    /// dispatches are tracked without a record); the newest are kept whole.
    #[test]
    fn records_hold_at_most_their_byte_cap_and_keep_the_newest() {
        let mut p = pool();
        let now = Instant::now();
        let request = RequestFeatures { prefix_hashes: vec![7; 4_096], ..Default::default() };
        let states = [EndpointState::default(), EndpointState::default()];
        let n = MAX_RECORD_BYTES / (4_096 * 8) + 500;
        for k in 0..n {
            p.remember(&format!("r{k}"), &request, &states, &[(None, None), (None, None)], now);
        }
        assert!(p.records_bytes() <= MAX_RECORD_BYTES, "{}", p.records_bytes());
        assert!(p.records_kept() < n - 500 && p.records_kept() > (n - 500) * 9 / 10, "{}", p.records_kept());
        assert_eq!(p.dispatch(&lean(&format!("r{}", n - 1), "a:1"), now), Applied::Accepted, "the newest kept");
        assert_eq!(p.dispatch(&lean("r0", "a:1"), now), Applied::AcceptedWithoutRecord, "the oldest went");
        let before = p.records_bytes();
        p.expire(now + RECORD_TTL);
        assert_eq!((p.records_kept(), p.records_bytes()), (0, 0), "weights leave with their records ({before})");
    }

    #[test]
    fn pool_gauges_average_the_endpoints_with_fresh_metrics_only() {
        let mut p = Pool::new("p", &["a:1".into(), "b:2".into(), "c:3".into()], 100);
        let t0 = Instant::now();
        let none = p.gauges(t0, Duration::from_secs(5));
        assert_eq!((none.ready, none.kv_usage, none.waiting), (0, 0.0, 0.0), "nothing scraped: no division by zero");
        let m =
            |running, waiting, kv_usage| EngineMetrics { running, waiting, kv_usage, decode: None, queue_read: true };
        p.endpoints[0].scraped(m(2, 1, 0.2), t0);
        p.endpoints[1].scraped(m(4, 3, 0.6), t0 + Duration::from_secs(4));
        p.endpoints[2].scraped(m(9, 9, 0.9), t0);
        p.endpoints[2].unreachable();
        let g = p.gauges(t0 + Duration::from_secs(6), Duration::from_secs(5));
        assert_eq!(g.ready, 1, "a's scrape is 6 s old, c is unreachable");
        assert_eq!(g.waiting_by_endpoint, [("b:2".to_string(), 3)]);
        let g = p.gauges(t0 + Duration::from_secs(5), Duration::from_secs(5));
        assert_eq!((g.ready, g.running, g.waiting), (2, 3.0, 2.0));
        assert!((g.kv_usage - 0.4).abs() < 1e-12);
    }

    #[test]
    fn a_lean_dispatch_is_tracked_from_the_predictors_own_record() {
        let mut p = pool();
        let now = Instant::now();
        remember(&mut p, "r", 300.0, now);
        // Flow control answered again at release: the newer answer is the one dispatched on.
        remember(&mut p, "r", 80.0, now + Duration::from_millis(5));
        assert_eq!(p.dispatch(&lean("r", "b:2"), now), Applied::Accepted);
        assert_eq!(p.records_kept(), 0, "the record moved into the books");
        assert_eq!(p.states_for(&RequestFeatures::default(), now)[1].uncached_tokens_in_flight, 500);
        let Finished::Tracked(at, Some(kept)) = p.finish("r", now) else { panic!("tracked with its record") };
        assert_eq!(at, "b:2");
        assert_eq!(kept.state.running, 7, "the state of the endpoint it went to");
        assert_eq!((kept.predicted_ttft_ms, kept.predicted_tpot_ms), (Some(80.0), Some(6.0)));
        assert_eq!(kept.request.input_tokens, 500);
    }

    #[test]
    fn a_dispatch_without_a_record_counts_as_load_and_keeps_nothing_to_learn_from() {
        let mut p = pool();
        let now = Instant::now();
        // Predicted by another replica: a lean dispatch says only where it went.
        assert_eq!(p.dispatch(&lean("elsewhere", "a:1"), now), Applied::AcceptedWithoutRecord);
        assert_eq!(p.in_flight_on("a:1"), 1);
        // Placed by the filter's fallback: the features its dispatch carries count as load.
        assert_eq!(p.dispatch(&dispatch("fallback", "a:1", 400, None), now), Applied::AcceptedWithoutRecord);
        assert_eq!(p.states_for(&RequestFeatures::default(), now)[0].uncached_tokens_in_flight, 400);
        // Nothing says how long they run: held for the floor, not the ten-minute ceiling.
        assert_eq!(p.expire(now + Expiry::default().floor), 2);
        assert_eq!(p.finish("elsewhere", now), Finished::Late("a:1".into(), None));
        assert_eq!(p.finish("fallback", now), Finished::Late("a:1".into(), None));
    }

    #[test]
    fn records_are_bounded_and_forgotten_undispatched() {
        let mut p = pool().with_max_in_flight(3);
        let now = Instant::now();
        for i in 0..10 {
            remember(&mut p, &format!("r{i}"), 100.0, now);
        }
        assert_eq!(p.records_kept(), 3, "the oldest go first");
        assert_eq!(p.dispatch(&lean("r0", "a:1"), now), Applied::AcceptedWithoutRecord);
        assert_eq!(p.dispatch(&lean("r9", "a:1"), now), Applied::Accepted);
        p.expire(now + RECORD_TTL);
        assert_eq!(p.records_kept(), 0, "a record is kept for its dispatch, not longer");
    }

    #[test]
    fn dispatch_and_report_track_in_flight() {
        let mut p = pool();
        let now = Instant::now();
        assert_eq!(p.dispatch(&dispatch("r1", "a:1", 100, Some(20.0)), now), Applied::AcceptedWithoutRecord);
        assert_eq!(p.dispatch(&dispatch("r2", "a:1", 50, Some(10.0)), now), Applied::AcceptedWithoutRecord);
        assert_eq!(p.dispatch(&dispatch("r3", "zz:9", 50, None), now), Applied::UnknownEndpoint);
        let s = p.states_for(&RequestFeatures::default(), now);
        assert_eq!(s[0].in_flight, 2);
        assert_eq!(s[0].tokens_in_flight, 170);
        assert_eq!(s[0].tightest_tpot_slo_ms, Some(10.0));
        assert_eq!(s[1].in_flight, 0);
        // Counted against the asking request's own TPOT SLO: the decodes it would slow past theirs.
        let asking =
            |tpot| RequestFeatures { streaming: true, slo: Slo { ttft_ms: None, tpot_ms: tpot }, ..Default::default() };
        let mut tighter = |tpot| p.states_for(&asking(tpot), now)[0].tighter_tpot_in_flight;
        assert_eq!((tighter(Some(150.0)), tighter(Some(15.0)), tighter(Some(10.0)), tighter(None)), (2, 1, 0, 0));
        assert_eq!(p.finish("r1", now), Finished::Tracked("a:1".into(), None));
        p.finish("r2", now);
        assert_eq!(p.in_flight_on("a:1"), 0);
        assert_eq!(
            p.finish("never-dispatched", now),
            Finished::Unknown,
            "a report for an unseen request is not tracked"
        );
    }

    /// Invented dispatches (a token holder's) and lost reports held load the engine never had
    /// for up to `in_flight_ttl_s`: 10,000 ids put 10,000 requests on an idle endpoint. Its
    /// engine's count bounds them: once they are [`SHOWS_WITHIN`] older than a fresh scrape,
    /// all but what it shows (and [`VOUCH_SLACK`]) are forgotten, the oldest first, and a
    /// report that comes after all is late, not lost. The newest dispatches stand until their
    /// engine could show them, and a scrape that read no count, or an old one, vouches for
    /// nothing.
    #[test]
    fn the_books_hold_no_more_than_the_engine_shows_beyond_the_newest_dispatches() {
        let mut p = pool();
        let t0 = Instant::now();
        for k in 0..10_000 {
            p.dispatch(&dispatch(&format!("fake{k}"), "a:1", 10, None), t0);
        }
        p.dispatch(&dispatch("real", "a:1", 10, None), t0 + Duration::from_secs(1));
        let later = t0 + SHOWS_WITHIN + Duration::from_secs(2);
        p.dispatch(&dispatch("new", "a:1", 10, None), later);
        let shows = |running| EngineMetrics { running, waiting: 1, kv_usage: 0.1, decode: None, queue_read: true };

        // No count read, then a stale one: nothing is vouched against.
        p.endpoints[0].scraped(EngineMetrics { queue_read: false, ..shows(0) }, later);
        assert_eq!(p.expire(later), 0);
        p.endpoints[0].scraped(shows(0), later);
        assert_eq!(p.expire(later + VOUCH_FRESH + Duration::from_secs(1)), 0);

        // Fresh: 2 running, 1 waiting, so 3 + 4 of the 10,001 old ones stay, the newest of them.
        p.endpoints[0].scraped(shows(2), later);
        assert_eq!(p.expire(later), 10_001 - 7);
        assert_eq!(p.in_flight_on("a:1"), 8, "7 vouched for, and the dispatch too new to show");
        assert!(p.in_flight.contains_key("real") && p.in_flight.contains_key("new"));
        assert_eq!(p.finish("fake0", later), Finished::Late("a:1".into(), None), "a report after all still teaches");
        assert_eq!(p.expire(later), 0, "what the engine shows stays");
        assert_eq!(p.in_flight_on("b:2"), 0);
    }

    /// One client asking a TPOT at or near the endpoint's fastest decode step (7 ms, 5 ms)
    /// used to become the target of every later request on its endpoint: two such streams
    /// took the simulated H100s from every other tenant. A goal tightens others only when it
    /// leaves the endpoint room for a batch (at least twice its fastest step), and only for a
    /// request placed by its goals; then for its own band and those below, also where it was
    /// predicted to miss under load (40 ms, predicted 60): protecting it is what lets the
    /// endpoint get back under its SLO.
    #[test]
    fn only_a_running_slo_that_leaves_room_and_was_routed_by_tightens_and_only_its_band_and_below() {
        let cost = ClassCost { prefill_ms_per_token: 0.03, fastest_tpot_ms: 7.0 };
        let mut p = pool().with_class_costs(vec![cost]);
        let now = Instant::now();
        assert_eq!(p.dispatch(&dispatch("liar", "a:1", 10, Some(5.0)), now), Applied::AcceptedWithoutRecord);
        assert_eq!(p.dispatch(&dispatch("greedy", "a:1", 10, Some(7.0)), now), Applied::AcceptedWithoutRecord);
        assert_eq!(p.dispatch(&dispatch("near", "a:1", 10, Some(13.9)), now), Applied::AcceptedWithoutRecord);
        let honest = dispatch("tight", "b:2", 10, Some(14.0));
        assert_eq!(p.predicted_then_dispatched(&honest, (Some(100.0), Some(7.0)), now), Applied::Accepted);
        let mut unrouted = dispatch("unrouted", "b:2", 10, Some(20.0));
        unrouted.request.prediction_based = false;
        assert_eq!(p.dispatch(&unrouted, now), Applied::AcceptedWithoutRecord);
        let asking = |tpot, priority| RequestFeatures {
            streaming: true,
            priority,
            slo: Slo { ttft_ms: None, tpot_ms: Some(tpot) },
            ..Default::default()
        };
        let s = p.states_for(&asking(100.0, 0), now);
        assert_eq!(
            (s[0].tightest_tpot_slo_ms, s[0].tighter_tpot_in_flight),
            (None, 0),
            "claims under 14 ms are left out"
        );
        assert_eq!((s[1].tightest_tpot_slo_ms, s[1].tighter_tpot_in_flight), (Some(14.0), 1), "the seed's rule");
        let sheddable = p.states_for(&asking(100.0, -1), now);
        assert_eq!(sheddable[1].tightest_tpot_slo_ms, Some(14.0), "a lower band is held to it");
        let above = p.states_for(&asking(100.0, 1), now);
        assert_eq!(above[1].tightest_tpot_slo_ms, None, "a higher band is not");
        p.finish("tight", now);
        let s = p.states_for(&asking(100.0, 0), now);
        assert_eq!(s[1].tightest_tpot_slo_ms, None, "a goal it was not placed by holds nobody");
        assert_eq!(s[1].in_flight, 1, "though its load counts");
        // Predicted to miss its SLO where it runs, but above the floor: it protects.
        let loaded = dispatch("loaded", "a:1", 10, Some(40.0));
        assert_eq!(p.predicted_then_dispatched(&loaded, (Some(100.0), Some(60.0)), now), Applied::Accepted);
        assert_eq!(p.states_for(&asking(100.0, 0), now)[0].tightest_tpot_slo_ms, Some(40.0));
        // With no engine costs known, every goal placed by counts, as the seed's rule has it.
        let mut unknown = pool();
        assert_eq!(unknown.dispatch(&dispatch("liar", "a:1", 10, Some(5.0)), now), Applied::AcceptedWithoutRecord);
        assert_eq!(unknown.states_for(&asking(100.0, 0), now)[0].tightest_tpot_slo_ms, Some(5.0));
    }

    /// `n`, `best_of` and a list's prompts each run as a sequence: each is booked as a
    /// request in flight with its own output.
    #[test]
    fn every_sequence_of_a_request_is_booked() {
        let mut p = pool();
        let now = Instant::now();
        let mut d = dispatch("n4", "a:1", 100, None);
        d.request.sequences = 4;
        p.dispatch(&d, now);
        let s = p.states_for(&RequestFeatures::default(), now);
        assert_eq!((s[0].in_flight, s[0].tokens_in_flight), (4, 100 + 4 * 10));
        p.finish("n4", now);
        let s = p.states_for(&RequestFeatures::default(), now);
        assert_eq!((s[0].in_flight, s[0].tokens_in_flight), (0, 0), "all of them leave with it");
    }

    #[test]
    fn a_huge_predicted_ttft_is_not_a_panic() {
        let mut p = pool();
        let now = Instant::now();
        for (i, ms) in [1e300, 1e22, f64::MAX, f64::INFINITY, f64::NAN, -5.0].into_iter().enumerate() {
            let d = dispatch(&format!("r{i}"), "a:1", 10, None);
            assert_eq!(p.predicted_then_dispatched(&d, (Some(ms), None), now), Applied::Accepted, "{ms}");
        }
        assert_eq!(p.states_for(&RequestFeatures::default(), now)[0].in_flight, 6);
    }

    #[test]
    fn tracking_is_bounded() {
        let mut p = pool().with_max_in_flight(3);
        let now = Instant::now();
        for i in 0..3 {
            let d = dispatch(&format!("r{i}"), "a:1", 1, None);
            assert_eq!(p.predicted_then_dispatched(&d, (Some(100.0), None), now), Applied::Accepted);
        }
        assert_eq!(p.dispatch(&dispatch("r3", "a:1", 1, None), now), Applied::PoolFull);
        for i in 0..100 {
            p.finish(&format!("flood{i}"), now);
        }
        assert_eq!(p.tracked(), (3, 3), "finished ids capped too");
        // Expiry forgets finished ids without any scrape.
        p.expire(now + FINISHED_MEMORY);
        assert_eq!(p.tracked(), (3, 0));
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
    fn a_dispatch_sent_again_keeps_the_first() {
        let mut p = pool();
        let now = Instant::now();
        let mut d = dispatch("r1", "a:1", 100, None);
        d.request.prefix_hashes.clear(); // a resent prompt would otherwise find itself cached
        p.dispatch(&d, now);
        assert!(p.first_token("r1", "a:1", now));
        // Resent after a call that timed out once the predictor had applied it.
        assert_eq!(p.dispatch(&d, now), Applied::AcceptedWithoutRecord);
        let s = p.states_for(&RequestFeatures::default(), now);
        assert_eq!((s[0].in_flight, s[0].uncached_tokens_in_flight), (1, 0), "still past prefill, counted once");
        assert_eq!(p.endpoints[0].prefill_rate(now), 100.0 / PREFILL_RATE_TAU.as_secs_f64(), "its prompt once");
    }

    #[test]
    fn the_prefill_backlog_drains_first_come_first_served_from_each_dispatch() {
        // 0.1 ms a token on class 0 (a:1), twice that on class 1 (b:2).
        let cost = |ms| ClassCost { prefill_ms_per_token: ms, fastest_tpot_ms: 7.0 };
        let mut p = Pool::with_hardware("p", vec![("a:1".into(), 0), ("b:2".into(), 1)], 100)
            .with_class_costs(vec![cost(0.1), cost(0.2)]);
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // No first token expected for a long time.
        let d = |p: &mut Pool, id: &str, endpoint: &str, tokens: u32, hash: u64, at: Instant| {
            let mut d = dispatch(id, endpoint, tokens, None);
            d.request.prefix_hashes = vec![hash]; // nothing cached
            p.predicted_then_dispatched(&d, (Some(10_000.0), None), at)
        };
        d(&mut p, "r1", "a:1", 1000, 11, t0); // prefills over 0-100 ms
        d(&mut p, "r2", "a:1", 500, 12, ms(20)); // behind it: 100-150 ms
        d(&mut p, "r3", "b:2", 1000, 13, t0); // 0-200 ms on the slower class
        let at = |p: &mut Pool, n: u64| {
            let s = p.states_for(&RequestFeatures::default(), ms(n));
            [0, 1].map(|i| (s[i].prefill_backlog_tokens, s[i].uncached_tokens_in_flight))
        };
        assert_eq!(at(&mut p, 20), [(Some(800 + 500), 1500), (Some(900), 1000)]);
        assert_eq!(at(&mut p, 120), [(Some(300), 1500), (Some(400), 1000)], "r1 done, r2 20 ms into its turn");
        assert_eq!(at(&mut p, 250), [(Some(0), 1500), (Some(0), 1000)], "done, though no first token came yet");
        // Each state says the cost it drains at: what the filter weighs a move off a cache by.
        let costs = p
            .states_for(&RequestFeatures::default(), ms(250))
            .iter()
            .map(|s| s.prefill_ms_per_token)
            .collect::<Vec<_>>();
        assert_eq!(costs, [Some(0.1), Some(0.2)]);
        // A first token seen takes the prompt out of both.
        assert!(p.first_token("r2", "a:1", ms(130)));
        assert_eq!(at(&mut p, 130)[0], (Some(0), 1000));
        // Without costs the backlog is every prompt in prefill, counted whole.
        let mut whole = pool();
        d(&mut whole, "w", "a:1", 1000, 14, t0);
        assert_eq!(at(&mut whole, 250)[0], (Some(1000), 1000));
    }

    #[test]
    fn prefill_tokens_leave_after_predicted_ttft_and_prefix_is_remembered() {
        let mut p = pool();
        let now = Instant::now();
        p.predicted_then_dispatched(&dispatch("r1", "a:1", 100, None), (Some(100.0), None), now);
        let req = RequestFeatures { prefix_hashes: vec![1, 2], ..Default::default() };
        let s = p.states_for(&req, now);
        assert_eq!(s[0].uncached_tokens_in_flight, 100);
        assert_eq!(s[0].prefix_match, 1.0);
        assert_eq!(s[1].prefix_match, 0.0);
        let later = now + Duration::from_millis(150);
        assert_eq!(p.states_for(&req, later)[0].uncached_tokens_in_flight, 0);
        // A second request with the same prefix is mostly cached.
        p.predicted_then_dispatched(&dispatch("r2", "a:1", 100, None), (Some(100.0), None), later);
        assert_eq!(p.states_for(&req, later)[0].uncached_tokens_in_flight, 0);
    }

    #[test]
    fn an_unreachable_server_loses_its_state_and_its_remembered_prefixes() {
        let mut p = pool();
        let now = Instant::now();
        p.endpoints[0].metrics =
            Some(EngineMetrics { running: 1, waiting: 0, kv_usage: 0.1, decode: None, queue_read: true });
        p.endpoints[0].scraped_at = Some(now);
        p.predicted_then_dispatched(&dispatch("r1", "a:1", 100, None), (Some(100.0), None), now);
        let req = RequestFeatures { prefix_hashes: vec![1, 2], ..Default::default() };
        assert_eq!(p.states_for(&req, now)[0].prefix_match, 1.0);
        p.endpoints[0].unreachable();
        let s = p.states_for(&req, now);
        assert_eq!(s[0].prefix_match, 0.0, "a restarted server caches nothing");
        assert_eq!(s[0].metrics_age_ms, None, "no engine state to predict from");
    }

    #[test]
    fn a_first_token_ends_prefill_when_observed_not_when_predicted() {
        let mut p = pool();
        let now = Instant::now();
        p.predicted_then_dispatched(&own("slow", 100), (Some(50.0), None), now);
        p.predicted_then_dispatched(&own("fast", 300), (Some(100.0), None), now);
        let uncached =
            |p: &mut Pool, at: Instant| p.states_for(&RequestFeatures::default(), at)[0].uncached_tokens_in_flight;
        // An event for another endpoint, or an unknown request, changes nothing.
        assert!(!p.first_token("fast", "b:1", now) && !p.first_token("nope", "a:1", now));
        assert!(p.first_token("fast", "a:1", now + Duration::from_millis(5)));
        let at = now + Duration::from_millis(10);
        assert_eq!(uncached(&mut p, at), 100, "fast is past prefill, slow still in it");
        // With first tokens reported, a prompt whose predicted TTFT passed still counts
        // until its own first token (within the grace period)...
        let late = now + Duration::from_millis(500);
        assert_eq!(uncached(&mut p, late), 100);
        assert!(p.first_token("slow", "a:1", late));
        assert_eq!(uncached(&mut p, late), 0);
        // ...and a lost event is forgotten after the grace period.
        p.predicted_then_dispatched(&own("lost", 100), (Some(50.0), None), late);
        assert_eq!(uncached(&mut p, late + FIRST_TOKEN_GRACE + Duration::from_millis(100)), 0);
    }

    /// A dispatch to `a:1` with a prefix of its own (nothing cached from the others).
    fn own(id: &str, tokens: u32) -> Dispatch {
        let mut d = dispatch(id, "a:1", tokens, None);
        d.request.prefix_hashes = vec![id.len() as u64 * 1000 + u64::from(id.as_bytes()[0])];
        d
    }

    #[test]
    fn discovered_endpoints_join_and_leave_keeping_state_of_those_that_stay() {
        let mut p = Pool::new("p", &["s:1".into()], 100);
        let now = Instant::now();
        let change = p.set_discovered(0, vec![("k:1".into(), 2), ("k:2".into(), 2), ("s:1".into(), 9)]);
        assert_eq!(change, EndpointChange { added: 2, removed: 0, dropped_in_flight: 0 });
        let addresses: Vec<&str> = p.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addresses, ["s:1", "k:1", "k:2"], "static first, duplicates once");
        assert_eq!(p.endpoints[1].hardware_class, 2);
        p.endpoints[2].metrics =
            Some(EngineMetrics { running: 4, waiting: 0, kv_usage: 0.5, decode: None, queue_read: true });
        p.dispatch(&dispatch("on-k1", "k:1", 10, None), now);
        p.dispatch(&dispatch("on-k2", "k:2", 10, None), now);
        p.dispatch(&dispatch("on-s1", "s:1", 10, None), now);

        // k:1 goes (deleted or no longer ready): its request leaves with it; k:2 moves up one index.
        let change = p.set_discovered(0, vec![("k:2".into(), 2)]);
        assert_eq!(change, EndpointChange { added: 0, removed: 1, dropped_in_flight: 1 });
        assert_eq!(p.in_flight_on("k:2"), 1);
        assert_eq!(p.in_flight_on("s:1"), 1);
        assert_eq!(p.endpoints[1].metrics.map(|m| m.running), Some(4), "metrics stay with the address");
        let s = p.states_for(&RequestFeatures::default(), now);
        assert_eq!((s[0].in_flight, s[1].in_flight), (1, 1));
        p.finish("on-k2", now);
        assert_eq!(p.in_flight_on("k:2"), 0);
        // A second source adds to the first.
        let change = p.set_discovered(1, vec![("k:3".into(), 1)]);
        assert_eq!((change.added, p.endpoints.len()), (1, 3));
    }

    /// A scrape of `a:1` whose histogram holds `tokens` tokens decoded in `sum_s`.
    fn scrape(p: &mut Pool, sum_s: f64, tokens: f64, at: Instant) {
        let decode = Some(DecodeCounter { sum_s, tokens });
        p.endpoints[0].scraped(EngineMetrics { decode, ..Default::default() }, at);
    }

    fn recent_tpot(p: &mut Pool, at: Instant) -> Option<f64> {
        p.states_for(&RequestFeatures::default(), at)[0].recent_tpot_ms
    }

    #[test]
    fn the_step_time_comes_from_the_histogram_between_scrapes_not_from_late_reports() {
        let mut p = pool();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        p.observed_tpot("a:1", 40.0, t0);
        assert_eq!(recent_tpot(&mut p, t0), Some(40.0), "reports serve a server without the histogram");
        scrape(&mut p, 100.0, 10_000.0, at(0));
        assert_eq!(recent_tpot(&mut p, at(0)), Some(40.0), "one reading is no window");
        // 200 tokens at 20 ms each: the first reading replaces what reports said.
        scrape(&mut p, 104.0, 10_200.0, at(200));
        assert_eq!(recent_tpot(&mut p, at(200)), Some(20.0));
        // A report of a request that decoded long ago does not move it while the histogram does.
        p.observed_tpot("a:1", 80.0, at(250));
        assert_eq!(recent_tpot(&mut p, at(250)), Some(20.0));
        // Too few tokens say nothing yet; the window grows until they are enough.
        scrape(&mut p, 104.3, 10_210.0, at(400));
        assert_eq!(recent_tpot(&mut p, at(400)), Some(20.0));
        // The batch slowed to 50 ms a token: the estimate follows within a few seconds
        // (time constant DECODE_TAU, 1 s).
        let mut t = 400;
        let (mut sum, mut tokens) = (104.3, 10_210.0);
        while t < 3400 {
            t += 200;
            (sum, tokens) = (sum + 5.0, tokens + 100.0);
            scrape(&mut p, sum, tokens, at(t));
        }
        let now = recent_tpot(&mut p, at(t)).unwrap();
        assert!((now - 50.0).abs() < 2.0, "{now}");
        // A restarted server's histogram starts over: a new window, not a negative one.
        scrape(&mut p, 1.0, 50.0, at(t + 200));
        scrape(&mut p, 1.6, 80.0, at(t + 400));
        assert_eq!(recent_tpot(&mut p, at(t + 400)), Some(now), "30 tokens: nothing yet");
        scrape(&mut p, 2.0, 100.0, at(t + 600));
        let restarted = recent_tpot(&mut p, at(t + 600)).unwrap();
        assert!(restarted < now && restarted > 20.0, "{restarted}");
        // Once the histogram has been quiet for a while, reports move it again.
        p.observed_tpot("a:1", 30.0, at(t + 600) + DECODE_FRESH);
        let reported = recent_tpot(&mut p, at(t + 600) + DECODE_FRESH).unwrap();
        assert!((reported - (0.8 * restarted + 0.2 * 30.0)).abs() < 1e-9, "{reported}");
    }

    #[test]
    fn unreported_requests_expire() {
        let ttl = Duration::from_secs(10);
        let mut p = pool().with_expiry(Expiry { ttl, ..Expiry::default() });
        let now = Instant::now();
        p.dispatch(&dispatch("r1", "a:1", 1, None), now);
        assert_eq!(p.expire(now + Duration::from_secs(5)), 0);
        assert_eq!(p.expire(now + Duration::from_secs(11)), 1);
    }

    #[test]
    fn a_request_is_forgotten_at_a_multiple_of_its_predicted_time_and_a_late_report_still_counts() {
        let expiry = Expiry { ttl: Duration::from_secs(600), multiple: 4.0, floor: Duration::from_secs(5) };
        let mut p = pool().with_expiry(expiry);
        let now = Instant::now();
        // 100 ms to the first token, 10 tokens at 200 ms: 2.1 s predicted, 8.4 s at most.
        p.predicted_then_dispatched(&dispatch("short", "a:1", 1, None), (Some(100.0), Some(200.0)), now);
        // No TPOT predicted: the end is not known, the TTL holds.
        p.predicted_then_dispatched(&dispatch("unknown", "a:1", 1, None), (Some(100.0), None), now);
        // A tiny prediction is held to the floor.
        p.predicted_then_dispatched(&dispatch("tiny", "b:2", 1, None), (Some(100.0), Some(1.0)), now);
        assert_eq!(p.expire(now + Duration::from_secs(4)), 0, "the floor");
        assert_eq!(p.expire(now + Duration::from_secs(6)), 1, "tiny, past the floor");
        assert_eq!(p.in_flight_by_endpoint(), [2, 0]);
        assert_eq!(p.expire(now + Duration::from_millis(8_500)), 1, "short, past 4x its 2.1 s");
        assert_eq!(p.in_flight_by_endpoint(), [1, 0], "the one without a predicted end stays");
        // Its report comes after all: it still names where it ran, so it teaches, counted late.
        let late = p.finish("short", now + Duration::from_secs(9));
        assert!(matches!(&late, Finished::Late(a, Some(_)) if a == "a:1"), "{late:?}");
        assert_eq!(p.finish("short", now + Duration::from_secs(9)), Finished::Unknown, "once");
        assert_eq!(p.expire(now + Duration::from_secs(601)), 1);
        // Overdue ids are forgotten after the TTL too.
        p.expire(now + Duration::from_secs(607));
        assert_eq!(p.finish("tiny", now + Duration::from_secs(607)), Finished::Unknown);
    }

    #[test]
    fn a_lifetime_is_never_unbounded_or_negative() {
        let expiry = Expiry::default();
        for (ttft, tpot) in [(f64::NAN, 1.0), (-1.0, 1.0), (f64::INFINITY, 1.0), (1e300, 1e300)] {
            let t = expiry.lifetime((Some(ttft), Some(tpot)), Some(10));
            assert!(t == expiry.ttl || t == expiry.floor, "{ttft} {tpot}: {t:?}");
        }
        assert_eq!(
            expiry.lifetime((Some(100.0), Some(1e300)), None),
            expiry.ttl,
            "no max_tokens: the output is unbounded"
        );
    }
}

#[cfg(test)]
mod books_tests {
    // Test code: a failed unwrap is a failed test.
    #![allow(clippy::unwrap_used)]

    use super::books::FIRST_TOKEN_GRACE;
    use super::*;

    fn dispatch(id: &str, endpoint: &str, tokens: u32, tpot_slo: f64) -> Dispatch {
        let mut request =
            RequestFeatures { input_tokens: tokens, streaming: true, prediction_based: true, ..Default::default() };
        request.slo.tpot_ms = Some(tpot_slo);
        Dispatch { pool: "p".into(), request_id: id.into(), endpoint: endpoint.into(), request }
    }

    /// The sums of one moment are kept while the books stand still, and every change of
    /// the books at that same moment is seen by the next question: a dispatch, a first
    /// token, a report, a reservation and its cancelling.
    #[test]
    fn a_moment_is_summed_once_and_every_change_at_that_moment_is_seen() {
        let mut p = Pool::new("p", &["a:1".into(), "b:1".into()], 64);
        let now = Instant::now();
        let state = |p: &mut Pool| {
            let s = p.states_for(&RequestFeatures::default(), now);
            (s[0].in_flight, s[0].uncached_tokens_in_flight, s[0].tightest_tpot_slo_ms)
        };
        assert_eq!(state(&mut p), (0, 0, None));
        p.dispatch(&dispatch("r1", "a:1", 400, 50.0), now);
        assert_eq!(state(&mut p), (1, 400, Some(50.0)));
        assert_eq!(state(&mut p), (1, 400, Some(50.0)), "asked again: the same");
        p.dispatch(&dispatch("r2", "a:1", 100, 20.0), now);
        assert_eq!(state(&mut p), (2, 500, Some(20.0)));
        assert!(p.first_token("r1", "a:1", now));
        assert_eq!(state(&mut p), (2, 100, Some(20.0)), "r1 past prefill");
        p.reserve("r3", "a:1", &RequestFeatures { input_tokens: 7, ..Default::default() }, 10.0, now);
        assert_eq!(state(&mut p).0, 3);
        p.cancel_reservation("r3");
        assert_eq!(state(&mut p).0, 2);
        assert!(matches!(p.finish("r2", now), Finished::Tracked(..)));
        assert_eq!(state(&mut p), (1, 0, Some(50.0)));
        // The asker's band and own SLO are read per question, not summed.
        let mut asking = RequestFeatures { streaming: true, priority: 1, ..Default::default() };
        asking.slo.tpot_ms = Some(100.0);
        let s = p.states_for(&asking, now);
        assert_eq!((s[0].tightest_tpot_slo_ms, s[0].tighter_tpot_in_flight), (None, 0), "a higher band is not held");
        asking.priority = 0;
        let s = p.states_for(&asking, now);
        assert_eq!((s[0].tightest_tpot_slo_ms, s[0].tighter_tpot_in_flight), (Some(50.0), 1));
    }

    /// An endpoint's (requests, tokens, uncached tokens in prefill, SLOs as [`merged`]).
    type Sums = (u32, u64, u64, Vec<(i32, u64, u32)>);

    /// What the books say at a moment, summed from scratch over every request in flight by
    /// the rule (the definition the kept sums must equal).
    fn summed_from_scratch(p: &Pool, now: Instant) -> Vec<Sums> {
        let events = p.first_token_events(now);
        let mut out = vec![(0u32, 0u64, 0u64, Vec::new()); p.endpoints.len()];
        for f in p.in_flight.values() {
            let Some(o) = out.get_mut(f.endpoint) else { continue };
            o.0 += f.sequences;
            o.1 += u64::from(f.input_tokens) + u64::from(f.expected_output) * u64::from(f.sequences);
            let prefilling = match (events, f.prefill_done_by) {
                (true, _) if f.past_prefill => false,
                (true, Some(t)) => now < t + FIRST_TOKEN_GRACE,
                (false, Some(t)) => now < t,
                (_, None) => !f.past_prefill,
            };
            if prefilling {
                o.2 += f.uncached_tokens;
            }
            if let Some(slo) = f.tpot_slo_ms {
                o.3.push((f.priority, slo.to_bits(), 1));
            }
        }
        out.into_iter().map(|(n, t, u, slos)| (n, t, u, merged(slos))).collect()
    }

    /// (band, SLO bits, requests) sorted, equal ones merged: the SLOs as a set with counts.
    fn merged(mut slos: Vec<(i32, u64, u32)>) -> Vec<(i32, u64, u32)> {
        slos.sort_unstable();
        let mut out: Vec<(i32, u64, u32)> = Vec::new();
        for s in slos {
            match out.last_mut() {
                Some(last) if (last.0, last.1) == (s.0, s.1) => last.2 += s.2,
                _ => out.push(s),
            }
        }
        out
    }

    /// Dispatches, reservations, first tokens, reports, expiry and a change of endpoints in
    /// a pseudo-random mix, on a clock that moves on: after each, the sums kept as requests
    /// come and go equal the sums from scratch, with and without first-token events.
    #[test]
    fn the_kept_sums_equal_a_sum_from_scratch_through_any_history() {
        let t0 = Instant::now();
        let mut p = Pool::new("p", &[], 64);
        let listed = |names: &[&str]| names.iter().map(|a| (a.to_string(), 0)).collect::<Vec<_>>();
        p.set_discovered(0, listed(&["a:1", "b:1", "c:1"]));
        let mut next = crate::testing::below(0x9e37_79b9_7f4a_7c15u64);
        let mut now = t0;
        let mut ids: Vec<String> = Vec::new();
        for step in 0..3_000u64 {
            now += Duration::from_millis(next(400));
            let endpoint = ["a:1", "b:1", "c:1"][next(3) as usize];
            match next(12) {
                0..=3 => {
                    let id = format!("r{step}");
                    let mut d = dispatch(&id, endpoint, 1 + next(900) as u32, [20.0, 50.0, 80.0][next(3) as usize]);
                    d.request.priority = next(2) as i32 - 1;
                    let ttft = [None, Some(50.0), Some(900.0), Some(4_000.0)][next(4) as usize];
                    p.predicted_then_dispatched(&d, (ttft, Some(10.0)), now);
                    ids.push(id);
                }
                4 => {
                    let id = format!("r{step}");
                    p.reserve(&id, endpoint, &RequestFeatures { input_tokens: 30, ..Default::default() }, 200.0, now);
                    ids.push(id);
                }
                5..=6 if !ids.is_empty() => {
                    let id = &ids[next(ids.len() as u64) as usize];
                    let at = p.in_flight.get(id).and_then(|f| p.endpoints.get(f.endpoint)).map(|e| e.address.clone());
                    p.first_token(id, &at.unwrap_or_default(), now);
                }
                7..=8 if !ids.is_empty() => {
                    let id = ids.swap_remove(next(ids.len() as u64) as usize);
                    p.finish(&id, now);
                }
                9 => {
                    p.expire(now);
                }
                10 if step % 300 == 10 => {
                    // Endpoints renumbered, one gone with its requests, one new; then back.
                    p.set_discovered(0, listed(&["c:1", "a:1", "d:1"]));
                    assert_eq!(p.in_flight.values().filter(|f| f.endpoint >= 3).count(), 0);
                    p.set_discovered(0, listed(&["a:1", "b:1", "c:1"]));
                }
                _ => {}
            }
            // Asked at this moment and a little later (a prompt's prefill may end between).
            for at in [now, now + Duration::from_millis(next(3_000))] {
                p.states_for(&RequestFeatures::default(), at);
                let kept: Vec<_> = p
                    .in_flight
                    .booked(p.endpoints.len(), at, p.first_token_events(at), |_, _| None)
                    .iter()
                    .map(|b| {
                        let slos = b.slos.iter().map(|&(band, slo, n)| (band, slo.to_bits(), n)).collect();
                        (b.in_flight, b.tokens_in_flight, b.uncached_tokens_in_flight, merged(slos))
                    })
                    .collect();
                assert_eq!(kept, summed_from_scratch(&p, at), "step {step}");
            }
        }
    }
}
