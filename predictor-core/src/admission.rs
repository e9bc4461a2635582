//! What `/v1/predict` and the flow task do with the queue: admit a request that offered
//! to wait (answer now, or queue it with a [`Ticket`]), and judge the waiting ones when
//! capacity may have freed ([`serve_pool`]), predicting through the service. Every
//! moment is passed in as `now`: the clock is the caller's, and so is the way an answer
//! travels back ([`Reply`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::flow::decide::{fits, own_room, ready, within_horizon};
use crate::flow::queue::{Refused, Reply, Waiter};
use crate::predictor::Predictor;
use crate::service;
use headroom_protocol::{EndpointPrediction, EndpointState, FlowAnswer, FlowOutcome, PredictRequest, PredictResponse};

/// Waiting requests judged per pool and wake-up, at most: each costs one prediction
/// of every endpoint. The rest wait for the next one (`recheck_interval_ms`).
const MAX_JUDGED_PER_ROUND: usize = 64;

/// What `/v1/predict` does with a request that offered to wait.
pub enum Admission {
    /// Answer now (with flow control's outcome in it).
    Now(PredictResponse),
    /// Wait for the answer, which goes to the [`Reply`] given; dropping the [`Ticket`]
    /// (the caller left) leaves the queue.
    Wait(Ticket),
}

/// A place in a pool's queue, given up when dropped.
pub struct Ticket {
    state: Arc<Predictor>,
    pool: String,
    id: u64,
}

impl Ticket {
    /// Its deadline passed without an answer by `now` (the background task missed it):
    /// leave and answer as expired from a fresh prediction.
    pub fn expired(&self, req: PredictRequest, arrived: Instant, now: Instant) -> Option<PredictResponse> {
        self.state.flows.with(&self.pool, |q| q.remove(self.id));
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

/// The request's TTFT at each of `endpoints` were it idle (nothing running, queued or in
/// flight; its prefix cache and hardware as they are): its service time there, what
/// waiting can never take away. `None` where the endpoint gets no prediction. One
/// batched prediction.
fn idle_ttfts_ms<'a>(
    state: &Predictor,
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
/// [`goes_now`](crate::flow::decide::goes_now) takes from its predicted TTFT there to leave the queue ahead of it.
fn service_ms(state: &Predictor, req: &PredictRequest, endpoint: &EndpointPrediction) -> f64 {
    idle_ttfts_ms(state, req, [endpoint]).into_iter().flatten().next().unwrap_or(0.0)
}

/// Counts `req` as in flight at `endpoint` until the filter's dispatch replaces it.
fn reserve(state: &Predictor, req: &PredictRequest, endpoint: &EndpointPrediction, now: Instant) {
    let ttft_ms = endpoint.ttft_ms.unwrap_or(0.0);
    state.pools.with(&req.pool, |p| p.reserve(&req.request_id, &endpoint.address, &req.request, ttft_ms, now));
}

/// The addresses of `endpoints` at `indices`, in that order.
fn addresses(endpoints: &[EndpointPrediction], indices: &[usize]) -> Vec<String> {
    indices.iter().filter_map(|&i| endpoints.get(i)).map(|e| e.address.clone()).collect()
}

fn waited_ms(arrived: Instant, now: Instant) -> f64 {
    now.saturating_duration_since(arrived).as_secs_f64() * 1000.0
}

/// A fresh prediction for `req`, with flow control's outcome.
fn answer(
    state: &Predictor,
    req: &PredictRequest,
    now: Instant,
    outcome: FlowOutcome,
    arrived: Instant,
) -> Option<PredictResponse> {
    let mut a = service::predict(state, req.clone(), now)?;
    a.flow = Some(FlowAnswer { outcome, waited_ms: waited_ms(arrived, now), cleared: Vec::new() });
    Some(a)
}

/// Decides at arrival: answer now, or wait for an answer sent to `reply`. `now_answer` is
/// the prediction already made for it at `now`.
pub fn admit(
    state: &Arc<Predictor>,
    req: PredictRequest,
    mut now_answer: PredictResponse,
    now: Instant,
    reply: Box<dyn Reply>,
) -> Admission {
    let Some(terms) = req.flow.clone() else { return Admission::Now(now_answer) };
    let settle = |answer: &mut PredictResponse, outcome: FlowOutcome| {
        state.metrics.flow_outcome(&req.pool, outcome, 0.0);
        answer.flow = Some(FlowAnswer { outcome, waited_ms: 0.0, cleared: Vec::new() });
    };
    let predicted = now_answer.endpoints.iter().any(|e| e.ttft_ms.is_some());
    // Has no SLO to wait for, or nothing is predicted (the filter falls back).
    if !req.request.slo.is_set() || !predicted {
        settle(&mut now_answer, FlowOutcome::Immediate);
        return Admission::Now(now_answer);
    }
    // No endpoint has headroom for its own SLOs: waiting would only add to its TTFT (a
    // server serves prompts in order, so one sent later is done no sooner). Placed now by
    // the filter's policy: the least bad endpoint, or a sheddable one shed. One that has
    // room for itself only where its decode would slow running requests past their TPOT
    // SLO waits instead: their decodes end, and it has time (a batch request behind
    // interactive ones).
    let room = fits(&req, &terms, &now_answer.endpoints, 0.0);
    if room.is_empty() && own_room(&req, &terms, &now_answer.endpoints, 0.0).is_none() {
        settle(&mut now_answer, FlowOutcome::Unmeetable);
        return Admission::Now(now_answer);
    }
    // Ready now, and nothing of its band or above waits (it would pass them): goes at
    // once, to the endpoints where it has room and the queue is short, counted at the one
    // with the most room until its dispatch arrives, so a burst inside one flush interval
    // does not all see the same room.
    let band = req.request.priority;
    let behind = state.flows.with(&req.pool, |q| q.ahead_of(band)) > 0;
    if !behind {
        let endpoints = &now_answer.endpoints;
        let service = |i: usize| service_ms(state, &req, &endpoints[i]);
        let now_cleared = within_horizon(&req, &terms, endpoints, room, service, 0.0, &state.config.flow);
        if let Some(&first) = now_cleared.first() {
            reserve(state, &req, &now_answer.endpoints[first], now);
            let cleared = addresses(&now_answer.endpoints, &now_cleared);
            settle(&mut now_answer, FlowOutcome::Immediate);
            if let Some(flow) = now_answer.flow.as_mut() {
                flow.cleared = cleared;
            }
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
        settle(&mut now_answer, FlowOutcome::Expired);
        return Admission::Now(now_answer);
    }
    let id = state.flows.next_id();
    let waiter = Waiter {
        id,
        band,
        // An older filter named the tenant in its terms only.
        tenant: if req.request.tenant.is_empty() { terms.fairness_id.clone() } else { req.request.tenant.clone() },
        arrived: now,
        deadline: now + wait,
        request: req.clone(),
        reply: Some(reply),
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
            Admission::Wait(Ticket { state: state.clone(), pool, id })
        }
        Err(outcome) => {
            settle(&mut now_answer, outcome);
            Admission::Now(now_answer)
        }
    }
}

/// One round over `pool`'s queue at `now`: what the service's flow task does for each
/// busy pool whenever capacity may have freed, and at least every `recheck_interval_ms`.
pub fn serve_pool(state: &Predictor, pool: &str, now: Instant) {
    for mut w in state.flows.with(pool, |q| q.take_expired(now)) {
        let outcome = FlowOutcome::Expired;
        if let (Some(reply), Some(a)) = (w.reply.take(), answer(state, &w.request, now, outcome, w.arrived)) {
            state.metrics.flow_outcome(pool, outcome, waited_ms(w.arrived, now) / 1000.0);
            reply.send(a);
        }
    }
    let order = state.flows.with(pool, |q| q.order(MAX_JUDGED_PER_ROUND));
    let mut blocked_below: Option<i32> = None;
    for id in order {
        let Some((req, band, arrived, gone)) = state.flows.with(pool, |q| {
            q.get(id).map(|w| (w.request.clone(), w.band, w.arrived, w.reply.as_ref().is_none_or(|r| r.is_closed())))
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
        // Judged without a record: only the answer sent back is remembered.
        let Some(mut a) = service::judge(state, req.clone(), now) else { continue };
        let waited = waited_ms(arrived, now);
        let service = |i: usize| service_ms(state, &req, &a.endpoints[i]);
        let cleared = ready(&req, terms, &a.endpoints, service, waited, &state.config.flow);
        let Some(&first) = cleared.first() else {
            blocked_below = Some(band);
            continue;
        };
        let Some(mut w) = state.flows.with(pool, |q| q.release(id)) else { continue };
        // The bands below wait for the next round (a wake-up or `recheck_interval_ms`), so what
        // was just released reaches its server first: released in the same instant, the two
        // race through the gateway, and a long batch prefill can land ahead of an interactive
        // request on a FIFO server.
        blocked_below = Some(band);
        // Counted at the cleared endpoint with the most room until its dispatch arrives (the
        // filter's policy may draw another of them; the dispatch moves it), so the next
        // waiter judged does not see the same room.
        reserve(state, &req, &a.endpoints[first], now);
        service::remember(state, &req, &a, now);
        let cleared = addresses(&a.endpoints, &cleared);
        a.flow = Some(FlowAnswer { outcome: FlowOutcome::Released, waited_ms: waited, cleared });
        state.metrics.flow_outcome(pool, FlowOutcome::Released, waited / 1000.0);
        if let Some(reply) = w.reply.take() {
            reply.send(a);
        }
    }
}
