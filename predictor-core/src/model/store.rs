//! The model store: the one object the service asks for predictions, hands
//! finished requests to, and asks to train. It composes the registry (which model
//! serves), the samples, training rounds and the data directory.
//!
//! Before any model exists the analytic prior predicts (`super::prior`): an
//! honest formula over the same features, so routing has sane numbers from the
//! first request. Training runs off the request path (`spawn_blocking`); a new
//! model replaces the active one only if its held-out error is not worse than
//! the active one's by more than `keep_margin`. Samples are persisted after every
//! round and at shutdown, so a crash loses at most one round's samples.
//!
//! Between rounds, served predictions are corrected from what reports show
//! (`calibration`), and the served error is watched for drift: past
//! `drift_factor` times the active model's held-out error, beyond what chance
//! moves either (`drifted`), the next round starts
//! at once, weights the newest samples and is judged on the newest held-out ones.
//!
//! While a trained model serves, the prior stays a contender (`duel`): corrected by a
//! correction of its own, it is scored on every report beside what was served, and
//! serves a target for a while when the traffic says it is the better of the two.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headroom_protocol::{limits, EndpointState, Observation, RequestFeatures};
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

use super::calibration::{self, Calibration, CalibrationView};
use super::duel::{Duel, DuelView};
use super::features::{self, Row};
use super::gbdt::Objective;
use super::persistence::{self, sha256_hex, DataDir};
use super::prior::AnalyticPrior;
use super::registry::{ActiveModel, Registry};
use super::runtime::{self, LatencyModel, Runtime};
use super::sampler::{self, Sample, Samples};
use super::training::{self, ErrorSpread, Scores};
use crate::clock::{Clock, WallClock};
use crate::config::ModelConfig;

pub use super::prior::ANALYTIC_PRIOR as PRIOR;
pub use super::registry::ModelInfo;
pub use super::training::TrainOutcome;

/// Newest held-out rows on which a new model's level is compared with the old one's.
const NEWEST_FOR_LEVEL: usize = 200;

/// Rows a training round runs at once through the serving session, when it has no session
/// of its own (`ModelStore::active_raw_for_round`).
const SCORE_CHUNK: usize = 256;

/// Observations the drift check looks at.
pub const DRIFT_WINDOW: usize = 100;
/// Observations of a target needed before it can be judged drifting.
const DRIFT_MIN: usize = 50;
/// Standard errors by which the live error must clear `drift_factor` times the held-out
/// one: both are means of a few dozen errors, and chance alone rarely moves them that far.
const DRIFT_Z: f64 = 3.0;

/// Absolute percentage errors of the active model's own predictions on the newest
/// observations, per target.
#[derive(Debug, Default)]
struct LiveErrors {
    recent: [VecDeque<f64>; 2],
}

impl LiveErrors {
    fn push(&mut self, k: usize, ape: f64) {
        let q = &mut self.recent[k];
        if q.len() == DRIFT_WINDOW {
            q.pop_front();
        }
        q.push_back(ape);
    }

    /// Forgets the errors: they were another model's.
    fn clear(&mut self) {
        self.recent.iter_mut().for_each(VecDeque::clear);
    }

    /// Per target, once [`DRIFT_MIN`] are in: the mean error, and the errors as drift
    /// judges them.
    fn judged(&mut self) -> [Option<(f64, ErrorSpread)>; 2] {
        [0, 1].map(|k| {
            let q = self.recent[k].make_contiguous();
            if q.len() < DRIFT_MIN {
                return None;
            }
            Some((q.iter().sum::<f64>() / q.len() as f64, ErrorSpread::of(q)?))
        })
    }
}

/// Whether the live errors say the model's regime is over: past `factor` times the
/// held-out errors, by more than [`DRIFT_Z`] standard errors of the difference.
fn drifted(live: ErrorSpread, holdout: ErrorSpread, factor: f64) -> bool {
    let bound = factor * holdout.capped_mape.max(0.01);
    let spread = live.standard_error.hypot(factor * holdout.standard_error);
    live.capped_mape > bound + DRIFT_Z * spread
}

/// Whether the served error has drifted from the active model's held-out error.
#[derive(Debug, Clone, Serialize)]
pub struct DriftView {
    pub drifting: bool,
    pub factor: f64,
    /// The active model's error over the last [`DRIFT_WINDOW`] observations (TTFT, TPOT).
    pub live_mape_ttft: Option<f64>,
    pub live_mape_tpot: Option<f64>,
}

/// What one training round works from, copied from the samples under one lock.
struct Round {
    train: Vec<Sample>,
    /// Scores the candidate against the active model.
    judge: Vec<Sample>,
    /// On drift: the held-out samples the reservoirs keep after it.
    refill: Option<Vec<Sample>>,
    /// The newest held-out rows, on which a new model's level is compared with the old one's.
    newest: Vec<Row>,
    /// New samples counted when copied (`Samples::trained_on`).
    taken: usize,
    /// `Samples::filed` when copied: where the new model's data ends.
    filed: u64,
}

/// Lets a warning through at most once a minute.
#[derive(Debug, Default)]
struct LogLimit(Mutex<Option<Instant>>);

impl LogLimit {
    /// Whether a warning may be logged at `now` (and, if so, counts it as logged).
    fn due(&self, now: Instant) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(60));
        if due {
            *last = Some(now);
        }
        due
    }
}

pub struct ModelStore {
    config: ModelConfig,
    prior: AnalyticPrior,
    registry: Registry,
    samples: Mutex<Samples>,
    /// The live correction of served predictions.
    calibration: Mutex<Calibration>,
    /// The prior's own live correction, learning from every report: what serves the prior
    /// when the contest hands it a target. Drift does not reset it: drift judges the
    /// trained models' regime, and the prior's correction follows the traffic as it goes.
    prior_calibration: Mutex<Calibration>,
    /// The trained model against the corrected prior, per target, on live reports.
    duel: Mutex<Duel>,
    /// The active model's live error, for drift.
    live: Mutex<LiveErrors>,
    /// Sequence number of the first sample filed after the active model's data was
    /// taken (`Samples::filed`): on drift, what came since is the new regime.
    active_from: AtomicU64,
    training: AtomicBool,
    /// `None`: nothing persists (no `data_dir`).
    data: Option<DataDir>,
    /// Failed writes to the data directory (`headroom_persist_failures`).
    pub persist_failures: Counter,
    /// Values a model predicted out of range, served by the prior instead
    /// (`headroom_model_values_substituted`).
    pub substituted: Counter,
    /// When the serving model's last failure was logged: at most once a minute, however many
    /// calls fail (each predict call would log otherwise). On the wall clock: it paces logs.
    warned: LogLimit,
    /// The time the live correction and the contest read (`crate::clock`).
    clock: Arc<dyn Clock>,
    /// What runs the models (ONNX Runtime in the service).
    runtime: Arc<dyn Runtime>,
}

impl ModelStore {
    /// Loads the user model or the persisted state into `runtime` (on the wall clock).
    pub fn open(config: ModelConfig, runtime: Arc<dyn Runtime>) -> anyhow::Result<ModelStore> {
        ModelStore::open_with_clock(config, runtime, Arc::new(WallClock))
    }

    /// [`ModelStore::open`] with the live correction and the contest on `clock`.
    pub fn open_with_clock(
        config: ModelConfig,
        runtime: Arc<dyn Runtime>,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<ModelStore> {
        let persist_failures = Counter::default();
        let tracked = match config.objective() {
            Objective::Quantile { q } => q,
            Objective::Mean => 0.5,
        };
        let store = ModelStore {
            samples: Mutex::new(Samples::new(config.bucket_cap, config.holdout_percent)),
            calibration: Mutex::new(Calibration::new(tracked, config.calibration_rate, clock.now())),
            prior_calibration: Mutex::new(Calibration::new(tracked, config.calibration_rate, clock.now())),
            duel: Mutex::new(Duel::new(config.objective(), clock.now())),
            live: Mutex::new(LiveErrors::default()),
            active_from: AtomicU64::new(0),
            prior: AnalyticPrior::default(),
            registry: Registry::new(config.keep_versions),
            training: AtomicBool::new(false),
            data: config.data_dir.clone().map(|d| DataDir::open(d, config.keep_versions, persist_failures.clone())),
            persist_failures,
            substituted: Counter::default(),
            warned: LogLimit::default(),
            clock,
            runtime,
            config,
        };
        if let Some(path) = store.config.model_path.clone() {
            let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("model_path {}: {e}", path.display()))?;
            let onnx = runtime::load(&*store.runtime, &bytes)
                .map_err(|e| anyhow::anyhow!("model_path {}: {e}", path.display()))?;
            let info = ModelInfo {
                version: 1,
                source: "user".into(),
                objective: store.config.objective(),
                created_unix_ms: training::now_ms(),
                train_samples_ttft: 0,
                train_samples_tpot: 0,
                holdout_samples: 0,
                holdout_mape_ttft: None,
                holdout_mape_tpot: None,
                holdout_coverage_ttft: None,
                holdout_coverage_tpot: None,
                holdout_drift: [None, None],
                train_ms: 0,
                sha256: Some(sha256_hex(&bytes)),
                trained_on_drift: false,
            };
            tracing::info!(path = %path.display(), "using the user-supplied model; online training is off");
            store.registry.install(onnx, info, bytes);
            return Ok(store);
        }
        store.restore();
        Ok(store)
    }

    /// Splits requests between training and holdout by `key` from now on, dropping the
    /// samples filed so far: a simulation keys it so the same traffic trains the same
    /// models (`headroom-bench sim`); the service draws a random key at each start, so no
    /// client can aim its request ids at one side.
    pub fn key_holdout(&self, key: u64) {
        let keyed = Samples::keyed(self.config.bucket_cap, self.config.holdout_percent, key);
        *self.samples.lock().unwrap_or_else(|p| p.into_inner()) = keyed;
    }

    /// Replaces the analytic prior (e.g. with `Config::prior`'s hardware scales).
    pub fn with_prior(mut self, prior: AnalyticPrior) -> Self {
        self.prior = prior;
        self
    }

    /// Restores models (when it trains) and samples from the data directory, if there is one.
    fn restore(&self) {
        let Some(data) = &self.data else { return };
        if let Some(restored) = data.restore_model(&*self.runtime).filter(|_| self.trains()) {
            for (info, bytes) in restored.older {
                self.registry.remember(info, bytes);
            }
            self.registry.install(restored.onnx, restored.info, restored.bytes);
        }
        if let Some(restored) = data.restore_samples() {
            let s = Samples::rehome(restored, self.config.bucket_cap, self.config.holdout_percent);
            tracing::info!(train = s.train.len(), holdout = s.holdout.len(), "restored samples");
            *self.samples.lock().unwrap_or_else(|p| p.into_inner()) = s;
        }
    }

    /// The active model's name (`analytic-prior` or `v<N>`).
    pub fn active_name(&self) -> String {
        match &*self.registry.active() {
            None => PRIOR.to_string(),
            Some(m) => m.info.name(),
        }
    }

    /// The feature row of `request` on an endpoint in `state`, with this store's prior
    /// in its prior columns: the one way rows are built, at predict and at train time.
    pub fn row(&self, request: &RequestFeatures, state: &EndpointState) -> Row {
        features::row(request, state, &self.prior)
    }

    /// (TTFT, TPOT) in ms for every row, in one batch, corrected by the live
    /// calibration, and the name of the model that made them (with `+prior:ttft` or
    /// `+prior:tpot` for a target the contest has handed to the prior on the hardware
    /// class of some of the rows).
    pub fn predict(&self, rows: &[Row]) -> (Vec<(f64, f64)>, String) {
        let (raw, name, substituted) = self.model_raw(rows);
        let now = self.clock.now();
        // The correction before the contest, the order `train` takes them in; the prior's
        // correction last, and only when a row is handed to the prior (`observe` takes it on
        // every report, and no other lock while it holds it).
        let calibration = self.calibration.lock().unwrap_or_else(|p| p.into_inner());
        // `PRIOR` here: no model, or it failed and the prior answered; nothing to hand over.
        let duel =
            (name != PRIOR && self.trained_model_serves()).then(|| self.duel.lock().unwrap_or_else(|p| p.into_inner()));
        let by_prior = |class: f32| duel.as_ref().map_or([false, false], |d| d.prior_serves_targets(class, now));
        let mut prior_calibration = None;
        let mut handed = [false, false];
        let served = rows
            .iter()
            .zip(raw)
            .zip(substituted)
            .map(|((r, p), substituted)| {
                let class = r[features::HARDWARE_CLASS];
                let model = calibration.apply(class, p);
                let by_contest = by_prior(class);
                let by_prior = [by_contest[0] || substituted[0], by_contest[1] || substituted[1]];
                if by_prior == [false, false] {
                    return model;
                }
                handed = [handed[0] || by_contest[0], handed[1] || by_contest[1]];
                let prior_calibration = prior_calibration
                    .get_or_insert_with(|| self.prior_calibration.lock().unwrap_or_else(|p| p.into_inner()));
                let prior = prior_calibration.apply(class, self.prior.predict(r));
                (if by_prior[0] { prior.0 } else { model.0 }, if by_prior[1] { prior.1 } else { model.1 })
            })
            .collect();
        if handed == [false, false] {
            return (served, name);
        }
        let targets: Vec<&str> = ["ttft", "tpot"].into_iter().zip(handed).filter(|(_, p)| *p).map(|(t, _)| t).collect();
        (served, format!("{name}+prior:{}", targets.join(",")))
    }

    /// Whether a model this store trained serves: what drift and the contest judge (not
    /// the prior before the first model, nor a user's model).
    fn trained_model_serves(&self) -> bool {
        self.trains() && self.registry.active().is_some()
    }

    /// Per target, whether the contest has handed it to the prior on hardware class
    /// `class` at `at`.
    fn prior_serves(&self, class: f32, at: Instant) -> [bool; 2] {
        if !self.trained_model_serves() {
            return [false, false];
        }
        self.duel.lock().unwrap_or_else(|p| p.into_inner()).prior_serves_targets(class, at)
    }

    /// A session of the active model's own for a training round, loaded from its bytes:
    /// the serving session is one lock, and a round's thousands of rows on it held every
    /// predict call behind them (7-10 ms each round, `predictor-bench`). `None` when no
    /// trained model serves (or its bytes are not kept).
    fn scoring_session(&self) -> Option<Box<dyn LatencyModel>> {
        let active = self.registry.active();
        let info = &active.as_ref().as_ref()?.info;
        runtime::load(&*self.runtime, &self.registry.onnx_bytes(&info.name())?).ok()
    }

    /// What the active model predicts for a training round's rows (its holdout, its newest
    /// rows), as it would serve them: on `scorer` when there is one (each value out of range
    /// the prior's, uncounted: nothing was served); else on the serving session,
    /// [`SCORE_CHUNK`] rows a run.
    fn active_raw_for_round(&self, scorer: Option<&dyn LatencyModel>, rows: &[Row]) -> Vec<(f64, f64)> {
        let own = scorer.and_then(|m| m.predict(rows).ok()).filter(|out| out.len() == rows.len());
        match own {
            Some(out) => out.into_iter().zip(rows).map(|(value, row)| self.in_range_or_prior(value, row).0).collect(),
            None => rows.chunks(SCORE_CHUNK).flat_map(|chunk| self.predict_raw(chunk).0).collect(),
        }
    }

    /// `value` with each of its two out of range replaced by the prior's for `row`, and which were.
    fn in_range_or_prior(&self, value: (f64, f64), row: &Row) -> ((f64, f64), [bool; 2]) {
        let bad = [!limits::is_ms(value.0), !limits::is_ms(value.1)];
        if !bad[0] && !bad[1] {
            return (value, bad);
        }
        let prior = self.prior.predict(row);
        ((if bad[0] { prior.0 } else { value.0 }, if bad[1] { prior.1 } else { value.1 }), bad)
    }

    /// The model's own predictions (the prior's when no model serves or it fails, and for
    /// each value out of range).
    fn predict_raw(&self, rows: &[Row]) -> (Vec<(f64, f64)>, String) {
        let (out, name, _) = self.model_raw(rows);
        (out, name)
    }

    /// [`Self::predict_raw`], and per row which of its two values the prior gave because the
    /// model's was out of range. One bad row (an input unlike any the model trained on) is
    /// its own: the rest of the call keeps the model. Each such value counts in
    /// `headroom_model_values_substituted`, and the warning is logged at most once a minute.
    fn model_raw(&self, rows: &[Row]) -> (Vec<(f64, f64)>, String, Vec<[bool; 2]>) {
        let none = || vec![[false, false]; rows.len()];
        if let Some(ActiveModel { onnx, info }) = &*self.registry.active() {
            match onnx.predict(rows) {
                Ok(mut out) if out.len() == rows.len() => {
                    let mut substituted = none();
                    let mut count = 0;
                    for ((value, row), bad) in out.iter_mut().zip(rows).zip(&mut substituted) {
                        (*value, *bad) = self.in_range_or_prior(*value, row);
                        count += u64::from(bad[0]) + u64::from(bad[1]);
                    }
                    if count > 0 {
                        self.substituted.inc_by(count);
                        if self.warned.due(Instant::now()) {
                            let version = info.name();
                            tracing::warn!(%version, count, "model predicted values out of range; the prior served those");
                        }
                    }
                    return (out, info.name(), substituted);
                }
                Ok(out) => {
                    if self.warned.due(Instant::now()) {
                        let (version, got) = (info.name(), out.len());
                        tracing::warn!(%version, got, rows = rows.len(), "model answered the wrong number of rows; using the prior");
                    }
                }
                Err(e) => {
                    if self.warned.due(Instant::now()) {
                        tracing::warn!(version = %info.name(), error = %e, "model failed; using the prior");
                    }
                }
            }
        }
        (rows.iter().map(|r| self.prior.predict(r)).collect(), PRIOR.to_string(), none())
    }

    /// Files a finished request as a training sample when it can teach something:
    /// a 200 whose features came from a predict call, with TTFT from streaming only.
    pub fn observe(&self, o: &Observation) -> bool {
        self.observe_at(o, self.clock.now())
    }

    /// [`Self::observe`] of a report that arrived at `now` (tests replay reports late).
    pub fn observe_at(&self, o: &Observation, now: Instant) -> bool {
        let Some((state, ttft, tpot)) = sampler::learnable(o) else {
            return false;
        };
        let ok = |v: Option<f64>| v.filter(|x| x.is_finite() && *x > 0.0);
        let row = self.row(&o.request, state);
        // Calibration judges what was served against the correction as it is now
        // (`calibration`); drift is judged on what the model itself says now (a bias the
        // correction hides is still a model gone stale).
        let served = [o.predicted_ttft_ms, o.predicted_tpot_ms].map(ok);
        let class = state.hardware_class;
        let dispatched = Duration::try_from_secs_f64(o.report.e2e_ms / 1000.0).ok().and_then(|d| now.checked_sub(d));
        let dispatched = dispatched.unwrap_or(now);
        // The prior's correction learns from every report, with what it would have served.
        let prior_served = {
            let mut prior_calibration = self.prior_calibration.lock().unwrap_or_else(|p| p.into_inner());
            let at_dispatch = prior_calibration.served_at(class, self.prior.predict(&row), o.report.e2e_ms, now);
            let prior_served = [at_dispatch.map(|p| p.0), at_dispatch.map(|p| p.1)];
            prior_calibration.observe(class, prior_served, o.report.e2e_ms, [ttft, tpot], now);
            prior_served
        };
        // The model's correction, from the targets it served; the contest, on those too.
        let by_prior = self.prior_serves(class as f32, dispatched);
        let model_served = [0, 1].map(|k| served[k].filter(|_| !by_prior[k]));
        self.calibration.lock().unwrap_or_else(|p| p.into_inner()).observe(
            class,
            model_served,
            o.report.e2e_ms,
            [ttft, tpot],
            now,
        );
        let trained_model_serves = self.trained_model_serves();
        if trained_model_serves {
            let mut duel = self.duel.lock().unwrap_or_else(|p| p.into_inner());
            for (k, target) in ["ttft", "tpot"].into_iter().enumerate() {
                let (Some(s), Some(p), Some(a)) = (model_served[k], prior_served[k], [ttft, tpot][k]) else { continue };
                if duel.observe(k, class as f32, dispatched, s, p, a, now) {
                    tracing::info!(target, class, model = %self.active_name(), "the corrected prior beat the model on live reports; it serves this target on this hardware class for a while");
                }
            }
        }
        // Only when drift can act: training on (no user model), a model serving, and on.
        if self.config.drift_factor > 0.0 && trained_model_serves {
            let (raw, _) = self.predict_raw(&[row]);
            if let Some(&(raw_ttft, raw_tpot)) = raw.first() {
                let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
                for (k, (p, a)) in [(raw_ttft, ttft), (raw_tpot, tpot)].into_iter().enumerate() {
                    if let Some(a) = a {
                        live.push(k, (p - a).abs() / a);
                    }
                }
            }
        }
        let sample = Sample { row, ttft_ms: ttft, tpot_ms: tpot };
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).push(&o.report.request_id, sample);
        true
    }

    /// Whether online training is on (off with a user model, or with `train = false`:
    /// the prior serves).
    pub fn trains(&self) -> bool {
        self.config.model_path.is_none() && self.config.train
    }

    /// One training round, if due. Blocking: run it off the request path.
    pub fn train_if_due(&self) -> TrainOutcome {
        if !self.trains() || self.training.swap(true, Ordering::SeqCst) {
            return TrainOutcome::Skipped;
        }
        let outcome = self.train();
        self.training.store(false, Ordering::SeqCst);
        outcome
    }

    fn train(&self) -> TrainOutcome {
        let drifting = self.drift().drifting;
        let Round { train, judge, refill, newest, taken, filed } = {
            let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            let (train, judge, refill) = if drifting {
                // Nothing arrived since the last round: the same data would give the same model.
                if s.new_since_training == 0 {
                    return TrainOutcome::Skipped;
                }
                // Forget the finished regime: train on what arrived since the active
                // model's data was taken (or the newest `min_samples`, if fewer did),
                // judge on the held-out samples of the new regime alone.
                let stretch = s.recent_stretch(self.active_from.load(Ordering::SeqCst), self.config.min_samples);
                (stretch.train, stretch.judge, Some(stretch.holdout))
            } else {
                if s.new_since_training < self.config.min_new_samples {
                    return TrainOutcome::Skipped;
                }
                (s.train.samples().cloned().collect(), s.holdout.samples().cloned().collect(), None)
            };
            Round {
                train,
                judge,
                refill,
                newest: s.newest_held_out_rows(NEWEST_FOR_LEVEL),
                taken: s.new_since_training,
                filed: s.filed,
            }
        };
        let Some(fitted) = training::fit(&train, &self.config) else {
            return TrainOutcome::Skipped;
        };
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).trained_on(taken);

        let objective = self.config.objective();
        let candidate = training::score(&judge, objective, |r| fitted.predict(r));
        let scorer = self.scoring_session();
        let replaces_prior = self.registry.active().is_none();
        let (current, kept) = if replaces_prior {
            let prior = self.score_prior_as_served(&judge, objective);
            (prior, !training::replaces_prior(&candidate, &prior))
        } else {
            let active = self.score_active(scorer.as_deref(), &judge, objective);
            (active, training::worse(&candidate, &active, judge.len(), self.config.keep_margin))
        };
        if kept {
            tracing::info!(
                candidate = candidate.error,
                active = current.error,
                judged_on = judge.len(),
                "new model not better on the holdout; kept the active one"
            );
            self.persist_samples();
            return TrainOutcome::KeptActive { candidate_error: candidate.error, active_error: current.error };
        }
        let (info, bytes) = training::export(&fitted, self.registry.next_version(), objective, &candidate, judge.len());
        let info = ModelInfo { trained_on_drift: drifting, ..info };
        if drifting {
            tracing::info!(train = train.len(), judged_on = judge.len(), "model drifted; trained on the samples since");
        }
        let outcome = match runtime::load(&*self.runtime, &bytes) {
            Ok(model) => {
                tracing::info!(version = %info.name(), mape_ttft = ?info.holdout_mape_ttft, mape_tpot = ?info.holdout_mape_tpot, train_ms = info.train_ms, "activated model");
                if let Some(data) = &self.data {
                    data.write_model(&info, &bytes);
                }
                // How the new model's level differs from the one it replaces, on today's
                // traffic: what the live correction must allow for (`calibration`).
                let level = (!drifting && !replaces_prior).then(|| {
                    let new: Vec<_> = newest.iter().map(|r| fitted.predict(r)).collect();
                    let classes: Vec<f32> = newest.iter().map(|r| r[features::HARDWARE_CLASS]).collect();
                    calibration::log_ratios(&classes, &new, &self.active_raw_for_round(scorer.as_deref(), &newest))
                });
                self.registry.install(model, info.clone(), bytes);
                self.active_from.store(filed, Ordering::SeqCst);
                if let Some(holdout) = refill {
                    // A new regime: the reservoirs, the live correction and the live errors of
                    // the old one go. The old model's errors are what set drift off: kept,
                    // they judged the new model drifting at once, round after round.
                    self.samples.lock().unwrap_or_else(|p| p.into_inner()).refill(train, holdout, filed);
                    self.live.lock().unwrap_or_else(|p| p.into_inner()).clear();
                }
                // The correction and the drift window carry over from one trained model to
                // the next: they follow each other every few seconds, faster than either
                // would settle if restarted, and share most of their samples and so their
                // bias; the correction allows for the new model's level. The prior's bias
                // says nothing of the first model's, nor the old regime's of the new one's.
                let mut calibration = self.calibration.lock().unwrap_or_else(|p| p.into_inner());
                match level {
                    Some(level) => calibration.model_replaced(&level, self.clock.now()),
                    None => {
                        calibration.reset(self.clock.now());
                        self.duel.lock().unwrap_or_else(|p| p.into_inner()).reset(self.clock.now());
                    }
                }
                TrainOutcome::Activated(Box::new(info))
            }
            Err(e) => {
                tracing::error!(error = %e, "exported model does not load; kept the active one");
                TrainOutcome::Skipped
            }
        };
        self.persist_samples();
        outcome
    }

    /// The active model's live error against its held-out error. Never drifting
    /// while the prior serves (the first model comes from `min_samples` anyway), or
    /// with `drift_factor = 0`.
    pub fn drift(&self) -> DriftView {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).judged();
        let factor = self.config.drift_factor;
        let holdout = match &*self.registry.active() {
            Some(m) if self.trains() => m.info.holdout_drift,
            _ => [None, None],
        };
        let drifting = factor > 0.0
            && (0..2).any(|k| matches!((live[k], holdout[k]), (Some((_, l)), Some(h)) if drifted(l, h, factor)));
        let [ttft, tpot] = live.map(|l| l.map(|(mape, _)| mape));
        DriftView { drifting, factor, live_mape_ttft: ttft, live_mape_tpot: tpot }
    }

    /// The live correction applied to served predictions.
    pub fn calibration(&self) -> CalibrationView {
        self.calibration.lock().unwrap_or_else(|p| p.into_inner()).view()
    }

    /// The prior's own correction (what serves it when the contest hands it a target).
    pub fn prior_calibration(&self) -> CalibrationView {
        self.prior_calibration.lock().unwrap_or_else(|p| p.into_inner()).view()
    }

    /// What serves each target, and the contest's tally.
    pub fn duel(&self) -> DuelView {
        self.duel.lock().unwrap_or_else(|p| p.into_inner()).view(self.clock.now(), self.registry.active().is_some())
    }

    /// The serving model's own scores on `holdout` (the prior's when no model is active).
    /// The prior's scores on a training round's held-out samples as it serves them now, with
    /// the live correction: what a first model must beat to replace it.
    fn score_prior_as_served(&self, holdout: &[Sample], objective: Objective) -> Scores {
        let calibration = self.calibration.lock().unwrap_or_else(|p| p.into_inner()).clone();
        training::score(holdout, objective, |r| calibration.apply(r[features::HARDWARE_CLASS], self.prior.predict(r)))
    }

    fn score_active(&self, scorer: Option<&dyn LatencyModel>, holdout: &[Sample], objective: Objective) -> Scores {
        let rows: Vec<Row> = holdout.iter().map(|s| s.row).collect();
        let mut predicted = self.active_raw_for_round(scorer, &rows).into_iter();
        training::score(holdout, objective, |_| predicted.next().unwrap_or((f64::NAN, f64::NAN)))
    }

    /// Writes the sample reservoirs to the data directory (if one is set).
    pub fn persist_samples(&self) {
        let Some(data) = &self.data else { return };
        let encoded = persistence::encode_samples(&self.samples.lock().unwrap_or_else(|p| p.into_inner()));
        data.write_samples(encoded);
    }

    /// Every kept version, oldest first, and the active one's name.
    pub fn versions(&self) -> (Vec<ModelInfo>, String) {
        (self.registry.versions(), self.active_name())
    }

    /// The ONNX bytes of version `name` (`v<N>`).
    pub fn onnx_bytes(&self, name: &str) -> Option<Arc<Vec<u8>>> {
        self.registry.onnx_bytes(name)
    }

    /// The samples' counts, under one lock.
    pub fn sample_counts(&self) -> SampleCounts {
        let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        SampleCounts {
            train: s.train.len(),
            holdout: s.holdout.len(),
            since_training: s.new_since_training,
            filed: s.filed,
        }
    }
}

/// What `GET /v1/models` says of the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SampleCounts {
    /// Kept in the training reservoir.
    pub train: usize,
    /// Kept in the held-out reservoir.
    pub holdout: usize,
    /// Training samples no round has used yet (a round starts once there are
    /// `min_new_samples`).
    pub since_training: usize,
    /// Every sample filed since the data directory began, kept or not: the reservoirs
    /// cap their buckets and forget a finished regime on drift, so their sizes do not
    /// say whether every report became a sample.
    pub filed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(capped_mape: f64, standard_error: f64) -> ErrorSpread {
        ErrorSpread { capped_mape, standard_error }
    }

    fn observation(i: u64) -> Observation {
        let (running, waiting, input) = (i % 31, i % 7, 50 + (i * 37) % 3000);
        let ttft = 20.0 + 0.05 * input as f64 + 15.0 * waiting as f64;
        let value = serde_json::json!({"pool": "p", "request_id": format!("r{i}"), "endpoint": "e:1",
            "request": {"model": "m", "input_tokens": input, "streaming": true, "max_tokens": 100},
            "state_at_dispatch": {"running": running, "waiting": waiting, "kv_usage": 0.2, "prefix_match": 0.0,
                "in_flight": running + waiting, "uncached_tokens_in_flight": input, "tokens_in_flight": input},
            "source": "predicted_positive", "ttft_ms": ttft, "tpot_ms": 7.0 + 0.3 * running as f64,
            "e2e_ms": 900.0, "output_tokens": 100, "status": 200});
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The serving session is one lock: a round's scoring on it held the predict calls behind
    /// it (docs/performance.md). The round scores on a session of its own.
    #[test]
    fn a_round_scores_on_a_session_of_its_own_not_the_serving_one() {
        let config = ModelConfig { min_samples: 40, min_new_samples: 20, trees: 10, ..ModelConfig::default() };
        let store = ModelStore::open(config, Arc::new(super::super::native::Native)).unwrap_or_else(|e| panic!("{e}"));
        (0..400).for_each(|i| {
            store.observe(&observation(i));
        });
        assert!(matches!(store.train_if_due(), TrainOutcome::Activated(_)));
        (400..450).for_each(|i| {
            store.observe(&observation(i));
        });
        let serving = store.registry.active();
        let runs = || serving.as_ref().as_ref().map_or(0, |a| a.onnx.runs());
        let before = runs();
        let outcome = store.train_if_due();
        assert!(matches!(outcome, TrainOutcome::Activated(_) | TrainOutcome::KeptActive { .. }), "{outcome:?}");
        assert_eq!(runs(), before, "the round ran on the serving session");
    }

    #[test]
    fn drift_allows_for_the_chance_in_both_means() {
        // A held-out set of 40 that happened to be easy (15% +- 3%) against a live window at
        // the fleet's usual 24%: past 1.5x the held-out figure, within chance of it.
        assert!(!drifted(spread(0.24, 0.02), spread(0.15, 0.03), 1.5));
        // The same held-out figure measured on many samples: a real change.
        assert!(drifted(spread(0.30, 0.01), spread(0.15, 0.002), 1.5));
        // A fleet twice as slow: errors near 50% against 15% +- 3%.
        assert!(drifted(spread(0.50, 0.03), spread(0.15, 0.03), 1.5));
    }
}
