//! Which observations training keeps: a stratified reservoir and a held-out split.
//!
//! Samples are bucketed by queue (waiting 0 / 1-2 / 3-5 / 6-10 / 11+) x KV
//! usage (5% steps) x prefix match (quartiles); each bucket keeps its newest
//! `bucket_cap` samples, so rare regimes (a burst, a full cache) are not
//! forgotten under a flood of common ones, and old regimes age out bucket by
//! bucket. A fixed share of requests, chosen by a hash of the request id, goes
//! to a held-out reservoir of the same shape, used only to validate models. The
//! hash is keyed with a secret drawn at start-up, so no caller can pick which of
//! its requests land in the holdout that gates model activation.
//!
//! Beside the reservoirs, the newest [`RECENT_TRAIN`] / [`RECENT_HOLDOUT`] samples
//! of each side are kept in arrival order: after a workload shift (drift) training
//! weights them and judges candidates on them, so a finished regime is forgotten
//! fast while the reservoirs keep rare ones otherwise.

use std::collections::{BTreeMap, VecDeque};

use headroom_protocol::{EndpointState, Observation, RouteSource};
use serde::{Deserialize, Serialize};

use super::features::Row;

/// One training example: features at dispatch, and what was observed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub row: Row,
    /// Observed TTFT (streaming requests only).
    pub ttft_ms: Option<f64>,
    /// Observed TPOT (streaming requests with at least two tokens).
    pub tpot_ms: Option<f64>,
}

/// What a report can teach, if anything: the state its features came from and the
/// TTFT and TPOT it measured. Only a 200 whose features came from a predict call
/// (fallback-routed requests carry stale state), with TTFT and TPOT from streaming
/// requests only (a non-streaming response's first token arrives with the whole body).
pub fn learnable(o: &Observation) -> Option<(&EndpointState, Option<f64>, Option<f64>)> {
    let from_predict = matches!(
        o.report.source,
        RouteSource::PredictedPositive | RouteSource::PredictedNegative | RouteSource::Composite
    );
    let state = o.state_at_dispatch.as_ref().filter(|_| from_predict && o.report.status == 200)?;
    let ok = |v: Option<f64>| v.filter(|x| x.is_finite() && *x > 0.0);
    let (ttft, tpot) = if o.request.streaming { (ok(o.report.ttft_ms), ok(o.report.tpot_ms)) } else { (None, None) };
    (ttft.is_some() || tpot.is_some()).then_some((state, ttft, tpot))
}

type Bucket = (u8, u8, u8);

fn bucket_of(row: &Row) -> Bucket {
    let waiting = row[2];
    let queue = match waiting {
        w if w < 0.5 => 0,
        w if w <= 2.0 => 1,
        w if w <= 5.0 => 2,
        w if w <= 10.0 => 3,
        _ => 4,
    };
    let kv = (row[0].clamp(0.0, 1.0) * 20.0).min(19.0) as u8;
    let prefix = (row[4].clamp(0.0, 1.0) * 4.0).min(3.0) as u8;
    (queue, kv, prefix)
}

/// Samples by bucket, newest last in each.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reservoir {
    buckets: BTreeMap<String, VecDeque<Sample>>,
    cap: usize,
}

impl Reservoir {
    pub fn new(cap: usize) -> Self {
        Reservoir { buckets: BTreeMap::new(), cap: cap.max(1) }
    }

    pub fn push(&mut self, s: Sample) {
        let (q, k, p) = bucket_of(&s.row);
        let bucket = self.buckets.entry(format!("{q}/{k}/{p}")).or_default();
        if bucket.len() == self.cap {
            bucket.pop_front();
        }
        bucket.push_back(s);
    }

    pub fn len(&self) -> usize {
        self.buckets.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.buckets.values().flatten()
    }
}

/// Newest training-side samples kept in arrival order.
pub const RECENT_TRAIN: usize = 1000;
/// Newest held-out samples kept in arrival order.
pub const RECENT_HOLDOUT: usize = 250;

/// What a drift round learns from and is judged on ([`Samples::recent_stretch`]).
#[derive(Debug, Clone, Default)]
pub struct Stretch {
    /// Training-side samples of the stretch.
    pub train: Vec<Sample>,
    /// Held-out samples of the same stretch: what the held-out reservoir keeps after it.
    pub holdout: Vec<Sample>,
    /// The held-out samples of the new regime alone (filed from `from` on), which
    /// judge the candidate. Where the stretch reaches back, its older samples belong to
    /// the regime drift says is over, on which the active model is right by
    /// construction: judged on them, a model that learnt the new regime loses to one
    /// that has not.
    pub judge: Vec<Sample>,
}

/// The samples of an arrival-ordered queue filed from sequence number `from` on.
fn filed_since(q: &VecDeque<(u64, Sample)>, from: u64) -> Vec<Sample> {
    q.iter().filter(|(n, _)| *n >= from).map(|(_, s)| s.clone()).collect()
}

/// The training and held-out reservoirs, and how many samples arrived since the last training.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Samples {
    pub train: Reservoir,
    pub holdout: Reservoir,
    /// Held-out share, in percent of request ids.
    pub holdout_percent: u64,
    pub new_since_training: usize,
    /// Samples filed so far (both sides): the sequence number of the next one.
    #[serde(default)]
    pub filed: u64,
    /// The newest training-side samples with their sequence numbers, oldest first.
    #[serde(default)]
    recent_train: VecDeque<(u64, Sample)>,
    /// The newest held-out samples with their sequence numbers, oldest first.
    #[serde(default)]
    recent_holdout: VecDeque<(u64, Sample)>,
    /// Key of the holdout hash; never serialised, drawn anew each start.
    #[serde(skip, default = "random_key")]
    key: u64,
}

/// A random 64-bit key (std's per-process random SipHash keys; no extra dependency).
fn random_key() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
}

impl Samples {
    pub fn new(bucket_cap: usize, holdout_percent: u64) -> Self {
        Self::keyed(bucket_cap, holdout_percent, random_key())
    }

    /// [`Self::new`] with the holdout hash's key given: the same split every time
    /// (`train-check` replays a run the same way for every variant it compares).
    pub fn keyed(bucket_cap: usize, holdout_percent: u64, key: u64) -> Self {
        Samples {
            train: Reservoir::new(bucket_cap),
            holdout: Reservoir::new(bucket_cap.div_ceil(4).max(1)),
            holdout_percent,
            new_since_training: 0,
            filed: 0,
            recent_train: VecDeque::new(),
            recent_holdout: VecDeque::new(),
            key,
        }
    }

    /// Restored samples filed again under the current caps and share: what a file
    /// says about caps is not trusted, and a sample with a non-finite feature or a
    /// latency out of range is dropped. Each sample stays on its side.
    pub fn rehome(restored: Samples, bucket_cap: usize, holdout_percent: u64) -> Samples {
        let mut fresh = Samples::new(bucket_cap, holdout_percent);
        let usable = |s: &Sample| {
            let ok = |v: Option<f64>| v.is_none_or(|x| headroom_protocol::limits::is_ms(x) && x > 0.0);
            s.row.iter().all(|x| x.is_finite())
                && ok(s.ttft_ms)
                && ok(s.tpot_ms)
                && (s.ttft_ms.is_some() || s.tpot_ms.is_some())
        };
        restored.train.samples().filter(|s| usable(s)).for_each(|s| fresh.train.push(s.clone()));
        restored.holdout.samples().filter(|s| usable(s)).for_each(|s| fresh.holdout.push(s.clone()));
        let newest = |q: &VecDeque<(u64, Sample)>, cap: usize| -> VecDeque<(u64, Sample)> {
            let kept: Vec<&(u64, Sample)> = q.iter().filter(|(_, s)| usable(s)).collect();
            kept[kept.len().saturating_sub(cap)..].iter().map(|s| (*s).clone()).collect()
        };
        fresh.filed = restored.filed;
        fresh.recent_train = newest(&restored.recent_train, RECENT_TRAIN);
        fresh.recent_holdout = newest(&restored.recent_holdout, RECENT_HOLDOUT);
        fresh.new_since_training = restored.new_since_training.min(fresh.train.len());
        fresh
    }

    /// Files `sample` by its request id: the same id always lands on the same side.
    pub fn push(&mut self, request_id: &str, sample: Sample) {
        let seq = self.filed;
        self.filed += 1;
        let keep = |q: &mut VecDeque<(u64, Sample)>, cap: usize, s: &Sample| {
            if q.len() == cap {
                q.pop_front();
            }
            q.push_back((seq, s.clone()));
        };
        if self.side(request_id) < self.holdout_percent {
            keep(&mut self.recent_holdout, RECENT_HOLDOUT, &sample);
            self.holdout.push(sample);
        } else {
            keep(&mut self.recent_train, RECENT_TRAIN, &sample);
            self.train.push(sample);
            self.new_since_training += 1;
        }
    }

    /// A training round used the `taken` new samples counted when it copied the
    /// reservoirs; those that arrived while it fitted still count as new.
    pub fn trained_on(&mut self, taken: usize) {
        self.new_since_training = self.new_since_training.saturating_sub(taken);
    }

    /// What a drift round learns from: the samples filed from sequence number `from`
    /// on (where the active model's data was taken), reaching further back among the
    /// newest kept when that stretch holds fewer than `min` training samples of either
    /// target. A round can then fit as soon as drift is seen, on the newest traffic,
    /// instead of waiting for `min` samples of the new regime, during which the normal
    /// cadence is stalled too (and for good, if the traffic stops).
    pub fn recent_stretch(&self, from: u64, min: usize) -> Stretch {
        let (mut ttft, mut tpot) = (0, 0);
        let mut start = from;
        for (n, s) in self.recent_train.iter().rev() {
            if ttft >= min && tpot >= min {
                break;
            }
            ttft += usize::from(s.ttft_ms.is_some());
            tpot += usize::from(s.tpot_ms.is_some());
            start = start.min(*n);
        }
        Stretch {
            train: filed_since(&self.recent_train, start),
            holdout: filed_since(&self.recent_holdout, start),
            judge: filed_since(&self.recent_holdout, from),
        }
    }

    /// The feature rows of the newest `n` held-out samples: today's traffic, which
    /// neither a candidate nor the active model trained on.
    pub fn newest_held_out_rows(&self, n: usize) -> Vec<Row> {
        self.recent_holdout.iter().rev().take(n).map(|(_, s)| s.row).collect()
    }

    /// Forgets the reservoirs for these samples (a finished regime): both sides refilled
    /// from them under the current caps, then the samples filed from sequence number
    /// `since` on (those that arrived while the round fitted, after `train` and
    /// `holdout` were copied): they belong to the new regime and are not lost.
    pub fn refill(&mut self, train: Vec<Sample>, holdout: Vec<Sample>, since: u64) {
        self.train = Reservoir::new(self.train.cap);
        self.holdout = Reservoir::new(self.holdout.cap);
        let (late_train, late_holdout) =
            (filed_since(&self.recent_train, since), filed_since(&self.recent_holdout, since));
        train.into_iter().chain(late_train).for_each(|s| self.train.push(s));
        holdout.into_iter().chain(late_holdout).for_each(|s| self.holdout.push(s));
    }

    /// 0..100: below `holdout_percent` is the holdout. Keyed SipHash of the id.
    fn side(&self, request_id: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.key.hash(&mut h);
        request_id.hash(&mut h);
        h.finish() % 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(waiting: f32, kv: f32, prefix: f32) -> Sample {
        let mut row = [0f32; super::super::features::COUNT];
        row[0] = kv;
        row[2] = waiting;
        row[4] = prefix;
        Sample { row, ttft_ms: Some(1.0), tpot_ms: None }
    }

    #[test]
    fn buckets_cap_and_keep_rare_regimes() {
        let mut r = Reservoir::new(10);
        for _ in 0..1000 {
            r.push(sample(0.0, 0.1, 0.0)); // the common regime
        }
        r.push(sample(20.0, 0.95, 1.0)); // one rare sample
        assert_eq!(r.len(), 11, "the common bucket is capped, the rare one kept");
        assert!(r.samples().any(|s| s.row[2] == 20.0));
    }

    #[test]
    fn samples_arriving_during_training_still_count_as_new() {
        let mut s = Samples::new(1000, 0);
        (0..60).for_each(|i| s.push(&format!("a{i}"), sample(0.0, 0.1, 0.0)));
        let taken = s.new_since_training; // a round copies the reservoirs here
        (0..7).for_each(|i| s.push(&format!("b{i}"), sample(0.0, 0.1, 0.0))); // and fits while these arrive
        s.trained_on(taken);
        assert_eq!(s.new_since_training, 7);
    }

    #[test]
    fn a_refill_keeps_the_samples_that_arrived_while_the_round_fitted() {
        let mut s = Samples::new(1000, 20);
        (0..300).for_each(|i| s.push(&format!("a{i}"), sample(0.0, 0.1, 0.0)));
        let copied_at = s.filed; // a drift round copies its stretch here
        let stretch = s.recent_stretch(250, 40);
        let copied = stretch.train.len() + stretch.holdout.len();
        (0..25).for_each(|i| s.push(&format!("b{i}"), sample(0.0, 0.1, 0.0))); // and fits while these arrive
        s.refill(stretch.train, stretch.holdout, copied_at);
        assert_eq!(s.train.len() + s.holdout.len(), copied + 25, "the stretch and every sample filed since");
    }

    #[test]
    fn a_recent_stretch_reaches_back_to_hold_enough_samples_of_each_target() {
        let mut s = Samples::new(1000, 0);
        for i in 0..100 {
            let mut x = sample(0.0, 0.1, 0.0);
            x.tpot_ms = (i % 2 == 0).then_some(1.0); // every other sample has a TPOT
            s.push(&format!("r{i}"), x);
        }
        // Enough since `from`: exactly the stretch.
        assert_eq!(s.recent_stretch(60, 10).train.len(), 40);
        // Too few since `from` (5): back to the newest 20 with a TPOT, 40 samples in all.
        assert_eq!(s.recent_stretch(95, 20).train.len(), 40);
        // More asked for than kept: every recent sample.
        assert_eq!(s.recent_stretch(99, 1000).train.len(), 100);
    }

    #[test]
    fn a_stretch_that_reaches_back_is_judged_on_the_new_regime_alone() {
        let mut s = Samples::new(1000, 50);
        (0..200).for_each(|i| s.push(&format!("r{i}"), sample(0.0, 0.1, 0.0)));
        let stretch = s.recent_stretch(190, 40);
        let held_out_since = |from: usize| (from..200).filter(|i| s.side(&format!("r{i}")) < 50).count();
        assert!(stretch.train.len() >= 40, "reached back for the training side");
        let from_stretch_start = 200 - (stretch.train.len() + stretch.holdout.len());
        assert_eq!(stretch.holdout.len(), held_out_since(from_stretch_start), "the held-out side of the stretch");
        assert_eq!(stretch.judge.len(), held_out_since(190), "judged on what came since `from` only");
        assert!(stretch.judge.len() < stretch.holdout.len());
    }

    #[test]
    fn holdout_split_is_stable_and_about_its_share() {
        let mut s = Samples::new(100_000, 10);
        for i in 0..10_000 {
            s.push(&format!("req-{i}"), sample((i % 13) as f32, (i % 17) as f32 / 17.0, 0.0));
        }
        let held = s.holdout.len() as f64 / 10_000.0;
        assert!((held - 0.1).abs() < 0.02, "held-out share {held}");
        assert_eq!(s.new_since_training, s.train.len());
        assert_eq!(s.side("req-42"), s.side("req-42"));
    }

    #[test]
    fn holdout_side_depends_on_a_secret_key() {
        // The same ids split differently under two keys: a caller cannot precompute the side.
        let (a, b) = (Samples::new(10, 10), Samples::new(10, 10));
        let differ = (0..200).filter(|i| (a.side(&format!("r{i}")) < 10) != (b.side(&format!("r{i}")) < 10)).count();
        assert!(differ > 5, "only {differ} of 200 ids changed side");
    }

    #[test]
    fn rehoming_applies_current_caps_and_drops_unusable_samples() {
        let mut old = Samples::new(1000, 10);
        old.train = Reservoir { buckets: BTreeMap::new(), cap: 0 }; // a file claiming an unbounded cap
        for _ in 0..50 {
            old.train.buckets.entry("0/2/0".into()).or_default().push_back(sample(0.0, 0.1, 0.0));
        }
        let mut nan = sample(0.0, 0.1, 0.0);
        nan.row[1] = f32::NAN;
        old.train.buckets.entry("x".into()).or_default().push_back(nan);
        let mut huge = sample(0.0, 0.1, 0.0);
        huge.ttft_ms = Some(1e300);
        old.holdout.push(huge);
        old.new_since_training = 1_000_000;
        let fresh = Samples::rehome(old, 10, 10);
        assert_eq!((fresh.train.len(), fresh.holdout.len()), (10, 0));
        assert_eq!(fresh.new_since_training, 10);
    }
}
