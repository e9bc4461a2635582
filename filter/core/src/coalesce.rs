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
//! A call goes on the VM's predict stream when one is open (`crate::stream`), else as an
//! HTTP call to `/v1/predict/batch`; [`Coalescer::send`] is given the way by the VM.
//!
//! Requests that may wait in the predictor's flow-control queue are never coalesced: each
//! is answered when it can go, so they keep their own call.

use std::collections::{HashMap, VecDeque};

use headroom_protocol::stream::StreamAnswer;
use headroom_protocol::{
    codec, Dispatch, Format, PredictBatch, PredictBatchResponse, PredictRequest, PredictResponse, ReportBatch,
};

use crate::host::{callout_status, predictor_answer, Buffer, Event, FallbackCause, Host};

/// Each member's share of a call's answers: one answer per request, in order, or which is
/// whose cannot be known and every member falls back.
fn share(members: Vec<u32>, answers: Result<Vec<PredictResponse>, FallbackCause>) -> Vec<Delivery> {
    match answers {
        Ok(answers) if answers.len() == members.len() => {
            members.into_iter().zip(answers).map(|(context, answer)| Delivery { context, answer: Ok(answer) }).collect()
        }
        Ok(_) => share(members, Err(FallbackCause::BadAnswer)),
        Err(cause) => members.into_iter().map(|context| Delivery { context, answer: Err(cause) }).collect(),
    }
}

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

/// How a call went, and the handle its answer comes back by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallId {
    /// An HTTP call: its token (the answer arrives in the root's callout callback; Envoy
    /// enforces its timeout).
    Http(u32),
    /// A message on the predict stream with this token (answers come in order, and one call
    /// is out at a time, so the stream's next answer is this call's; the VM times it).
    Stream(u32),
}

/// Sends one call's body; the cluster it went to and its handle, or why it could not go.
pub type Transport<'a> = dyn FnMut(&mut dyn Host, &[u8]) -> Result<(String, CallId), FallbackCause> + 'a;

/// A call under way.
#[derive(Debug)]
struct Call {
    cluster: String,
    members: Vec<u32>,
    since_ms: u64,
}

/// The coalesced predict calls of one VM.
#[derive(Debug, Default)]
pub struct Coalescer {
    waiting: VecDeque<Waiting>,
    calls: HashMap<CallId, Call>,
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

    /// Sends the waiting requests by `transport`, when no call is out: one call at a time, so
    /// that what arrives during a round trip goes together in the next. `ride` goes in the
    /// first call. Returns what could not be sent, delivered as failed, and the call that
    /// carries `ride` (`None`: it was not sent).
    pub fn send(
        &mut self,
        host: &mut dyn Host,
        max_bytes: usize,
        ride: Ride,
        transport: &mut Transport<'_>,
    ) -> (Vec<Delivery>, Option<CallId>) {
        let mut failed = Vec::new();
        let mut ride = Some(ride);
        let mut ride_call = None;
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
            let sent = body.map_err(|_| FallbackCause::CallFailed).and_then(|body| transport(host, &body));
            match sent {
                Ok((cluster, call)) => {
                    let stream = matches!(call, CallId::Stream(_));
                    host.record(Event::CoalescedCall { requests: members.len(), stream });
                    self.calls.insert(call, Call { cluster, members, since_ms: host.now_ms() });
                    if carries_ride {
                        ride_call = Some(call);
                    }
                }
                Err(cause) => {
                    failed.extend(members.into_iter().map(|context| Delivery { context, answer: Err(cause) }))
                }
            }
        }
        (failed, ride_call)
    }

    /// The answer to HTTP call `token` (its `:status` in the callout headers, `body_size`
    /// bytes of body): each member's share, and the cluster called with the status it
    /// answered, for the replica's health. `None` when `token` is not one of these calls.
    pub fn answered(
        &mut self,
        host: &dyn Host,
        token: u32,
        body_size: usize,
    ) -> Option<(String, Option<u16>, Vec<Delivery>)> {
        let call = self.calls.remove(&CallId::Http(token))?;
        let status = callout_status(host);
        let answers = predictor_answer::<PredictBatchResponse>(host, status, body_size).map(|b| b.answers);
        Some((call.cluster, status, share(call.members, answers)))
    }

    /// The message that arrived on stream `token` (`message_size` bytes, a [`StreamAnswer`]):
    /// the answer to the call out on it, as [`Coalescer::answered`]. `None` when no call is
    /// out on that stream.
    pub fn answered_on_stream(
        &mut self,
        host: &dyn Host,
        token: u32,
        message_size: usize,
    ) -> Option<(String, Option<u16>, Vec<Delivery>)> {
        let call = self.calls.remove(&CallId::Stream(token))?;
        let answer = host
            .buffer(Buffer::StreamMessage, message_size)
            .and_then(|bytes| codec::decode::<StreamAnswer>(Format::MsgPack, &bytes).ok());
        let (status, answers) = match answer {
            Some(a) if a.status == 200 => (Some(200), Ok(a.answers)),
            Some(a) => (Some(a.status), Err(FallbackCause::Unavailable)),
            None => (Some(200), Err(FallbackCause::BadAnswer)),
        };
        Some((call.cluster, status, share(call.members, answers)))
    }

    /// Ends call `call` without an answer (its stream closed, or its answer is overdue):
    /// each member falls back for `cause`. `None` when no such call is out.
    pub fn fail(&mut self, call: CallId, cause: FallbackCause) -> Option<(String, Vec<Delivery>)> {
        let call_out = self.calls.remove(&call)?;
        Some((call_out.cluster, share(call_out.members, Err(cause))))
    }

    /// The call out on a stream whose answer is `timeout_ms` overdue: Envoy times HTTP
    /// calls, not stream messages.
    pub fn overdue_on_stream(&self, now_ms: u64, timeout_ms: u64) -> Option<CallId> {
        self.calls
            .iter()
            .find(|(id, c)| matches!(id, CallId::Stream(_)) && now_ms.saturating_sub(c.since_ms) >= timeout_ms)
            .map(|(id, _)| *id)
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
