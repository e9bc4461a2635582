//! What the filter owes the predictor: dispatches and observations, batched on
//! the tick, and what happens to a batch after its call.
//!
//! Rules, each for a reason:
//! - Bounded queues (`queue::BoundedQueue`): while the predictor is away the
//!   oldest items are dropped and counted, never a VM's memory grown.
//! - A batch stays under `max_batch_bytes` encoded, so it fits the predictor's
//!   body limit; an item too large on its own is dropped and counted
//!   (`oversized`), and the rest of its batch still goes.
//! - A report is sent only after the dispatch of its request was delivered: the
//!   predictor learns only from requests it saw dispatched, so a report that
//!   overtook its dispatch would be wasted. Each dispatch gets a sequence number;
//!   dispatch batches complete in order (one in flight at a time), so "delivered
//!   through N" is one watermark. Reports keep their order: one waiting for its
//!   dispatch holds those behind it, until the next dispatch batch is answered.
//! - After the call: delivered (2xx) is done; refused (4xx) can never succeed and
//!   would block the queue behind it, so it is dropped and counted; failed (no
//!   answer, timeout, 5xx) goes back to the front for a later tick.

use headroom_protocol::{codec, Abandoned, Dispatch, DispatchBatch, FirstToken, Format, Observation, ReportBatch};
use serde::Serialize;

use crate::queue::BoundedQueue;

/// Bytes allowed for a batch's framing beyond the sum of its items.
const FRAMING_BYTES: usize = 64;

/// How a batch call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx.
    Delivered,
    /// 4xx: the predictor will never take it.
    Refused,
    /// No answer, a timeout or a 5xx.
    Failed,
}

impl Outcome {
    /// The outcome of an answer with `status` (`None`: no answer).
    pub fn of(status: Option<u16>) -> Outcome {
        match status {
            Some(200..=299) => Outcome::Delivered,
            Some(400..=499) => Outcome::Refused,
            _ => Outcome::Failed,
        }
    }
}

/// An item of the report queue: a request's first token, then its observation.
/// Both wait for the request's dispatch to be delivered; they keep their order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Report {
    FirstToken(FirstToken),
    /// A request that left while waiting in the predictor's queue (never dispatched).
    Abandoned(Abandoned),
    /// Boxed: an observation is several times a first token's size.
    Observation(Box<Observation>),
}

/// A batch on its way, kept to requeue if its call fails.
#[derive(Debug, Clone, PartialEq)]
pub enum Batch {
    Dispatches(Vec<(u64, Dispatch)>),
    Observations(Vec<(u64, Report)>),
}

impl Batch {
    /// The highest dispatch sequence number in it (0: none).
    pub fn last_seq(&self) -> u64 {
        match self {
            Batch::Dispatches(items) => last_seq(items),
            Batch::Observations(_) => 0,
        }
    }
}

/// Counts for the filter's stats, taken (and reset) by [`Outbox::take_counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Observations delivered.
    pub reported: u64,
    /// Items dropped because a queue was full.
    pub dropped: u64,
    /// Items dropped because one alone exceeds `max_batch_bytes`.
    pub oversized: u64,
    /// Items in batches the predictor refused (4xx).
    pub refused: u64,
    /// Batch calls that failed and were requeued.
    pub failed: u64,
}

/// The dispatch and report queues of one VM.
#[derive(Debug)]
pub struct Outbox {
    dispatches: BoundedQueue<(u64, Dispatch)>,
    observations: BoundedQueue<(u64, Report)>,
    next_seq: u64,
    /// Every dispatch with a sequence number up to this one is delivered or given up.
    done_through: u64,
    max_batch: usize,
    max_batch_bytes: usize,
    counts: Counts,
}

impl Outbox {
    pub fn new(max_queued: usize, max_batch: usize, max_batch_bytes: usize) -> Self {
        Outbox {
            dispatches: BoundedQueue::new(max_queued),
            observations: BoundedQueue::new(max_queued),
            next_seq: 0,
            done_through: 0,
            max_batch: max_batch.max(1),
            max_batch_bytes,
            counts: Counts::default(),
        }
    }

    /// New limits from a reconfiguration; queued items stay.
    pub fn set_limits(&mut self, max_batch: usize, max_batch_bytes: usize) {
        self.max_batch = max_batch.max(1);
        self.max_batch_bytes = max_batch_bytes;
    }

    /// Queues a dispatch; returns its sequence number, to pass with the request's report.
    pub fn dispatch(&mut self, d: Dispatch) -> u64 {
        self.next_seq += 1;
        self.dispatches.push((self.next_seq, d));
        self.next_seq
    }

    /// Queues an observation; `dispatch_seq` is what [`Outbox::dispatch`] returned (0: none).
    pub fn report(&mut self, dispatch_seq: u64, o: Observation) {
        self.observations.push((dispatch_seq, Report::Observation(Box::new(o))));
    }

    /// Queues a first-token event of the request dispatched as `dispatch_seq`.
    pub fn first_token(&mut self, dispatch_seq: u64, f: FirstToken) {
        self.observations.push((dispatch_seq, Report::FirstToken(f)));
    }

    /// Queues word of a request that left while the predictor held it (no dispatch: sent
    /// with the next report batch).
    pub fn abandoned(&mut self, a: Abandoned) {
        self.observations.push((0, Report::Abandoned(a)));
    }

    /// The next dispatch batch and its encoded body, if any is queued.
    pub fn next_dispatches(&mut self) -> Option<(Batch, Vec<u8>)> {
        let (batch, body) = self.take_dispatches(self.max_batch_bytes)?;
        encoded(&body).map(|bytes| (batch, bytes))
    }

    /// The next report batch: only observations whose dispatch was delivered (or that had none).
    pub fn next_reports(&mut self) -> Option<(Batch, Vec<u8>)> {
        let (batch, body) = self.take_reports(self.max_batch_bytes, 0)?;
        encoded(&body).map(|bytes| (batch, bytes))
    }

    /// The next dispatch batch within `max_bytes` encoded, as the message it goes in.
    pub fn take_dispatches(&mut self, max_bytes: usize) -> Option<(Batch, DispatchBatch)> {
        let (items, oversized) = take_fitting(&mut self.dispatches, self.max_batch, max_bytes, |_| true);
        self.counts.oversized += oversized;
        if items.is_empty() {
            return None;
        }
        let body = DispatchBatch { dispatches: items.iter().map(|(_, d)| d.clone()).collect() };
        Some((Batch::Dispatches(items), body))
    }

    /// The next report batch within `max_bytes`: reports whose dispatch was delivered, or
    /// goes ahead of them in the same call (sequence numbers through `riding`, 0: none).
    pub fn take_reports(&mut self, max_bytes: usize, riding: u64) -> Option<(Batch, ReportBatch)> {
        let done = self.done_through.max(riding);
        let (items, oversized) = take_fitting(&mut self.observations, self.max_batch, max_bytes, |seq| seq <= done);
        self.counts.oversized += oversized;
        if items.is_empty() {
            return None;
        }
        let mut body = ReportBatch::default();
        for (_, item) in &items {
            match item {
                Report::FirstToken(f) => body.first_tokens.push(f.clone()),
                Report::Abandoned(a) => body.abandoned.push(a.clone()),
                Report::Observation(o) => body.observations.push((**o).clone()),
            }
        }
        Some((Batch::Observations(items), body))
    }

    /// Applies how a batch's call ended.
    pub fn sent(&mut self, batch: Batch, outcome: Outcome) {
        match (outcome, batch) {
            (Outcome::Delivered, Batch::Dispatches(items)) => self.dispatched_through(&items),
            (Outcome::Delivered, Batch::Observations(items)) => {
                self.counts.reported += items.iter().filter(|(_, r)| matches!(r, Report::Observation(_))).count() as u64
            }
            (Outcome::Refused, Batch::Dispatches(items)) => {
                self.counts.refused += items.len() as u64;
                self.dispatched_through(&items);
            }
            (Outcome::Refused, Batch::Observations(items)) => self.counts.refused += items.len() as u64,
            (Outcome::Failed, Batch::Dispatches(items)) => {
                self.counts.failed += 1;
                self.dispatches.requeue(items);
            }
            (Outcome::Failed, Batch::Observations(items)) => {
                self.counts.failed += 1;
                self.observations.requeue(items);
            }
        }
    }

    fn dispatched_through(&mut self, items: &[(u64, Dispatch)]) {
        self.done_through = self.done_through.max(last_seq(items));
    }

    /// Counts since the last call, queue overflow included.
    pub fn take_counts(&mut self) -> Counts {
        let mut c = std::mem::take(&mut self.counts);
        c.dropped = self.dispatches.take_dropped() + self.observations.take_dropped();
        c
    }
}

/// The highest sequence number among `items` (0: none).
fn last_seq<T>(items: &[(u64, T)]) -> u64 {
    items.iter().map(|(s, _)| *s).max().unwrap_or(0)
}

fn encoded<T: Serialize>(body: &T) -> Option<Vec<u8>> {
    codec::encode(Format::MsgPack, body).ok()
}

/// Takes items from the front of `queue` while they are `eligible` (by sequence
/// number), up to `max` items and `max_bytes` encoded. An item that alone does not
/// fit (or cannot be encoded) is dropped; returns the batch and how many were dropped.
fn take_fitting<T: Serialize>(
    queue: &mut BoundedQueue<(u64, T)>,
    max: usize,
    max_bytes: usize,
    eligible: impl Fn(u64) -> bool,
) -> (Vec<(u64, T)>, u64) {
    let budget = max_bytes.saturating_sub(FRAMING_BYTES);
    let (mut batch, mut used, mut oversized) = (Vec::new(), 0usize, 0u64);
    while batch.len() < max {
        let Some((seq, item)) = queue.front() else { break };
        if !eligible(*seq) {
            break;
        }
        let size = codec::encode(Format::MsgPack, item).map(|b| b.len()).unwrap_or(usize::MAX);
        if size > budget {
            queue.take(1);
            oversized += 1;
            continue;
        }
        if used + size > budget {
            break;
        }
        used += size;
        batch.extend(queue.take(1));
    }
    (batch, oversized)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::{RequestFeatures, RouteSource};

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn dispatch(id: &str, hashes: usize) -> Dispatch {
        Dispatch {
            pool: "p".into(),
            request_id: id.into(),
            endpoint: "e:1".into(),
            request: RequestFeatures { prefix_hashes: vec![u64::MAX; hashes], ..Default::default() },
            predicted_ttft_ms: None,
            predicted_tpot_ms: None,
        }
    }

    fn observation(id: &str) -> Observation {
        Observation {
            pool: "p".into(),
            request_id: id.into(),
            endpoint: "e:1".into(),
            request: RequestFeatures::default(),
            state_at_dispatch: None,
            predicted_ttft_ms: None,
            predicted_tpot_ms: None,
            source: RouteSource::Fallback,
            ttft_ms: None,
            tpot_ms: None,
            e2e_ms: 1.0,
            output_tokens: None,
            cached_tokens: None,
            status: 200,
        }
    }

    fn ids(batch: &Batch) -> Vec<String> {
        match batch {
            Batch::Dispatches(items) => items.iter().map(|(_, d)| d.request_id.clone()).collect(),
            Batch::Observations(items) => items
                .iter()
                .map(|(_, r)| match r {
                    Report::FirstToken(f) => format!("first:{}", f.request_id),
                    Report::Observation(o) => o.request_id.clone(),
                    Report::Abandoned(a) => format!("abandoned:{}", a.request_id),
                })
                .collect(),
        }
    }

    #[test]
    fn a_first_token_goes_with_the_reports_after_its_dispatch_and_before_its_observation() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        let seq = out.dispatch(dispatch("a", 0));
        let first = FirstToken { pool: "p".into(), request_id: "a".into(), endpoint: "e:1".into(), ttft_ms: 12.0 };
        out.first_token(seq, first.clone());
        out.report(seq, observation("a"));
        assert!(out.next_reports().is_none(), "the dispatch is not delivered yet");
        let (batch, _) = out.next_dispatches().unwrap();
        out.sent(batch, Outcome::Delivered);
        let (batch, body) = out.next_reports().unwrap();
        assert_eq!(ids(&batch), ["first:a", "a"]);
        let sent: ReportBatch = codec::decode(Format::MsgPack, &body).unwrap();
        assert_eq!((sent.first_tokens, sent.observations.len()), (vec![first], 1));
        out.sent(batch, Outcome::Delivered);
        assert_eq!(out.take_counts().reported, 1, "observations are what count as reported");
    }

    #[test]
    fn a_report_waits_for_its_dispatch_to_be_delivered() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        let seq = out.dispatch(dispatch("a", 0));
        out.report(0, observation("envoy-routed")); // no dispatch: free to go
        out.report(seq, observation("a"));
        let (dispatches, _) = out.next_dispatches().unwrap();
        // The dispatch is on its way but not delivered: the report must not overtake it
        // (reports keep their order, so what queued behind it waits too, for a tick at most).
        let (reports, _) = out.next_reports().unwrap();
        assert_eq!(ids(&reports), ["envoy-routed"]);
        out.sent(reports, Outcome::Delivered);
        assert!(out.next_reports().is_none());
        out.sent(dispatches, Outcome::Delivered);
        let (reports, body) = out.next_reports().unwrap();
        assert_eq!(ids(&reports), ["a"]);
        let decoded: ReportBatch = codec::decode(Format::MsgPack, &body).unwrap();
        assert_eq!(decoded.observations[0].request_id, "a");
    }

    #[test]
    fn failed_batches_requeue_and_refused_ones_are_dropped_and_counted() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        let seq = out.dispatch(dispatch("a", 0));
        let (batch, _) = out.next_dispatches().unwrap();
        out.sent(batch, Outcome::Failed);
        out.report(seq, observation("a"));
        assert!(out.next_reports().is_none(), "still not delivered");
        let (batch, _) = out.next_dispatches().unwrap();
        assert_eq!(ids(&batch), ["a"], "requeued at the front");
        out.sent(batch, Outcome::Refused);
        assert!(out.next_dispatches().is_none(), "the refused batch is not queued again");
        let (reports, _) = out.next_reports().unwrap();
        out.sent(reports, Outcome::Failed);
        let (reports, _) = out.next_reports().unwrap();
        out.sent(reports, Outcome::Delivered);
        let c = out.take_counts();
        assert_eq!((c.refused, c.failed, c.reported), (1, 2, 1));
        assert_eq!(Outcome::of(Some(503)), Outcome::Failed);
        assert_eq!(Outcome::of(Some(401)), Outcome::Refused);
        assert_eq!(Outcome::of(None), Outcome::Failed);
    }

    #[test]
    fn batches_fit_the_byte_limit_and_an_oversized_item_alone_is_dropped() {
        let limit = 4096;
        let mut out = Outbox::new(1000, 500, limit);
        for i in 0..40 {
            out.dispatch(dispatch(&format!("r{i}"), 20)); // about 230 bytes each
        }
        out.dispatch(dispatch("huge", 1000)); // about 9 KB: can never fit
        out.dispatch(dispatch("after", 0));
        let mut seen = Vec::new();
        while let Some((batch, body)) = out.next_dispatches() {
            assert!(body.len() <= limit, "{} bytes", body.len());
            seen.extend(ids(&batch));
            out.sent(batch, Outcome::Delivered);
        }
        assert_eq!(seen.len(), 41, "every other item sent");
        assert!(!seen.contains(&"huge".to_string()) && seen.contains(&"after".to_string()));
        assert_eq!(out.take_counts().oversized, 1);
    }
}
