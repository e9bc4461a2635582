//! What the predictor does with each input, once it is decoded and checked: predict
//! every endpoint of a pool, start tracking dispatched requests, end tracking and learn
//! from reports, file a scrape's engine metrics, forget what was never reported. The
//! service's handlers and background tasks only decode, call these, encode.

use std::time::Instant;

use headroom_protocol::health::Outcome;
use headroom_protocol::{
    limits, BatchAck, DispatchBatch, EndpointPrediction, Observation, PredictRequest, PredictResponse, Report,
    ReportBatch,
};

use crate::callers::Caller;
use crate::model::features;
use crate::pool::{Applied, EngineMetrics, Finished, Kept};
use crate::predictor::Predictor;

/// Predictions and state for every endpoint of `req.pool`; `None` when there is no such pool.
/// The answer is remembered for the request's dispatch.
pub fn predict(state: &Predictor, req: PredictRequest, now: Instant) -> Option<PredictResponse> {
    predict_batch(state, vec![req], now).ok().and_then(|mut answers| answers.pop())
}

/// [`predict`] without remembering the answer: what flow control judges a waiting request
/// on, round after round, until one answer goes back ([`remember`] keeps that one). Each
/// record it replaced would have cost a copy of every endpoint's state.
pub fn judge(state: &Predictor, req: PredictRequest, now: Instant) -> Option<PredictResponse> {
    predicted(state, vec![req], now, false).ok().and_then(|mut answers| answers.pop())
}

/// Keeps `answer`, sent for `req`, as the record its dispatch and report are read against.
pub fn remember(state: &Predictor, req: &PredictRequest, answer: &PredictResponse, now: Instant) {
    let states: Vec<_> = answer.endpoints.iter().map(|e| e.state.clone()).collect();
    let predicted: Vec<_> = answer.endpoints.iter().map(|e| (e.ttft_ms, e.tpot_ms)).collect();
    state.pools.with(&req.pool, |p| p.remember(&req.request_id, &req.request, &states, &predicted, now));
}

/// [`predict`] for each request, the model run once over all their rows (one call into
/// ONNX Runtime for the whole batch). `Err((i, pool))`: `reqs[i]` names no known pool.
pub fn predict_batch(
    state: &Predictor,
    reqs: Vec<PredictRequest>,
    now: Instant,
) -> Result<Vec<PredictResponse>, (usize, String)> {
    predicted(state, reqs, now, true)
}

/// Each request's answer, remembered for its dispatch when `keep`.
fn predicted(
    state: &Predictor,
    reqs: Vec<PredictRequest>,
    now: Instant,
    keep: bool,
) -> Result<Vec<PredictResponse>, (usize, String)> {
    let stale_ms = state.config.stale_after_ms;
    let mut pending = Vec::with_capacity(reqs.len());
    let mut rows: Vec<features::Row> = Vec::new();
    for (i, req) in reqs.into_iter().enumerate() {
        let (addresses, states, ejected) = state
            .pools
            .with(&req.pool, |pool| {
                let addresses: Vec<String> = pool.endpoints.iter().map(|e| e.address.clone()).collect();
                (addresses, pool.states_for(&req.request, now), pool.ejected(now))
            })
            .ok_or_else(|| (i, req.pool.clone()))?;
        // Endpoints without fresh engine metrics get no prediction: say nothing rather than
        // guess. Nor do endpoints ejected for failing requests: their metrics may look idle
        // (a server answering 500 at once is the idlest in the pool), and no prediction
        // keeps them out of every tier and of flow control's choice.
        let fresh: Vec<usize> = (0..states.len())
            .filter(|&i| states[i].metrics_age_ms.is_some_and(|age| age <= stale_ms))
            .filter(|&i| !ejected.get(i).copied().unwrap_or(false))
            .collect();
        rows.extend(fresh.iter().map(|&i| state.models.row(&req.request, &states[i])));
        pending.push((req, addresses, states, fresh));
    }
    let (predicted, model_version) = state.models.predict(&rows);
    let mut predicted = predicted.into_iter();
    let mut answers = Vec::with_capacity(pending.len());
    for (req, addresses, states, fresh) in pending {
        // A model or prior answer out of range says "unknown", never a number the filter
        // cannot use. (`zip` asks `fresh` first, so each request takes exactly its own rows'
        // answers.)
        let mut answered: Vec<(Option<f64>, Option<f64>)> = vec![(None, None); states.len()];
        for (&i, (ttft, tpot)) in fresh.iter().zip(predicted.by_ref()) {
            answered[i] = (limits::ms_or_none(Some(ttft)), limits::ms_or_none(Some(tpot)));
        }
        // The record a dispatch and a report of this request will be read against.
        if keep {
            state.pools.with(&req.pool, |p| p.remember(&req.request_id, &req.request, &states, &answered, now));
        }
        let endpoints = addresses
            .into_iter()
            .zip(states)
            .zip(answered)
            .map(|((address, s), (ttft_ms, tpot_ms))| EndpointPrediction { address, ttft_ms, tpot_ms, state: s })
            .collect();
        answers.push(PredictResponse { pool: req.pool, model_version: model_version.clone(), endpoints, flow: None });
    }
    Ok(answers)
}

/// Starts tracking each request `caller` dispatched (the batch is already checked), as far
/// as its quotas allow (`crate::callers`): the dispatches past its rate are not tracked.
pub fn dispatch(state: &Predictor, batch: &DispatchBatch, caller: &Caller, now: Instant) -> BatchAck {
    let mut ack = BatchAck::default();
    let granted = state.callers.take(caller, batch.dispatches.len(), now);
    let past_rate = batch.dispatches.len().saturating_sub(granted);
    if past_rate > 0 {
        ack.rejected += past_rate as u32;
        state.metrics.caller_refused(caller.name(), "caller_rate", past_rate as u64);
    }
    for d in &batch.dispatches[..granted] {
        let applied = state.pools.with(&d.pool, |p| p.dispatch_from(d, caller, now));
        if applied == Some(Applied::AcceptedWithoutRecord) {
            state.metrics.dispatched_without_record();
        }
        let result = match applied {
            Some(Applied::Accepted | Applied::AcceptedWithoutRecord) => "accepted",
            Some(Applied::AlreadyFinished) => "already_finished",
            Some(Applied::UnknownEndpoint) => "unknown_endpoint",
            Some(Applied::PoolFull) => "pool_full",
            Some(Applied::CallerFull) => "caller_full",
            None => "unknown_pool",
        };
        if matches!(applied, Some(Applied::Accepted | Applied::AcceptedWithoutRecord)) {
            ack.accepted += 1;
        } else {
            ack.rejected += 1;
            tracing::debug!(request_id = %d.request_id, pool = %d.pool, endpoint = %d.endpoint, result, "dispatch not tracked");
        }
        if applied == Some(Applied::CallerFull) {
            state.metrics.caller_refused(caller.name(), result, 1);
        } else {
            state.metrics.dispatch(result, 1);
        }
    }
    ack
}

/// Ends tracking of each request `caller` reported and learns from those this predictor saw
/// dispatched, to the endpoint that served them (the batch is already checked). What a
/// report says of its endpoints' health counts only for a request dispatched here, so a
/// token holder cannot eject endpoints with reports of requests nobody sent.
pub fn report(state: &Predictor, batch: ReportBatch, caller: &Caller, now: Instant) -> BatchAck {
    let mut ack = BatchAck::default();
    for a in &batch.abandoned {
        // A pool this predictor does not serve has no queue to leave, and gets none.
        if state.pools.with(&a.pool, |_| ()).is_none() {
            state.metrics.report("abandoned_unknown", 1);
            continue;
        }
        let left = state.flows.abandon(&a.pool, &a.request_id);
        if left {
            state.metrics.flow_left(&a.pool);
        }
        state.pools.with(&a.pool, |p| p.cancel_reservation(&a.request_id));
        state.metrics.report(if left { "abandoned" } else { "abandoned_unknown" }, 1);
    }
    // First tokens first: one for a request whose observation is in the same batch
    // would find it no longer tracked.
    for f in &batch.first_tokens {
        let applied = state.pools.with(&f.pool, |p| p.first_token(&f.request_id, &f.endpoint, now));
        state.metrics.report(if applied == Some(true) { "first_token" } else { "first_token_unknown" }, 1);
    }
    // Past prefill frees room for new prompts: queued requests may fit now.
    if !batch.first_tokens.is_empty() {
        state.flows.wake();
    }
    for r in batch.reports {
        // One lock of the pool: end tracking and, for a streamed 200 served where it was
        // dispatched, fold its TPOT into that endpoint's recent average (only a stream has one).
        let tpot = r.tpot_ms.filter(|_| r.status == 200);
        let finished = state.pools.with(&r.pool, |p| {
            let finished = p.finish_from(&r.request_id, caller, now);
            // Passive health: where it failed before a retry served it elsewhere, and what
            // the endpoint that answered did.
            if matches!(finished, Finished::Tracked(..) | Finished::Late(..)) {
                for (at, outcome) in Outcome::of_request(r.failed_at.as_deref(), &r.endpoint, r.status) {
                    let ejected = p.answered(at, outcome, now);
                    if outcome == Outcome::Failure {
                        state.metrics.endpoint_failed(&r.pool, ejected);
                    }
                }
            }
            if let (Finished::Tracked(at, _), Some(tpot)) = (&finished, tpot) {
                if *at == r.endpoint {
                    p.observed_tpot(&r.endpoint, tpot, now);
                }
            }
            finished
        });
        let finished = match finished {
            None => {
                ack.rejected += 1;
                state.metrics.report("unknown_pool", 1);
                continue;
            }
            Some(Finished::OtherCaller) => {
                ack.rejected += 1;
                state.metrics.report("other_caller", 1);
                continue;
            }
            Some(finished) => finished,
        };
        ack.accepted += 1;
        state.metrics.report("accepted", 1);
        // A finished request frees its endpoint: drains the pool's queue.
        state.flows.finished(&r.pool, now);
        // Dispatched here and tracked until now: `dispatches{accepted}` = `reports{tracked}` +
        // in flight + expired, the accounting the soak checks. A late one was expired.
        match finished {
            Finished::Tracked(..) => state.metrics.report("tracked", 1),
            Finished::Late(..) => state.metrics.report("late", 1),
            Finished::Unknown | Finished::OtherCaller => {}
        }
        // What the gateway measured, completed from this predictor's own record: a report
        // teaches only where its request was predicted here and served where it was dispatched.
        let dispatched_here = finished.address() == Some(r.endpoint.as_str());
        let o = match finished.kept().filter(|_| dispatched_here) {
            Some(kept) => {
                let o = completed(r, kept);
                state.metrics.observed(&o);
                if state.models.observe(&o) {
                    state.metrics.report("sampled", 1);
                }
                o
            }
            None => {
                state.metrics.report(if dispatched_here { "no_record" } else { "not_dispatched" }, 1);
                Observation::unrecorded(r)
            }
        };
        state.observations.lock().unwrap_or_else(|p| p.into_inner()).push(o);
    }
    ack
}

/// A report completed with what the predictor kept of its request where it was dispatched:
/// the features, that endpoint's state then, and the predictions answered.
fn completed(report: Report, kept: &Kept) -> Observation {
    Observation {
        report,
        request: kept.request.clone(),
        state_at_dispatch: Some(kept.state.clone()),
        predicted_ttft_ms: kept.predicted_ttft_ms,
        predicted_tpot_ms: kept.predicted_tpot_ms,
    }
}

/// What one scrape of an endpoint's engine metrics found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scraped {
    Metrics(EngineMetrics),
    /// Nothing accepted the connection: the server is down, not merely slow or odd.
    Unreachable,
    /// A timeout, an error status or a body that is not its metrics: nothing said about its load.
    Failed,
}

/// Files one scrape of `address` in `pool`, read at `now`. A server that refuses the
/// connection has no state to predict from: its metrics (and what it was thought to cache)
/// are dropped at once, so it gets no prediction from this moment rather than after
/// `stale_after_ms` (during which its in-flight count falls as its streams are cut, and it
/// would look like the idlest server in the pool). A timeout or a garbled body says nothing
/// about the server's load being different, so those only let the metrics age. Fresh
/// metrics can show room the last ones did not: the flow queue is judged again. Returns the
/// endpoint's failed scrapes so far when this one failed (`None`: it succeeded, or the
/// endpoint is not in the pool).
pub fn scraped(state: &Predictor, pool: &str, address: &str, scraped: Scraped, now: Instant) -> Option<u64> {
    let failures = state
        .pools
        .with(pool, |p| {
            let e = p.endpoints.iter_mut().find(|e| e.address == address)?;
            match scraped {
                Scraped::Metrics(m) => {
                    e.scraped(m, now);
                    None
                }
                Scraped::Unreachable | Scraped::Failed => {
                    if scraped == Scraped::Unreachable {
                        e.unreachable();
                    }
                    e.scrape_errors += 1;
                    Some(e.scrape_errors)
                }
            }
        })
        .flatten();
    let ok = matches!(scraped, Scraped::Metrics(_));
    state.metrics.scrape(ok);
    if ok {
        state.flows.wake();
    }
    failures
}

/// Forgets, in every pool, the requests never reported past their expiry (`pool::Expiry`)
/// and old finished ids and records, at `now`: `(pool, requests forgotten)` for each pool
/// that forgot any, counted in `headroom_in_flight_expired_total`.
pub fn expire(state: &Predictor, now: Instant) -> Vec<(String, usize)> {
    let mut forgotten = Vec::new();
    for pool in state.pools.names() {
        let expired = state.pools.with(&pool, |p| p.expire(now)).unwrap_or(0);
        if expired > 0 {
            state.metrics.expired(expired as u64);
            forgotten.push((pool, expired));
        }
    }
    forgotten
}
