//! What the filter owes the predictor: dispatches and reports, batched on
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
//! - One request, one predictor replica: with several replicas, a report that
//!   reaches one that never saw the dispatch teaches nothing, and the one that
//!   did keeps the request in its books until it expires. A dispatch goes to the
//!   replica current when its request was placed (its home), while that replica is
//!   up; its first token and report go where the dispatch was delivered,
//!   while that replica is up. Else the current replica takes them (a failover).
//!   A batch is a run of items from the queue's front bound for one replica.
//! - After the call: delivered (2xx) is done; refused (4xx) can never succeed and
//!   would block the queue behind it, so it is dropped and counted; failed (no
//!   answer, timeout, 5xx) goes back to the front for a later tick.

use std::collections::BTreeMap;
use std::rc::Rc;

use headroom_protocol::{codec, Abandoned, Dispatch, DispatchBatch, FirstToken, Format, Report, ReportBatch};
use serde::Serialize;

use crate::queue::BoundedQueue;

/// Bytes allowed for a batch's framing beyond the sum of its items.
const FRAMING_BYTES: usize = 64;

/// Delivered dispatches remembered per queued item allowed, for their reports' way.
const DELIVERED_PER_QUEUED: usize = 4;

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

/// An item of the report queue: a request's first token, then its report.
/// Both wait for the request's dispatch to be delivered; they keep their order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Owed {
    FirstToken(FirstToken),
    /// A request that left while waiting in the predictor's queue (never dispatched).
    Abandoned(Abandoned),
    /// Boxed: a report is several times a first token's size.
    Report(Box<Report>),
}

/// A queued item: the sequence number of its request's dispatch (0: none) and the
/// replica it belongs to when that is not its dispatch's (`None`: the current one).
#[derive(Debug, Clone, PartialEq)]
pub struct Queued<T> {
    pub seq: u64,
    pub home: Option<Rc<str>>,
    pub item: T,
}

/// Where items go: the replica `home` names while it is up, else the current one.
pub type Route<'a> = &'a dyn Fn(Option<&str>) -> String;

/// A batch on its way to replica `to`, kept to requeue if its call fails.
#[derive(Debug, Clone, PartialEq)]
pub enum Batch {
    Dispatches { to: String, items: Vec<Queued<Dispatch>> },
    Reports { to: String, items: Vec<Queued<Owed>> },
}

impl Batch {
    /// The highest dispatch sequence number in it (0: none).
    pub fn last_seq(&self) -> u64 {
        match self {
            Batch::Dispatches { items, .. } => last_seq(items),
            Batch::Reports { .. } => 0,
        }
    }

    /// The replica it goes to.
    pub fn to(&self) -> &str {
        match self {
            Batch::Dispatches { to, .. } | Batch::Reports { to, .. } => to,
        }
    }
}

/// Counts for the filter's stats, taken (and reset) by [`Outbox::take_counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Reports delivered.
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
    dispatches: BoundedQueue<Queued<Dispatch>>,
    reports: BoundedQueue<Queued<Owed>>,
    next_seq: u64,
    /// Every dispatch with a sequence number up to this one is delivered or given up.
    done_through: u64,
    /// The replica each delivered dispatch went to, until its report is delivered;
    /// bounded (the oldest forgotten: its reports then go to the current replica).
    delivered: BTreeMap<u64, Rc<str>>,
    max_delivered: usize,
    max_batch: usize,
    max_batch_bytes: usize,
    counts: Counts,
}

impl Outbox {
    pub fn new(max_queued: usize, max_batch: usize, max_batch_bytes: usize) -> Self {
        Outbox {
            dispatches: BoundedQueue::new(max_queued),
            reports: BoundedQueue::new(max_queued),
            next_seq: 0,
            done_through: 0,
            delivered: BTreeMap::new(),
            max_delivered: max_queued.max(1).saturating_mul(DELIVERED_PER_QUEUED),
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

    /// Queues a dispatch placed while replica `home` was current; returns its sequence
    /// number, to pass with the request's reports.
    pub fn dispatch(&mut self, d: Dispatch, home: &str) -> u64 {
        self.next_seq += 1;
        self.dispatches.push(Queued { seq: self.next_seq, home: Some(home.into()), item: d });
        self.next_seq
    }

    /// Queues a request's report; `dispatch_seq` is what [`Outbox::dispatch`] returned (0: none).
    pub fn report(&mut self, dispatch_seq: u64, o: Report) {
        self.reports.push(Queued { seq: dispatch_seq, home: None, item: Owed::Report(Box::new(o)) });
    }

    /// Queues a first-token event of the request dispatched as `dispatch_seq`.
    pub fn first_token(&mut self, dispatch_seq: u64, f: FirstToken) {
        self.reports.push(Queued { seq: dispatch_seq, home: None, item: Owed::FirstToken(f) });
    }

    /// Queues word of a request that left while replica `holder` held it in its queue
    /// (no dispatch: sent with the next report batch to that replica).
    pub fn abandoned(&mut self, a: Abandoned, holder: &str) {
        self.reports.push(Queued { seq: 0, home: Some(holder.into()), item: Owed::Abandoned(a) });
    }

    /// The next dispatch batch and its encoded body, if any is queued.
    pub fn next_dispatches(&mut self, route: Route) -> Option<(Batch, Vec<u8>)> {
        let (batch, body) = self.take_dispatches(self.max_batch_bytes, route, None)?;
        encoded(&body).map(|bytes| (batch, bytes))
    }

    /// The next report batch: only reports whose dispatch was delivered (or that had none).
    pub fn next_reports(&mut self, route: Route) -> Option<(Batch, Vec<u8>)> {
        let (batch, body) = self.take_reports(self.max_batch_bytes, 0, route, None)?;
        encoded(&body).map(|bytes| (batch, bytes))
    }

    /// The next dispatch batch within `max_bytes` encoded, as the message it goes in;
    /// `only`: when its replica is this one (a call there it can ride on).
    pub fn take_dispatches(
        &mut self,
        max_bytes: usize,
        route: Route,
        only: Option<&str>,
    ) -> Option<(Batch, DispatchBatch)> {
        let to = |q: &Queued<Dispatch>| route(q.home.as_deref());
        let (to, items, oversized) =
            take_fitting(&mut self.dispatches, (self.max_batch, max_bytes), |_| true, to, only);
        self.counts.oversized += oversized;
        if items.is_empty() {
            return None;
        }
        let body = DispatchBatch { dispatches: items.iter().map(|q| q.item.clone()).collect() };
        Some((Batch::Dispatches { to, items }, body))
    }

    /// The next report batch within `max_bytes`: reports whose dispatch was delivered, or
    /// goes ahead of them in the same call (sequence numbers through `riding`, 0: none).
    /// `only`: when its replica is this one.
    pub fn take_reports(
        &mut self,
        max_bytes: usize,
        riding: u64,
        route: Route,
        only: Option<&str>,
    ) -> Option<(Batch, ReportBatch)> {
        let done = self.done_through.max(riding);
        let delivered = &self.delivered;
        // Where its dispatch was delivered; else (no dispatch, or one riding in this same
        // call to the current replica) its own home, or the current replica.
        let to = |q: &Queued<Owed>| match delivered.get(&q.seq) {
            Some(at) => route(Some(at)),
            None => route(q.home.as_deref()),
        };
        let limits = (self.max_batch, max_bytes);
        let (to, items, oversized) = take_fitting(&mut self.reports, limits, |seq| seq <= done, to, only);
        self.counts.oversized += oversized;
        if items.is_empty() {
            return None;
        }
        let mut body = ReportBatch::default();
        for q in &items {
            match &q.item {
                Owed::FirstToken(f) => body.first_tokens.push(f.clone()),
                Owed::Abandoned(a) => body.abandoned.push(a.clone()),
                Owed::Report(o) => body.reports.push((**o).clone()),
            }
        }
        Some((Batch::Reports { to, items }, body))
    }

    /// Applies how a batch's call ended.
    pub fn sent(&mut self, batch: Batch, outcome: Outcome) {
        match (outcome, batch) {
            (Outcome::Delivered, Batch::Dispatches { to, items }) => {
                let to: Rc<str> = to.into();
                for q in &items {
                    self.delivered.insert(q.seq, to.clone());
                }
                while self.delivered.len() > self.max_delivered {
                    self.delivered.pop_first();
                }
                self.dispatched_through(&items);
            }
            (Outcome::Delivered, Batch::Reports { items, .. }) => {
                self.counts.reported += self.ended(&items);
            }
            (Outcome::Refused, Batch::Dispatches { items, .. }) => {
                self.counts.refused += items.len() as u64;
                self.dispatched_through(&items);
            }
            (Outcome::Refused, Batch::Reports { items, .. }) => {
                self.ended(&items);
                self.counts.refused += items.len() as u64;
            }
            (Outcome::Failed, Batch::Dispatches { items, .. }) => {
                self.counts.failed += 1;
                self.dispatches.requeue(items);
            }
            (Outcome::Failed, Batch::Reports { items, .. }) => {
                self.counts.failed += 1;
                self.reports.requeue(items);
            }
        }
    }

    /// The reports among `items` are done with: their dispatches' replicas are
    /// forgotten. Returns how many there were.
    fn ended(&mut self, items: &[Queued<Owed>]) -> u64 {
        let mut n = 0;
        for q in items.iter().filter(|q| matches!(q.item, Owed::Report(_))) {
            self.delivered.remove(&q.seq);
            n += 1;
        }
        n
    }

    fn dispatched_through(&mut self, items: &[Queued<Dispatch>]) {
        self.done_through = self.done_through.max(last_seq(items));
    }

    /// Counts since the last call, queue overflow included.
    pub fn take_counts(&mut self) -> Counts {
        let mut c = std::mem::take(&mut self.counts);
        c.dropped = self.dispatches.take_dropped() + self.reports.take_dropped();
        c
    }
}

/// The highest sequence number among `items` (0: none).
fn last_seq<T>(items: &[Queued<T>]) -> u64 {
    items.iter().map(|q| q.seq).max().unwrap_or(0)
}

fn encoded<T: Serialize>(body: &T) -> Option<Vec<u8>> {
    codec::encode(Format::MsgPack, body).ok()
}

/// Takes items from the front of `queue` while they are `eligible` (by sequence number)
/// and go to the replica the first one goes to (`to`; when `only` is given, that one
/// alone), up to `max` items and `max_bytes` encoded. An item that alone does not fit (or
/// cannot be encoded) is dropped. Returns the replica, the batch and how many were dropped.
fn take_fitting<T: Serialize>(
    queue: &mut BoundedQueue<Queued<T>>,
    (max, max_bytes): (usize, usize),
    eligible: impl Fn(u64) -> bool,
    to: impl Fn(&Queued<T>) -> String,
    only: Option<&str>,
) -> (String, Vec<Queued<T>>, u64) {
    let budget = max_bytes.saturating_sub(FRAMING_BYTES);
    let (mut batch, mut used, mut oversized) = (Vec::new(), 0usize, 0u64);
    let mut destination: Option<String> = None;
    while batch.len() < max {
        let Some(front) = queue.front() else { break };
        if !eligible(front.seq) {
            break;
        }
        let goes_to = to(front);
        if only.is_some_and(|c| c != goes_to) || destination.as_ref().is_some_and(|d| *d != goes_to) {
            break;
        }
        let size = codec::encode(Format::MsgPack, &front.item).map(|b| b.len()).unwrap_or(usize::MAX);
        if size > budget {
            queue.take(1);
            oversized += 1;
            continue;
        }
        if used + size > budget {
            break;
        }
        used += size;
        destination = Some(goes_to);
        batch.extend(queue.take(1));
    }
    (destination.unwrap_or_default(), batch, oversized)
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
        }
    }

    fn report(id: &str) -> Report {
        Report {
            pool: "p".into(),
            request_id: id.into(),
            endpoint: "e:1".into(),
            source: RouteSource::Fallback,
            ttft_ms: None,
            tpot_ms: None,
            e2e_ms: 1.0,
            output_tokens: None,
            cached_tokens: None,
            status: 200,
            failed_at: None,
        }
    }

    /// Every replica up: an item goes to its home, or to the current one, `p0`.
    fn up(home: Option<&str>) -> String {
        home.unwrap_or("p0").to_string()
    }

    /// Replica `down` skipped, `current` the current one: items go to their home unless it
    /// is `down` (or they have none), as `Shards::route` sends them.
    fn failed_over(down: &'static str, current: &'static str) -> impl Fn(Option<&str>) -> String {
        move |home| home.filter(|h| *h != down).unwrap_or(current).to_string()
    }

    fn ids(batch: &Batch) -> Vec<String> {
        match batch {
            Batch::Dispatches { items, .. } => items.iter().map(|q| q.item.request_id.clone()).collect(),
            Batch::Reports { items, .. } => items
                .iter()
                .map(|q| match &q.item {
                    Owed::FirstToken(f) => format!("first:{}", f.request_id),
                    Owed::Report(o) => o.request_id.clone(),
                    Owed::Abandoned(a) => format!("abandoned:{}", a.request_id),
                })
                .collect(),
        }
    }

    #[test]
    fn a_first_token_goes_with_the_reports_after_its_dispatch_and_before_its_report() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        let seq = out.dispatch(dispatch("a", 0), "p0");
        let first = FirstToken { pool: "p".into(), request_id: "a".into(), endpoint: "e:1".into(), ttft_ms: 12.0 };
        out.first_token(seq, first.clone());
        out.report(seq, report("a"));
        assert!(out.next_reports(&up).is_none(), "the dispatch is not delivered yet");
        let (batch, _) = out.next_dispatches(&up).unwrap();
        out.sent(batch, Outcome::Delivered);
        let (batch, body) = out.next_reports(&up).unwrap();
        assert_eq!(ids(&batch), ["first:a", "a"]);
        let sent: ReportBatch = codec::decode(Format::MsgPack, &body).unwrap();
        assert_eq!((sent.first_tokens, sent.reports.len()), (vec![first], 1));
        out.sent(batch, Outcome::Delivered);
        assert_eq!(out.take_counts().reported, 1, "reports are what count as reported");
    }

    #[test]
    fn a_report_waits_for_its_dispatch_to_be_delivered() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        let seq = out.dispatch(dispatch("a", 0), "p0");
        out.report(0, report("envoy-routed")); // no dispatch: free to go
        out.report(seq, report("a"));
        let (dispatches, _) = out.next_dispatches(&up).unwrap();
        // The dispatch is on its way but not delivered: the report must not overtake it
        // (reports keep their order, so what queued behind it waits too, for a tick at most).
        let (reports, _) = out.next_reports(&up).unwrap();
        assert_eq!(ids(&reports), ["envoy-routed"]);
        out.sent(reports, Outcome::Delivered);
        assert!(out.next_reports(&up).is_none());
        out.sent(dispatches, Outcome::Delivered);
        let (reports, body) = out.next_reports(&up).unwrap();
        assert_eq!(ids(&reports), ["a"]);
        let decoded: ReportBatch = codec::decode(Format::MsgPack, &body).unwrap();
        assert_eq!(decoded.reports[0].request_id, "a");
    }

    #[test]
    fn failed_batches_requeue_and_refused_ones_are_dropped_and_counted() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        let seq = out.dispatch(dispatch("a", 0), "p0");
        let (batch, _) = out.next_dispatches(&up).unwrap();
        out.sent(batch, Outcome::Failed);
        out.report(seq, report("a"));
        assert!(out.next_reports(&up).is_none(), "still not delivered");
        let (batch, _) = out.next_dispatches(&up).unwrap();
        assert_eq!(ids(&batch), ["a"], "requeued at the front");
        out.sent(batch, Outcome::Refused);
        assert!(out.next_dispatches(&up).is_none(), "the refused batch is not queued again");
        let (reports, _) = out.next_reports(&up).unwrap();
        out.sent(reports, Outcome::Failed);
        let (reports, _) = out.next_reports(&up).unwrap();
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
            out.dispatch(dispatch(&format!("r{i}"), 20), "p0"); // about 230 bytes each
        }
        out.dispatch(dispatch("huge", 1000), "p0"); // about 9 KB: can never fit
        out.dispatch(dispatch("after", 0), "p0");
        let mut seen = Vec::new();
        while let Some((batch, body)) = out.next_dispatches(&up) {
            assert!(body.len() <= limit, "{} bytes", body.len());
            seen.extend(ids(&batch));
            out.sent(batch, Outcome::Delivered);
        }
        assert_eq!(seen.len(), 41, "every other item sent");
        assert!(!seen.contains(&"huge".to_string()) && seen.contains(&"after".to_string()));
        assert_eq!(out.take_counts().oversized, 1);
    }

    #[test]
    fn a_report_goes_to_the_replica_its_dispatch_was_delivered_to() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        let a = out.dispatch(dispatch("a", 0), "p0");
        let b = out.dispatch(dispatch("b", 0), "p1");
        // One batch per replica, in queue order.
        let (batch, _) = out.next_dispatches(&up).unwrap();
        assert_eq!((batch.to(), ids(&batch)), ("p0", vec!["a".to_string()]));
        out.sent(batch, Outcome::Delivered);
        let (batch, _) = out.next_dispatches(&up).unwrap();
        assert_eq!((batch.to(), ids(&batch)), ("p1", vec!["b".to_string()]));
        out.sent(batch, Outcome::Delivered);
        out.report(b, report("b"));
        out.report(a, report("a"));
        let (batch, _) = out.next_reports(&up).unwrap();
        assert_eq!((batch.to(), ids(&batch)), ("p1", vec!["b".to_string()]));
        out.sent(batch, Outcome::Delivered);
        let (batch, _) = out.next_reports(&up).unwrap();
        assert_eq!((batch.to(), ids(&batch)), ("p0", vec!["a".to_string()]));
        out.sent(batch, Outcome::Delivered);
        assert!(out.delivered.is_empty(), "forgotten once the report is delivered");
    }

    /// Failover and failback: placed on p0 while it was down, a request's dispatch went to
    /// p1; p0 is back by the time it ends, and its report still goes to p1, which holds it
    /// in its books. Word of a request that left p0's queue goes to p0.
    #[test]
    fn after_a_failback_reports_follow_their_dispatch_not_the_current_replica() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        let p0_down = failed_over("p0", "p1");
        let seq = out.dispatch(dispatch("a", 0), "p0");
        let (batch, _) = out.next_dispatches(&p0_down).unwrap();
        assert_eq!(batch.to(), "p1", "its home is down: the current replica takes it");
        out.sent(batch, Outcome::Delivered);
        let first = FirstToken { pool: "p".into(), request_id: "a".into(), endpoint: "e:1".into(), ttft_ms: 1.0 };
        out.first_token(seq, first);
        out.report(seq, report("a"));
        out.abandoned(Abandoned { pool: "p".into(), request_id: "left".into() }, "p0");
        let (batch, _) = out.next_reports(&up).unwrap();
        assert_eq!((batch.to(), ids(&batch)), ("p1", vec!["first:a".to_string(), "a".to_string()]));
        out.sent(batch, Outcome::Delivered);
        let (batch, _) = out.next_reports(&up).unwrap();
        assert_eq!((batch.to(), ids(&batch)), ("p0", vec!["abandoned:left".to_string()]));
        // Were p1 to fail in turn, its reports would go to the current replica, not wait.
        let seq = out.dispatch(dispatch("b", 0), "p1");
        let (batch, _) = out.next_dispatches(&up).unwrap();
        out.sent(batch, Outcome::Delivered);
        out.report(seq, report("b"));
        let p1_down = failed_over("p1", "p0");
        let (batch, _) = out.next_reports(&p1_down).unwrap();
        assert_eq!((batch.to(), ids(&batch)), ("p0", vec!["b".to_string()]));
    }

    #[test]
    fn only_what_goes_to_the_replica_called_rides_on_its_call() {
        let mut out = Outbox::new(100, 10, 1 << 20);
        out.dispatch(dispatch("a", 0), "p1");
        assert!(out.take_dispatches(1 << 20, &up, Some("p0")).is_none(), "bound for p1");
        let (batch, _) = out.take_dispatches(1 << 20, &up, Some("p1")).unwrap();
        assert_eq!(ids(&batch), ["a"]);
    }

    #[test]
    fn the_replicas_of_delivered_dispatches_are_bounded() {
        let mut out = Outbox::new(2, 10, 1 << 20);
        for i in 0..20 {
            out.dispatch(dispatch(&format!("r{i}"), 0), "p0");
            let (batch, _) = out.next_dispatches(&up).unwrap();
            out.sent(batch, Outcome::Delivered);
        }
        assert_eq!(out.delivered.len(), 2 * DELIVERED_PER_QUEUED);
        assert_eq!(out.delivered.keys().next(), Some(&13), "the oldest forgotten");
    }
}
