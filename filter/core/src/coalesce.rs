//! The predict calls of one VM, coalesced: while one call is out, the requests that
//! arrive wait and go together in the next, one call per round trip.
//!
//! Why: Envoy spends about as much CPU on one call to the predictor (its HTTP client, a
//! request and a response over a socket) as on proxying a whole request, and the filter
//! made one per request (docs/performance.md). Coalesced, a busy worker pays it once per
//! batch; an idle one still sends each request's call at once, so nothing waits for a
//! batch to fill.
//!
//! The calls go from the VM's root context, not the request's: an answer is delivered to
//! the context that made the call, and a request context can end (its client gone, its
//! stream done) before a batch it carried comes back. The request context wakes the root
//! through the host ([`Host::wake`]); the root sends, takes the answer and hands each
//! request its share ([`Delivery`]), which the adapter passes to that request's
//! [`crate::flow::Flow::on_coalesced_answer`].
//!
//! Requests that may wait in the predictor's flow-control queue are never coalesced: each
//! is answered when it can go, so they keep their own call.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use headroom_protocol::{
    codec, Dispatch, Format, PredictBatch, PredictBatchResponse, PredictRequest, PredictResponse, ReportBatch,
};

use crate::host::{callout_status, predictor_answer, Event, FallbackCause, Host};

/// At most this many requests per call: past it the call's body and its answer grow
/// (every endpoint's state per request) while the saving per request hardly does.
pub const MAX_REQUESTS_PER_CALL: usize = 64;

/// One request's share of a coalesced call's outcome, for the request context `context`.
#[derive(Debug)]
pub struct Delivery {
    pub context: u32,
    pub answer: Result<PredictResponse, FallbackCause>,
}

/// What the worker owes the predictor, riding on the next call (`PredictBatch`).
#[derive(Debug, Default)]
pub struct Ride {
    pub dispatches: Vec<Dispatch>,
    pub reports: Option<ReportBatch>,
}

/// A request waiting for the next call.
#[derive(Debug)]
struct Waiting {
    context: u32,
    request: PredictRequest,
    since_ms: u64,
}

/// A call under way.
#[derive(Debug)]
struct Call {
    cluster: String,
    members: Vec<u32>,
}

/// The coalesced predict calls of one VM.
#[derive(Debug, Default)]
pub struct Coalescer {
    waiting: VecDeque<Waiting>,
    calls: HashMap<u32, Call>,
    /// A wake-up is on its way to the root context.
    woken: bool,
}

impl Coalescer {
    /// `request` (of request context `context`) waits for the next call. Wakes the root
    /// when no call is out and no wake-up is on its way; gives `request` back when the host
    /// cannot wake it (it is not queued then, and makes its own call).
    pub fn join(
        &mut self,
        host: &mut dyn Host,
        context: u32,
        request: PredictRequest,
    ) -> Result<(), Box<PredictRequest>> {
        if self.calls.is_empty() && !self.woken {
            if host.wake().is_err() {
                return Err(Box::new(request));
            }
            self.woken = true;
        }
        self.waiting.push_back(Waiting { context, request, since_ms: host.now_ms() });
        Ok(())
    }

    /// The request of `context` no longer waits (its stream ended); its share of a call
    /// already out is dropped when the answer comes.
    pub fn forget(&mut self, context: u32) {
        self.waiting.retain(|w| w.context != context);
    }

    /// Requests waiting for a call.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The root's wake-up arrived.
    pub fn woke(&mut self) {
        self.woken = false;
    }

    /// Requests wait and no call is out: [`Coalescer::send`] would send one.
    pub fn ready(&self) -> bool {
        self.calls.is_empty() && !self.waiting.is_empty()
    }

    /// Sends the waiting requests to `cluster`, when no call is out: one call at a time, so
    /// that what arrives during a round trip goes together in the next. `ride` goes in the
    /// first call. Returns what could not be sent, delivered as failed, and the token of
    /// the call that carries `ride` (`None`: it was not sent).
    pub fn send(
        &mut self,
        host: &mut dyn Host,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout: Duration,
        max_bytes: usize,
        ride: Ride,
    ) -> (Vec<Delivery>, Option<u32>) {
        let mut failed = Vec::new();
        let mut ride = Some(ride);
        let mut ride_token = None;
        while self.calls.is_empty() && !self.waiting.is_empty() {
            let mut batch = PredictBatch::default();
            let carries_ride = ride.is_some();
            if let Some(Ride { dispatches, reports }) = ride.take() {
                batch.dispatches = dispatches;
                batch.reports = reports;
            }
            let mut members = Vec::new();
            while let Some(w) = self.waiting.pop_front() {
                batch.requests.push(w.request);
                members.push(w.context);
                if batch.requests.len() == MAX_REQUESTS_PER_CALL {
                    break;
                }
            }
            // Over the byte bound (long prompts' prefix hashes): the later half waits again.
            let mut body = codec::encode(Format::MsgPack, &batch);
            while body.as_ref().is_ok_and(|b| b.len() > max_bytes) && batch.requests.len() > 1 {
                let keep = batch.requests.len() / 2;
                let back: Vec<_> = batch.requests.drain(keep..).zip(members.drain(keep..)).collect();
                for (request, context) in back.into_iter().rev() {
                    self.waiting.push_front(Waiting { context, request, since_ms: host.now_ms() });
                }
                body = codec::encode(Format::MsgPack, &batch);
            }
            let sent = body.map_err(|_| FallbackCause::CallFailed).and_then(|body| {
                host.http_call(cluster, headers, &body, timeout).map_err(|_| FallbackCause::CallFailed)
            });
            match sent {
                Ok(token) => {
                    host.record(Event::CoalescedCall { requests: members.len() });
                    self.calls.insert(token, Call { cluster: cluster.to_string(), members });
                    if carries_ride {
                        ride_token = Some(token);
                    }
                }
                Err(cause) => {
                    failed.extend(members.into_iter().map(|context| Delivery { context, answer: Err(cause) }))
                }
            }
        }
        (failed, ride_token)
    }

    /// The answer to call `token` (its `:status` in the callout headers, `body_size` bytes of
    /// body): each member's share, and the cluster called with the status it answered, for
    /// the replica's health. `None` when `token` is not one of these calls.
    pub fn answered(
        &mut self,
        host: &dyn Host,
        token: u32,
        body_size: usize,
    ) -> Option<(String, Option<u16>, Vec<Delivery>)> {
        let call = self.calls.remove(&token)?;
        let status = callout_status(host);
        // One answer per request, or which is whose cannot be known.
        let answers = predictor_answer::<PredictBatchResponse>(host, status, body_size).and_then(|b| {
            if b.answers.len() == call.members.len() {
                Ok(b.answers)
            } else {
                Err(FallbackCause::BadAnswer)
            }
        });
        let deliveries = match answers {
            Ok(answers) => call
                .members
                .into_iter()
                .zip(answers)
                .map(|(context, answer)| Delivery { context, answer: Ok(answer) })
                .collect(),
            Err(cause) => call.members.into_iter().map(|context| Delivery { context, answer: Err(cause) }).collect(),
        };
        Some((call.cluster, status, deliveries))
    }

    /// Requests that waited `timeout_ms` without being sent (the call ahead of them hangs):
    /// delivered as timed out, so none waits past its own call's timeout twice over.
    pub fn expire(&mut self, now_ms: u64, timeout_ms: u64) -> Vec<Delivery> {
        let mut expired = Vec::new();
        self.waiting.retain(|w| {
            let late = now_ms.saturating_sub(w.since_ms) >= timeout_ms;
            if late {
                expired.push(Delivery { context: w.context, answer: Err(FallbackCause::Timeout) });
            }
            !late
        });
        expired
    }
}
