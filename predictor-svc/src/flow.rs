//! Flow control: a request no endpoint has headroom for waits here instead of
//! joining a model server's FIFO queue (docs/flow-control.md).
//!
//! The filter offers to wait ([`FlowTerms`] in its predict call); `/v1/predict` then
//! answers when an endpoint has headroom for what is left of the request's TTFT SLO,
//! when its deadline passes, or at once with the reason it could not wait. The queue
//! lives here, not in the gateway, because this is the one place that sees every
//! gateway, every worker and every capacity signal (reports, first tokens, scrapes).
//!
//! A request goes when an endpoint has headroom for what is left of its SLOs and the
//! wait ahead of it there (its predicted TTFT less its own TTFT on that endpoint idle) is
//! within its `dispatch_horizon_ms` (its server's queue is short), or earlier than the
//! horizon allows when its own SLO is about to run out. One with room for its own SLOs
//! only where its decode would slow running requests past their tighter TPOT SLO waits
//! for them, and when its own SLO presses goes where it slows the fewest of them (the
//! busiest such endpoint among equals).
//! It expires at its deadline (arrival + TTFT SLO - its service time on an idle
//! endpoint): a sheddable request is then shed, any other placed as best it can be.
//!
//! Order: priority band (higher first; a band waiting blocks the bands below it, and a
//! new request never passes waiting ones of its band or above), then, within a band,
//! tenants take turns (fair queuing by releases) and each tenant's requests go by
//! deadline.
//!
//! [`Queue`] is the plain data structure (tested on its own); [`Flows`] holds one per
//! pool with the wake-up signal; [`admit`] and [`run`] are what `/v1/predict` and the
//! background task do with them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headroom_protocol::headroom::{headroom, least_harm_with_own_room, SloBuffers};
use headroom_protocol::{
    EndpointPrediction, EndpointState, FlowAnswer, FlowOutcome, FlowTerms, PredictRequest, PredictResponse,
};
use tokio::sync::{oneshot, Notify};

use crate::config::FlowConfig;
use crate::heartbeat::Task;
use crate::service;
use crate::state::AppState;

/// Waiting requests judged per pool and wake-up, at most: each costs one prediction
/// of every endpoint. The rest wait for the next one (`recheck_interval_ms`).
const MAX_JUDGED_PER_ROUND: usize = 64;
/// Window over which a pool's finished requests give its drain rate.
const DRAIN_WINDOW: Duration = Duration::from_secs(5);

/// One request waiting.
#[derive(Debug)]
pub struct Waiter {
    pub id: u64,
    pub request: PredictRequest,
    pub band: i32,
    pub tenant: String,
    pub arrived: Instant,
    pub deadline: Instant,
    pub reply: Option<oneshot::Sender<PredictResponse>>,
}

/// Why a request could not join the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Full,
}

/// One pool's waiting requests and what fair queuing remembers of its tenants.
#[derive(Debug)]
pub struct Queue {
    waiters: Vec<Waiter>,
    /// Releases per (band, tenant): the tenant with the fewest goes next in its band.
    served: HashMap<(i32, String), u64>,
    /// When requests of this pool finished recently (reports): the rate the fleet drains at.
    finished: VecDeque<Instant>,
    max_queued: usize,
    max_per_band: usize,
}

impl Queue {
    pub fn new(config: &FlowConfig) -> Queue {
        Queue {
            waiters: Vec::new(),
            served: HashMap::new(),
            finished: VecDeque::new(),
            max_queued: config.max_queued,
            max_per_band: config.max_queued_per_band,
        }
    }

    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Waiting requests per band, highest band first.
    pub fn depth_by_band(&self) -> Vec<(i32, usize)> {
        let mut bands: Vec<(i32, usize)> = Vec::new();
        for w in &self.waiters {
            match bands.iter_mut().find(|(b, _)| *b == w.band) {
                Some((_, n)) => *n += 1,
                None => bands.push((w.band, 1)),
            }
        }
        bands.sort_by_key(|b| std::cmp::Reverse(b.0));
        bands
    }

    /// Adds a waiter, unless its band or the queue is full.
    pub fn push(&mut self, waiter: Waiter) -> Result<(), Refused> {
        let in_band = self.waiters.iter().filter(|w| w.band == waiter.band).count();
        if self.waiters.len() >= self.max_queued || in_band >= self.max_per_band {
            return Err(Refused::Full);
        }
        // A tenant joining its band starts level with the least served tenant waiting
        // there: an idle tenant banks no turns, a new one is not behind.
        let key = (waiter.band, waiter.tenant.clone());
        let waiting_here = self.waiters.iter().any(|w| w.band == waiter.band && w.tenant == waiter.tenant);
        if !waiting_here {
            let floor = self
                .waiters
                .iter()
                .filter(|w| w.band == waiter.band)
                .map(|w| self.served.get(&(w.band, w.tenant.clone())).copied().unwrap_or(0))
                .min()
                .unwrap_or(0);
            let own = self.served.entry(key).or_insert(0);
            *own = (*own).max(floor);
        }
        self.waiters.push(waiter);
        Ok(())
    }

    /// Removes the waiter `id` (released, expired, or its caller gone).
    pub fn remove(&mut self, id: u64) -> Option<Waiter> {
        let i = self.waiters.iter().position(|w| w.id == id)?;
        let w = self.waiters.swap_remove(i);
        if !self.waiters.iter().any(|o| o.band == w.band && o.tenant == w.tenant) {
            // Nobody of this tenant waits in the band: its count only matters again when
            // it rejoins, and then it is levelled. Forgetting it bounds the map.
            self.served.remove(&(w.band, w.tenant.clone()));
        }
        Some(w)
    }

    /// Removes `id` as released: its tenant's turn is used.
    pub fn release(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.iter().find(|w| w.id == id)?;
        *self.served.entry((w.band, w.tenant.clone())).or_insert(0) += 1;
        self.remove(id)
    }

    /// Removes and returns the waiters whose deadline is past.
    pub fn take_expired(&mut self, now: Instant) -> Vec<Waiter> {
        let ids: Vec<u64> = self.waiters.iter().filter(|w| w.deadline <= now).map(|w| w.id).collect();
        ids.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    /// Waiter ids in the order they are served: bands high to low; within a band,
    /// tenants by fewest releases (each pick counting as one), ties and each tenant's
    /// own requests by deadline.
    pub fn order(&self) -> Vec<u64> {
        let mut bands: Vec<i32> = self.waiters.iter().map(|w| w.band).collect();
        bands.sort_unstable_by(|a, b| b.cmp(a));
        bands.dedup();
        let mut out = Vec::with_capacity(self.waiters.len());
        for band in bands {
            let mut tenants: HashMap<&str, (u64, Vec<&Waiter>)> = HashMap::new();
            for w in self.waiters.iter().filter(|w| w.band == band) {
                let served = self.served.get(&(band, w.tenant.clone())).copied().unwrap_or(0);
                tenants.entry(w.tenant.as_str()).or_insert((served, Vec::new())).1.push(w);
            }
            for (_, list) in tenants.values_mut() {
                // Latest deadline first, so the next one pops off the end.
                list.sort_by(|a, b| b.deadline.cmp(&a.deadline).then(b.id.cmp(&a.id)));
            }
            loop {
                let next = tenants
                    .iter()
                    .filter_map(|(t, (served, list))| list.last().map(|w| (*served, w.deadline, w.id, *t)))
                    .min();
                let Some((_, _, id, tenant)) = next else { break };
                if let Some((served, list)) = tenants.get_mut(tenant) {
                    *served += 1;
                    list.pop();
                }
                out.push(id);
            }
        }
        out
    }

    /// A request of this pool finished: the fleet drained one.
    pub fn finished(&mut self, now: Instant) {
        self.finished.push_back(now);
        self.trim(now);
    }

    fn trim(&mut self, now: Instant) {
        while self.finished.front().is_some_and(|t| now.saturating_duration_since(*t) > DRAIN_WINDOW) {
            self.finished.pop_front();
        }
    }

    /// Requests finished per second, over the last [`DRAIN_WINDOW`].
    pub fn drain_rate(&mut self, now: Instant) -> f64 {
        self.trim(now);
        self.finished.len() as f64 / DRAIN_WINDOW.as_secs_f64()
    }

    /// Seconds until `ahead` waiting requests have drained at the current rate
    /// (infinite when nothing drains).
    pub fn predicted_wait_s(&mut self, ahead: usize, now: Instant) -> f64 {
        if ahead == 0 {
            return 0.0;
        }
        let rate = self.drain_rate(now);
        if rate > 0.0 {
            ahead as f64 / rate
        } else {
            f64::INFINITY
        }
    }

    /// Waiting requests in `band` or above: those served before a new one of `band`.
    pub fn ahead_of(&self, band: i32) -> usize {
        self.waiters.iter().filter(|w| w.band >= band).count()
    }

    /// The queue's saturation: the time to drain everything waiting, over the mean time
    /// its requests have left before their deadlines. 0 when nothing waits; above 1 the
    /// queued work cannot all be served within its SLOs at the current drain rate.
    /// Capped at [`MAX_SATURATION`].
    pub fn saturation(&mut self, now: Instant) -> f64 {
        if self.waiters.is_empty() {
            return 0.0;
        }
        let left: f64 = self.waiters.iter().map(|w| w.deadline.saturating_duration_since(now).as_secs_f64()).sum();
        let mean_left = (left / self.waiters.len() as f64).max(1e-3);
        (self.predicted_wait_s(self.waiters.len(), now) / mean_left).min(MAX_SATURATION)
    }
}

/// Saturation reported when nothing drains at all.
pub const MAX_SATURATION: f64 = 100.0;

/// One pool's queue as `/metrics` shows it.
pub struct PoolFlow {
    pub pool: String,
    /// (band, requests waiting), highest band first.
    pub bands: Vec<(i32, usize)>,
    pub saturation: f64,
}

/// Every pool's queue, and the signal that capacity may have freed.
pub struct Flows {
    queues: Mutex<HashMap<String, Queue>>,
    wake: Notify,
    next_id: std::sync::atomic::AtomicU64,
    config: FlowConfig,
}

impl Flows {
    pub fn new(config: FlowConfig) -> Flows {
        Flows {
            queues: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            next_id: std::sync::atomic::AtomicU64::new(1),
            config,
        }
    }

    /// Runs `f` on `pool`'s queue (created on first use).
    pub fn with<R>(&self, pool: &str, f: impl FnOnce(&mut Queue) -> R) -> R {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let queue = queues.entry(pool.to_string()).or_insert_with(|| Queue::new(&self.config));
        f(queue)
    }

    /// Capacity may have freed (a report, a first token, a scrape): judge the waiters now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// A request of `pool` finished: counts towards its drain rate, and wakes the waiters.
    pub fn finished(&self, pool: &str, now: Instant) {
        if let Some(q) = self.queues.lock().unwrap_or_else(|p| p.into_inner()).get_mut(pool) {
            q.finished(now);
        }
        self.wake();
    }

    /// Each pool's waiting requests by band and its saturation, for `/metrics`.
    pub fn snapshot(&self, now: Instant) -> Vec<PoolFlow> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues
            .iter_mut()
            .map(|(pool, q)| PoolFlow { pool: pool.clone(), bands: q.depth_by_band(), saturation: q.saturation(now) })
            .collect()
    }

    /// The gateway says the client of `request_id` left while it waited: out of the queue.
    /// Returns whether it was still there.
    pub fn abandon(&self, pool: &str, request_id: &str) -> bool {
        // Only a queue that exists: word of a request in a pool nobody queued in creates none.
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let Some(q) = queues.get_mut(pool) else { return false };
        let Some(id) = q.waiters.iter().find(|w| w.request.request_id == request_id).map(|w| w.id) else {
            return false;
        };
        q.remove(id).is_some()
    }

    /// How many pools have a queue (tests: word of unknown pools creates none).
    pub fn queue_count(&self) -> usize {
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Pools with requests waiting.
    fn busy_pools(&self) -> Vec<String> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.iter().filter(|(_, q)| !q.is_empty()).map(|(p, _)| p.clone()).collect()
    }
}

/// What `/v1/predict` does with a request that offered to wait.
pub enum Admission {
    /// Answer now (with flow control's outcome in it).
    Now(PredictResponse),
    /// Wait for the answer; dropping the [`Ticket`] (the caller left) leaves the queue.
    Wait(oneshot::Receiver<PredictResponse>, Ticket),
}

/// A place in a pool's queue, given up when dropped.
pub struct Ticket {
    state: Arc<AppState>,
    pool: String,
    id: u64,
}

impl Ticket {
    /// Its deadline passed without an answer (the background task missed it): leave
    /// and answer as expired from a fresh prediction.
    pub fn expired(&self, req: PredictRequest, arrived: Instant) -> Option<PredictResponse> {
        self.state.flows.with(&self.pool, |q| q.remove(self.id));
        let now = Instant::now();
        answer(&self.state, &req, now, FlowOutcome::Expired, arrived)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Released or expired waiters are gone already; a caller that left is removed here.
        if self.state.flows.with(&self.pool, |q| q.remove(self.id)).is_some() {
            self.state.metrics.flow_left(&self.pool);
        }
    }
}

/// `req` with `waited_ms` of its TTFT SLO gone: what is left to judge.
fn remaining(req: &PredictRequest, waited_ms: f64) -> headroom_protocol::RequestFeatures {
    let mut features = req.request.clone();
    features.slo.ttft_ms = features.slo.ttft_ms.map(|slo| slo - waited_ms);
    features
}

/// The endpoint with the most headroom for `req` with `waited_ms` of its TTFT SLO gone
/// (its own SLOs and the tightest TPOT SLO running there), if any has headroom at all.
fn fits(req: &PredictRequest, terms: &FlowTerms, endpoints: &[EndpointPrediction], waited_ms: f64) -> Option<usize> {
    let features = remaining(req, waited_ms);
    let mut best: Option<(usize, f64)> = None;
    for (i, e) in endpoints.iter().enumerate() {
        let Some(h) = headroom(&features, e, SloBuffers::of(terms)).filter(|h| h.is_positive()) else { continue };
        let slack = h.ttft.unwrap_or(0.0) + h.tpot.unwrap_or(0.0);
        if best.is_none_or(|(_, b)| slack > b) {
            best = Some((i, slack));
        }
    }
    best.map(|(i, _)| i)
}

/// Where `req` would go at its neighbours' expense (of the endpoints with room for its own
/// SLOs, where it slows the fewest tighter decodes, as the filter's policy places it), if
/// anywhere; having waited, where it slows fewer still though its first token comes late
/// there by up to `waited_ms` ([`must_go`] then holds at once: the wait ends before the
/// endpoints where loose work gathers drop out of reach, leaving it only those where the
/// tight decodes run).
fn own_room(
    req: &PredictRequest,
    terms: &FlowTerms,
    endpoints: &[EndpointPrediction],
    waited_ms: f64,
) -> Option<usize> {
    least_harm_with_own_room(&remaining(req, waited_ms), endpoints, SloBuffers::of(terms), waited_ms)
}

/// Whether `req`, which has headroom at `best`, should go there now: the wait ahead of it
/// there (its predicted TTFT less `service_ms`, its own TTFT there were the server idle)
/// is within the dispatch horizon (the server's queue is short), or the request
/// [`must_go`].
///
/// The horizon bounds the queue, not the request's own prefill: judged on the whole
/// predicted TTFT, a prompt whose prefill alone takes longer than the horizon would wait
/// even for an idle server, until its SLO pressed (and a sheddable one until it was shed).
fn goes_now(
    req: &PredictRequest,
    terms: &FlowTerms,
    best: &EndpointPrediction,
    service_ms: f64,
    waited_ms: f64,
    config: &FlowConfig,
) -> bool {
    let Some(predicted) = best.ttft_ms else { return false };
    predicted - service_ms <= terms.dispatch_horizon_ms as f64 || must_go(req, best, waited_ms, config)
}

/// Whether `req` cannot wait longer for `endpoint`: what is left of its TTFT SLO past the
/// prediction there is under [`pressure_ms`].
fn must_go(req: &PredictRequest, endpoint: &EndpointPrediction, waited_ms: f64, config: &FlowConfig) -> bool {
    let Some(predicted) = endpoint.ttft_ms else { return false };
    req.request.slo.ttft_ms.is_some_and(|slo| slo - waited_ms - predicted <= pressure_ms(slo, config))
}

/// The endpoint a waiting `req` should go to now, if any: one has headroom for what is
/// left of its SLOs and those of the requests running there ([`fits`]) and it
/// [`goes_now`]; or, where it has room only at its neighbours' expense (its decode would
/// slow theirs past their TPOT SLO), its own SLO presses ([`must_go`]): it waited for
/// them as long as it could; a sheddable request never goes there. `service_ms` gives
/// the request's own TTFT at an endpoint (by index) were it idle.
fn ready(
    req: &PredictRequest,
    terms: &FlowTerms,
    endpoints: &[EndpointPrediction],
    service_ms: impl Fn(usize) -> f64,
    waited_ms: f64,
    config: &FlowConfig,
) -> Option<usize> {
    match fits(req, terms, endpoints, waited_ms) {
        Some(best) => goes_now(req, terms, &endpoints[best], service_ms(best), waited_ms, config).then_some(best),
        // Work that may be refused is not sent to slow work that may not: a sheddable request
        // waits for room beside the tighter decodes until its deadline (the filter's policy
        // would shed it there anyway).
        None if req.request.is_sheddable() => None,
        None => {
            own_room(req, terms, endpoints, waited_ms).filter(|&at| must_go(req, &endpoints[at], waited_ms, config))
        }
    }
}

/// How close to running out of TTFT SLO a waiting request is sent even beyond the
/// dispatch horizon: a tenth of its SLO, and never less than two rechecks.
fn pressure_ms(slo_ms: f64, config: &FlowConfig) -> f64 {
    (slo_ms * 0.1).max(2.0 * config.recheck_interval_ms as f64)
}

/// The request's TTFT at each of `endpoints` were it idle (nothing running, queued or in
/// flight; its prefix cache and hardware as they are): its service time there, what
/// waiting can never take away. `None` where the endpoint gets no prediction. One
/// batched prediction.
fn idle_ttfts_ms<'a>(
    state: &AppState,
    req: &PredictRequest,
    endpoints: impl IntoIterator<Item = &'a EndpointPrediction>,
) -> Vec<Option<f64>> {
    let endpoints: Vec<&EndpointPrediction> = endpoints.into_iter().collect();
    let rows: Vec<_> = endpoints
        .iter()
        .filter(|e| e.ttft_ms.is_some())
        .map(|e| {
            let idle = EndpointState {
                prefix_match: e.state.prefix_match,
                hardware_class: e.state.hardware_class,
                metrics_age_ms: e.state.metrics_age_ms,
                ..EndpointState::default()
            };
            state.models.row(&req.request, &idle)
        })
        .collect();
    let mut predicted = state.models.predict(&rows).0.into_iter().map(|(ttft, _)| ttft);
    endpoints.iter().map(|e| e.ttft_ms.and_then(|_| predicted.next()).filter(|t| t.is_finite())).collect()
}

/// The request's own TTFT at `endpoint` were it idle (0 without a prediction): what
/// [`goes_now`] takes from its predicted TTFT there to leave the queue ahead of it.
fn service_ms(state: &AppState, req: &PredictRequest, endpoint: &EndpointPrediction) -> f64 {
    idle_ttfts_ms(state, req, [endpoint]).into_iter().flatten().next().unwrap_or(0.0)
}

/// Counts `req` as in flight at `endpoint` until the filter's dispatch replaces it.
fn reserve(state: &AppState, req: &PredictRequest, endpoint: &EndpointPrediction, now: Instant) {
    let predicted = (endpoint.ttft_ms.unwrap_or(0.0), endpoint.tpot_ms);
    state.pools.with(&req.pool, |p| p.reserve(&req.request_id, &endpoint.address, &req.request, predicted, now));
}

fn waited_ms(arrived: Instant, now: Instant) -> f64 {
    now.saturating_duration_since(arrived).as_secs_f64() * 1000.0
}

/// A fresh prediction for `req`, with flow control's outcome.
fn answer(
    state: &AppState,
    req: &PredictRequest,
    now: Instant,
    outcome: FlowOutcome,
    arrived: Instant,
) -> Option<PredictResponse> {
    let mut a = service::predict(state, req.clone(), now)?;
    a.flow = Some(FlowAnswer { outcome, waited_ms: waited_ms(arrived, now) });
    Some(a)
}

/// Decides at arrival: answer now, or wait. `now_answer` is the prediction already made
/// for it at `now`.
pub fn admit(state: &Arc<AppState>, req: PredictRequest, mut now_answer: PredictResponse, now: Instant) -> Admission {
    let Some(terms) = req.flow.clone() else { return Admission::Now(now_answer) };
    let reply = |answer: &mut PredictResponse, outcome: FlowOutcome| {
        state.metrics.flow_outcome(&req.pool, outcome, 0.0);
        answer.flow = Some(FlowAnswer { outcome, waited_ms: 0.0 });
    };
    let predicted = now_answer.endpoints.iter().any(|e| e.ttft_ms.is_some());
    // Has no SLO to wait for, or nothing is predicted (the filter falls back).
    if !req.request.slo.is_set() || !predicted {
        reply(&mut now_answer, FlowOutcome::Immediate);
        return Admission::Now(now_answer);
    }
    // No endpoint has headroom for its own SLOs: waiting would only add to its TTFT (a
    // server serves prompts in order, so one sent later is done no sooner). Placed now by
    // the filter's policy: the least bad endpoint, or a sheddable one shed. One that has
    // room for itself only where its decode would slow running requests past their TPOT
    // SLO waits instead: their decodes end, and it has time (a batch request behind
    // interactive ones).
    let with_neighbours = fits(&req, &terms, &now_answer.endpoints, 0.0);
    if with_neighbours.is_none() && own_room(&req, &terms, &now_answer.endpoints, 0.0).is_none() {
        reply(&mut now_answer, FlowOutcome::Unmeetable);
        return Admission::Now(now_answer);
    }
    // Ready now, and nothing of its band or above waits (it would pass them): goes at
    // once, counted where it most likely goes until its dispatch arrives, so a burst
    // inside one flush interval does not all see the same room.
    let band = req.request.priority;
    let behind = state.flows.with(&req.pool, |q| q.ahead_of(band)) > 0;
    if let Some(at_best) = with_neighbours.map(|best| &now_answer.endpoints[best]) {
        if !behind && goes_now(&req, &terms, at_best, service_ms(state, &req, at_best), 0.0, &state.config.flow) {
            reserve(state, &req, at_best, now);
            reply(&mut now_answer, FlowOutcome::Immediate);
            return Admission::Now(now_answer);
        }
    }
    // Deadline: the latest moment it can still be sent and make its TTFT SLO (arrival +
    // SLO - its service time: the TTFT predicted on the best endpoint once idle), and
    // never beyond either side's longest wait.
    let longest = Duration::from_millis(terms.max_wait_ms.min(state.config.flow.max_wait_ms));
    let shortest_service = idle_ttfts_ms(state, &req, &now_answer.endpoints).into_iter().flatten().reduce(f64::min);
    let slack = match (req.request.slo.ttft_ms, shortest_service) {
        (Some(slo), Some(service)) => {
            Duration::try_from_secs_f64(((slo - service) / 1000.0).max(0.0)).unwrap_or(longest)
        }
        _ => longest,
    };
    let wait = slack.min(longest);
    if wait.is_zero() {
        // No endpoint could make its SLO even idle of queued work: waiting cannot help.
        reply(&mut now_answer, FlowOutcome::Expired);
        return Admission::Now(now_answer);
    }
    let id = state.flows.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    let waiter = Waiter {
        id,
        band,
        tenant: terms.fairness_id.clone(),
        arrived: now,
        deadline: now + wait,
        request: req.clone(),
        reply: Some(tx),
    };
    let pool = req.pool.clone();
    let admitted = state.flows.with(&pool, |q| {
        // Saturated: what waits ahead of it would outlast its deadline. A sheddable request
        // is refused now rather than after waiting; others wait (the queue never drops them).
        if req.request.is_sheddable() && q.predicted_wait_s(q.ahead_of(band), now) > wait.as_secs_f64() {
            return Err(FlowOutcome::Saturated);
        }
        q.push(waiter).map_err(|Refused::Full| FlowOutcome::QueueFull)
    });
    match admitted {
        Ok(()) => {
            state.metrics.flow_queued(&pool);
            Admission::Wait(rx, Ticket { state: state.clone(), pool, id })
        }
        Err(outcome) => {
            reply(&mut now_answer, outcome);
            Admission::Now(now_answer)
        }
    }
}

/// Judges the waiting requests whenever capacity may have freed, and at least every
/// `recheck_interval_ms`: releases those an endpoint now has headroom for, expires
/// those whose deadline passed.
pub async fn run(state: Arc<AppState>) {
    let recheck = Duration::from_millis(state.config.flow.recheck_interval_ms);
    loop {
        tokio::select! {
            _ = state.flows.wake.notified() => {}
            _ = tokio::time::sleep(recheck) => {}
        }
        state.heartbeats.beat(Task::Flow);
        for pool in state.flows.busy_pools() {
            serve_pool(&state, &pool, Instant::now());
        }
    }
}

/// One round over `pool`'s queue at `now` (what [`run`] does for each busy pool; public
/// for the fuzz target that drives the queue by hand).
pub fn serve_pool(state: &AppState, pool: &str, now: Instant) {
    for mut w in state.flows.with(pool, |q| q.take_expired(now)) {
        let outcome = FlowOutcome::Expired;
        if let (Some(reply), Some(a)) = (w.reply.take(), answer(state, &w.request, now, outcome, w.arrived)) {
            state.metrics.flow_outcome(pool, outcome, waited_ms(w.arrived, now) / 1000.0);
            let _ = reply.send(a);
        }
    }
    let order = state.flows.with(pool, |q| q.order());
    let mut blocked_below: Option<i32> = None;
    for id in order.into_iter().take(MAX_JUDGED_PER_ROUND) {
        let Some((req, band, arrived, gone)) = state.flows.with(pool, |q| {
            q.waiters
                .iter()
                .find(|w| w.id == id)
                .map(|w| (w.request.clone(), w.band, w.arrived, w.reply.as_ref().is_none_or(|r| r.is_closed())))
        }) else {
            continue;
        };
        if gone {
            // Its caller left; whichever of this and its ticket's drop removes it counts it.
            if state.flows.with(pool, |q| q.remove(id)).is_some() {
                state.metrics.flow_left(pool);
            }
            continue;
        }
        // Strict priority: a band still waiting, or released from this round, holds every band below it.
        if blocked_below.is_some_and(|b| band < b) {
            break;
        }
        let Some(terms) = req.flow.as_ref() else { continue };
        let Some(mut a) = service::predict(state, req.clone(), now) else { continue };
        let waited = waited_ms(arrived, now);
        let service = |i: usize| service_ms(state, &req, &a.endpoints[i]);
        let Some(best) = ready(&req, terms, &a.endpoints, service, waited, &state.config.flow) else {
            blocked_below = Some(band);
            continue;
        };
        let Some(mut w) = state.flows.with(pool, |q| q.release(id)) else { continue };
        // The bands below wait for the next round (a wake-up or `recheck_interval_ms`), so what
        // was just released reaches its server first: released in the same instant, the two
        // race through the gateway, and a long batch prefill can land ahead of an interactive
        // request on a FIFO server.
        blocked_below = Some(band);
        // Counted at the endpoint it most likely goes to until its dispatch arrives, so the
        // next waiter judged does not see the same room.
        reserve(state, &req, &a.endpoints[best], now);
        a.flow = Some(FlowAnswer { outcome: FlowOutcome::Released, waited_ms: waited });
        state.metrics.flow_outcome(pool, FlowOutcome::Released, waited / 1000.0);
        if let Some(reply) = w.reply.take() {
            let _ = reply.send(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::{RequestFeatures, Slo};

    fn waiter(id: u64, band: i32, tenant: &str, deadline_ms: u64, t0: Instant) -> Waiter {
        Waiter {
            id,
            band,
            tenant: tenant.into(),
            arrived: t0,
            deadline: t0 + Duration::from_millis(deadline_ms),
            request: PredictRequest {
                pool: "p".into(),
                request_id: format!("r{id}"),
                request: RequestFeatures { slo: Slo { ttft_ms: Some(500.0), tpot_ms: None }, ..Default::default() },
                flow: None,
            },
            reply: None,
        }
    }

    fn queue(max: usize, per_band: usize) -> Queue {
        Queue::new(&FlowConfig { max_queued: max, max_queued_per_band: per_band, ..FlowConfig::default() })
    }

    fn endpoint(ttft_ms: f64) -> EndpointPrediction {
        EndpointPrediction {
            address: "10.0.0.1:8000".into(),
            ttft_ms: Some(ttft_ms),
            tpot_ms: Some(10.0),
            state: EndpointState::default(),
        }
    }

    #[test]
    fn a_request_goes_when_the_queue_ahead_is_within_the_horizon_or_its_own_slo_presses() {
        let t0 = Instant::now();
        let mut req = waiter(1, 0, "", 1, t0).request;
        req.request.slo.ttft_ms = Some(1000.0);
        let terms = |horizon| FlowTerms {
            max_wait_ms: 10_000,
            tpot_buffer: 1.0,
            ttft_buffer: 1.0,
            dispatch_horizon_ms: horizon,
            fairness_id: String::new(),
        };
        let config = FlowConfig::default();
        let busy = [endpoint(300.0)];
        let short = |_| 20.0; // the request's own TTFT on the idle server: the rest is queue
        assert_eq!(ready(&req, &terms(400), &busy, short, 0.0, &config), Some(0), "within the horizon");
        assert_eq!(ready(&req, &terms(150), &busy, short, 0.0, &config), None, "has room, but the queue is long");
        // 1000 - 650 waited - 300 predicted = 50 ms left, under a tenth of the SLO: it must go.
        assert_eq!(ready(&req, &terms(150), &busy, short, 650.0, &config), Some(0));
        // Past its SLO there is no room at all: never "ready", it expires instead.
        assert_eq!(ready(&req, &terms(150), &busy, short, 800.0, &config), None);
        // A long prompt whose own prefill takes 280 of the 300 ms: 20 ms of queue, so it goes
        // at once; its prefill is no queue, and waiting would never shorten it.
        assert_eq!(ready(&req, &terms(150), &busy, |_| 280.0, 0.0, &config), Some(0), "the horizon is the queue");
        assert_eq!(pressure_ms(1000.0, &config), 100.0);
        assert_eq!(pressure_ms(100.0, &config), 40.0, "never under two rechecks");
    }

    #[test]
    fn a_request_with_room_only_at_its_neighbours_expense_waits_until_its_own_slo_presses() {
        let t0 = Instant::now();
        // A batch request: 4 s TTFT, 150 ms TPOT, streaming.
        let mut req = waiter(1, 0, "", 1, t0).request;
        req.request.slo = Slo { ttft_ms: Some(4000.0), tpot_ms: Some(150.0) };
        req.request.streaming = true;
        let terms = FlowTerms {
            max_wait_ms: 10_000,
            tpot_buffer: 1.0,
            ttft_buffer: 1.0,
            dispatch_horizon_ms: 150,
            fairness_id: String::new(),
        };
        let config = FlowConfig::default();
        // An idle queue, but interactive requests (40 ms TPOT SLO) decode there and its
        // decode would take the step time to 60 ms.
        let mut shared = endpoint(100.0);
        shared.tpot_ms = Some(60.0);
        shared.state.tightest_tpot_slo_ms = Some(40.0);
        let eps = [shared.clone()];
        let own = |_| 100.0;
        assert_eq!(fits(&req, &terms, &eps, 0.0), None);
        assert_eq!(own_room(&req, &terms, &eps, 0.0), Some(0), "its own SLOs are met there");
        assert_eq!(ready(&req, &terms, &eps, own, 0.0, &config), None, "waits while they decode");
        // 4000 - 3550 waited - 100 predicted = 350 ms left, under a tenth of its SLO: it goes.
        assert_eq!(ready(&req, &terms, &eps, own, 3550.0, &config), Some(0), "its own SLO presses");
        // Once their decodes end (nothing tight runs there), it goes at once.
        let mut freed = shared;
        freed.state.tightest_tpot_slo_ms = None;
        assert_eq!(ready(&req, &terms, &[freed], own, 0.0, &config), Some(0));
        // Where it would not meet even its own SLO, waiting is no use: never "ready".
        let mut slow = endpoint(100.0);
        slow.tpot_ms = Some(200.0);
        assert_eq!(own_room(&req, &terms, &[slow], 0.0), None);
        // Pressed, it goes where the harm is done already: the busiest endpoint that still
        // meets its own SLOs, not the one where tight requests still meet theirs.
        let mut lost = endpoint(100.0);
        lost.tpot_ms = Some(120.0);
        lost.state.tightest_tpot_slo_ms = Some(40.0);
        let both = [eps[0].clone(), lost];
        assert_eq!(ready(&req, &terms, &both, own, 3550.0, &config), Some(1));
        // Unless more of those tight decodes run there: fewer slowed outweighs the busiest.
        let [mut few, mut many] = both;
        few.state.tighter_tpot_in_flight = 1;
        many.state.tighter_tpot_in_flight = 3;
        assert_eq!(ready(&req, &terms, &[few.clone(), many.clone()], own, 3550.0, &config), Some(0));
        // Where loose work gathers the queue is long: 2.5 s to a first token where one tight
        // decode runs, 100 ms where three do. It waits while the first is in time there (with
        // room to spare), and once it would be late there by less than it has waited, it goes
        // there at once: not on waiting until only the endpoint among the three is in time.
        let mut gathered = few;
        gathered.ttft_ms = Some(2500.0);
        let apart = [gathered, many];
        assert_eq!(ready(&req, &terms, &apart, own, 1000.0, &config), None, "500 ms to spare there");
        assert_eq!(ready(&req, &terms, &apart, own, 1600.0, &config), Some(0), "100 ms late, having waited 1.6 s");
        // A sheddable request is never sent to slow them, however pressed: the filter would
        // shed it there, and on azure held at 140 req/s placing it cost the interactive class
        // 14 points. It waits for room beside them until its deadline.
        req.request.priority = -1;
        assert_eq!(ready(&req, &terms, &eps, own, 3550.0, &config), None);
        let mut freed = eps[0].clone();
        freed.state.tightest_tpot_slo_ms = None;
        assert_eq!(ready(&req, &terms, &[freed], own, 3550.0, &config), Some(0), "room beside them: it goes");
    }

    #[test]
    fn bands_go_high_to_low_and_each_band_by_deadline() {
        let t0 = Instant::now();
        let mut q = queue(10, 10);
        for w in
            [waiter(1, 0, "", 900, t0), waiter(2, 1, "", 950, t0), waiter(3, 0, "", 100, t0), waiter(4, -1, "", 1, t0)]
        {
            q.push(w).unwrap();
        }
        assert_eq!(q.order(), vec![2, 3, 1, 4]);
    }

    #[test]
    fn within_a_band_a_tenants_burst_cannot_starve_another() {
        let t0 = Instant::now();
        let mut q = queue(100, 100);
        // Tenant a bursts 10 requests with early deadlines; b sends 2 with later ones.
        for i in 0..10 {
            q.push(waiter(i, 0, "a", 10 + i, t0)).unwrap();
        }
        q.push(waiter(100, 0, "b", 500, t0)).unwrap();
        q.push(waiter(101, 0, "b", 600, t0)).unwrap();
        let order = q.order();
        let pos = |id| order.iter().position(|&x| x == id).unwrap();
        assert!(pos(100) <= 1 && pos(101) <= 3, "b takes turns with a: {order:?}");
        // Releases are what count: after a is served 3 times, b goes first.
        for id in [0, 1, 2] {
            q.release(id);
        }
        assert_eq!(q.order()[0], 100);
    }

    #[test]
    fn a_tenant_rejoining_banks_no_turns() {
        let t0 = Instant::now();
        let mut q = queue(100, 100);
        q.push(waiter(1, 0, "a", 10, t0)).unwrap();
        for id in 2..6 {
            q.push(waiter(id, 0, "b", 20, t0)).unwrap();
        }
        for id in 2..5 {
            q.release(id); // b served 3 times while a waits
        }
        q.release(1);
        // a comes back: levelled with b (3), not at 1, so it does not get three turns in a row.
        for id in 10..13 {
            q.push(waiter(id, 0, "a", 1, t0)).unwrap();
        }
        let order = q.order();
        assert_eq!(order.len(), 4);
        assert!(order.iter().position(|&x| x == 5).unwrap() <= 1, "{order:?}");
    }

    #[test]
    fn the_queue_is_bounded_per_band_and_in_total_and_expiry_removes() {
        let t0 = Instant::now();
        let mut q = queue(3, 2);
        q.push(waiter(1, 0, "", 10, t0)).unwrap();
        q.push(waiter(2, 0, "", 1000, t0)).unwrap();
        assert_eq!(q.push(waiter(3, 0, "", 10, t0)), Err(Refused::Full), "band full");
        q.push(waiter(4, 1, "", 10, t0)).unwrap();
        assert_eq!(q.push(waiter(5, 2, "", 10, t0)), Err(Refused::Full), "queue full");
        let expired: Vec<u64> = q.take_expired(t0 + Duration::from_millis(50)).iter().map(|w| w.id).collect();
        assert_eq!(expired.len(), 2);
        assert!(expired.contains(&1) && expired.contains(&4));
        assert_eq!(q.depth_by_band(), vec![(0, 1)]);
    }

    #[test]
    fn saturation_compares_the_drain_time_with_the_deadlines() {
        let t0 = Instant::now();
        let mut q = queue(100, 100);
        assert_eq!(q.saturation(t0), 0.0);
        for id in 0..4 {
            q.push(waiter(id, 0, "", 2000, t0)).unwrap();
        }
        assert_eq!(q.saturation(t0), MAX_SATURATION, "nothing drains");
        // 10 finished in the last 5 s: 2/s; 4 waiting drain in 2 s, with 2 s left: 1.0.
        for _ in 0..10 {
            q.finished(t0);
        }
        assert!((q.saturation(t0) - 1.0).abs() < 1e-6, "{}", q.saturation(t0));
        assert!((q.predicted_wait_s(q.ahead_of(-1), t0) - 2.0).abs() < 1e-9);
    }
}
