//! The active latency model, its history, the training samples, and persistence.
//!
//! Before any model exists the analytic prior predicts (`super::prior`): an
//! honest formula over the same features, so routing has sane numbers from the
//! first request. Training runs off the request path (`spawn_blocking`); a new
//! model replaces the active one only if its held-out error is not worse than
//! the active one's by more than `keep_margin`. The swap is one pointer store:
//! predictions in flight finish on the model they started with.
//!
//! Data directory layout (all writes atomic and durable: a uniquely named temp
//! file, fsync, rename, fsync of the directory): `models/v<N>.onnx`,
//! `models/v<N>.json` (its [`ModelInfo`], with the ONNX file's SHA-256: a model
//! file is loaded only if it matches), `ACTIVE` (the active version),
//! `samples.msgpack` (the reservoirs, written after every training round and at
//! shutdown, so a crash loses at most one round's samples). Only the newest
//! `keep_versions` models stay on disk. Writes are serialised, so a training
//! round and the shutdown never write at once; a failed write (disk full,
//! read-only) is an error log and `headroom_persist_failures`, never a crash.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use headroom_protocol::{limits, Observation, RouteSource};
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::features::{self, Row};
use super::gbdt::{self, Objective, Params};
use super::onnx;
use super::prior::AnalyticPrior;
use super::runtime::OnnxModel;
use super::sampler::{Sample, Samples};
use crate::config::ModelConfig;

/// Name of predictions made by the analytic prior.
pub use super::prior::ANALYTIC_PRIOR as PRIOR;

/// What is known about one model version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub version: u64,
    /// `trained` online, or `user` (loaded from `model_path`).
    pub source: String,
    pub objective: Objective,
    pub created_unix_ms: u64,
    pub train_samples_ttft: usize,
    pub train_samples_tpot: usize,
    pub holdout_samples: usize,
    /// Mean absolute percentage error on the held-out samples.
    pub holdout_mape_ttft: Option<f64>,
    pub holdout_mape_tpot: Option<f64>,
    /// Share of held-out samples at or under the prediction.
    pub holdout_coverage_ttft: Option<f64>,
    pub holdout_coverage_tpot: Option<f64>,
    pub train_ms: u64,
    /// Hex SHA-256 of the ONNX file, recorded when it was written.
    #[serde(default)]
    pub sha256: Option<String>,
}

impl ModelInfo {
    pub fn name(&self) -> String {
        format!("v{}", self.version)
    }
}

/// The model serving predictions; `None` in the store means the prior serves.
struct ActiveModel {
    onnx: OnnxModel,
    info: ModelInfo,
}

/// What a training round did.
#[derive(Debug, Clone, PartialEq)]
pub enum TrainOutcome {
    /// Not enough (new) samples yet.
    Skipped,
    /// Trained, validated, and now active.
    Activated(ModelInfo),
    /// Trained but worse on the holdout than the active model: discarded.
    KeptActive { candidate_error: f64, active_error: f64 },
}

/// Error of predictions against held-out truth, for comparing models.
#[derive(Debug, Clone, Copy, Default)]
struct Scores {
    mape_ttft: Option<f64>,
    mape_tpot: Option<f64>,
    coverage_ttft: Option<f64>,
    coverage_tpot: Option<f64>,
    /// The number models are compared by: MAPE (mean) or pinball loss of the relative error (quantile).
    error: f64,
}

pub struct ModelStore {
    config: ModelConfig,
    prior: AnalyticPrior,
    active: RwLock<Arc<Option<ActiveModel>>>,
    /// Versions kept (info and ONNX bytes), oldest first.
    versions: Mutex<Vec<(ModelInfo, Arc<Vec<u8>>)>>,
    samples: Mutex<Samples>,
    training: AtomicBool,
    /// Held while writing to the data directory: one writer at a time.
    persist_lock: Mutex<()>,
    /// Failed writes to the data directory (`headroom_persist_failures`).
    pub persist_failures: Counter,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Prefix of temp files; leftovers of a crash are removed at start.
const TMP_PREFIX: &str = ".tmp-";

/// Writes `bytes` to `path` atomically and durably: a reader (or a restart after a
/// crash or power loss) sees the old or the new file, never half of one. The temp
/// name is unique per process and write, so concurrent writers never share one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!("{TMP_PREFIX}{name}.{}.{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

impl ModelStore {
    /// Loads ONNX Runtime, then the user model or the persisted state.
    pub fn open(config: ModelConfig) -> anyhow::Result<ModelStore> {
        super::runtime::init(config.onnxruntime_library.as_deref())?;
        let store = ModelStore {
            samples: Mutex::new(Samples::new(config.bucket_cap, config.holdout_percent)),
            config,
            prior: AnalyticPrior::default(),
            active: RwLock::new(Arc::new(None)),
            versions: Mutex::new(Vec::new()),
            training: AtomicBool::new(false),
            persist_lock: Mutex::new(()),
            persist_failures: Counter::default(),
        };
        if let Some(path) = store.config.model_path.clone() {
            let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("model_path {}: {e}", path.display()))?;
            let onnx = OnnxModel::load(&bytes).map_err(|e| anyhow::anyhow!("model_path {}: {e}", path.display()))?;
            let info = ModelInfo {
                version: 1,
                source: "user".into(),
                objective: store.config.objective(),
                created_unix_ms: now_ms(),
                train_samples_ttft: 0,
                train_samples_tpot: 0,
                holdout_samples: 0,
                holdout_mape_ttft: None,
                holdout_mape_tpot: None,
                holdout_coverage_ttft: None,
                holdout_coverage_tpot: None,
                train_ms: 0,
                sha256: Some(sha256_hex(&bytes)),
            };
            tracing::info!(path = %path.display(), "using the user-supplied model; online training is off");
            store.install(onnx, info, Arc::new(bytes));
            return Ok(store);
        }
        if let Some(dir) = store.config.data_dir.clone() {
            store.restore(&dir);
        }
        Ok(store)
    }

    /// Replaces the analytic prior (e.g. with `Config::prior`'s hardware scales).
    pub fn with_prior(mut self, prior: AnalyticPrior) -> Self {
        self.prior = prior;
        self
    }

    fn install(&self, onnx: OnnxModel, info: ModelInfo, bytes: Arc<Vec<u8>>) {
        let mut versions = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        versions.retain(|(i, _)| i.version != info.version);
        versions.push((info.clone(), bytes));
        let keep = self.config.keep_versions.max(1);
        if versions.len() > keep {
            let extra = versions.len() - keep;
            versions.drain(..extra);
        }
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Some(ActiveModel { onnx, info }));
    }

    /// Restores models and samples from `dir`. A model file that does not load
    /// is refused (logged) and the newest older one that loads is used instead.
    fn restore(&self, dir: &Path) {
        let models = dir.join("models");
        let mut infos: Vec<ModelInfo> = std::fs::read_dir(&models)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| match std::fs::read(e.path()).map(|b| serde_json::from_slice::<ModelInfo>(&b)) {
                Ok(Ok(info)) => Some(info),
                _ => {
                    tracing::error!(file = %e.path().display(), "refusing unreadable model metadata");
                    None
                }
            })
            .collect();
        infos.sort_by_key(|i| i.version);
        let active: Option<u64> = std::fs::read_to_string(dir.join("ACTIVE"))
            .ok()
            .and_then(|s| s.trim().trim_start_matches('v').parse().ok());
        let mut candidates: Vec<&ModelInfo> = infos.iter().filter(|i| active.is_none_or(|a| i.version <= a)).collect();
        candidates.reverse();
        remove_temp_files(dir);
        remove_temp_files(&models);
        for info in candidates {
            let path = models.join(format!("{}.onnx", info.name()));
            let loaded = read_verified(&models, info).and_then(|b| Ok((OnnxModel::load(&b)?, b)));
            match loaded {
                Ok((onnx, bytes)) => {
                    tracing::info!(version = %info.name(), "restored model");
                    // Keep the history of loadable versions up to this one.
                    for older in infos.iter().filter(|i| i.version < info.version) {
                        if let Ok(b) = read_verified(&models, older) {
                            self.versions.lock().unwrap_or_else(|p| p.into_inner()).push((older.clone(), Arc::new(b)));
                        }
                    }
                    self.install(onnx, info.clone(), Arc::new(bytes));
                    break;
                }
                Err(e) => tracing::error!(
                    file = %path.display(),
                    error = %e,
                    "refusing corrupt model file; keeping the last good model"
                ),
            }
        }
        match std::fs::read(dir.join("samples.msgpack")) {
            Ok(bytes) => match rmp_serde::from_slice::<Samples>(&bytes) {
                Ok(restored) => {
                    let s = Samples::rehome(restored, self.config.bucket_cap, self.config.holdout_percent);
                    tracing::info!(train = s.train.len(), holdout = s.holdout.len(), "restored samples");
                    *self.samples.lock().unwrap_or_else(|p| p.into_inner()) = s;
                }
                Err(e) => tracing::error!(error = %e, "refusing corrupt samples.msgpack; starting with no samples"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::error!(error = %e, "cannot read samples.msgpack"),
        }
    }

    /// The active model's name (`analytic-prior` or `v<N>`).
    pub fn active_name(&self) -> String {
        match &**self.active.read().unwrap_or_else(|p| p.into_inner()) {
            None => PRIOR.to_string(),
            Some(m) => m.info.name(),
        }
    }

    /// (TTFT, TPOT) in ms for every row, in one batch, and the name of the model that made them.
    pub fn predict(&self, rows: &[Row]) -> (Vec<(f64, f64)>, String) {
        let active = self.active.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(ActiveModel { onnx, info }) = &*active {
            match onnx.predict(rows) {
                Ok(out) if out.iter().all(|&(a, b)| limits::is_ms(a) && limits::is_ms(b)) => return (out, info.name()),
                Ok(_) => {
                    tracing::warn!(version = %info.name(), "model predicted a value out of range; using the prior")
                }
                Err(e) => tracing::warn!(version = %info.name(), error = %e, "model failed; using the prior"),
            }
        }
        (rows.iter().map(|r| self.prior.predict(r)).collect(), PRIOR.to_string())
    }

    /// Files a finished request as a training sample when it can teach something:
    /// a 200 whose features came from a predict call, with TTFT from streaming only.
    pub fn observe(&self, o: &Observation) -> bool {
        let from_predict = matches!(
            o.source,
            RouteSource::PredictedPositive | RouteSource::PredictedNegative | RouteSource::Composite
        );
        let Some(state) = o.state_at_dispatch.as_ref().filter(|_| from_predict && o.status == 200) else {
            return false;
        };
        let ok = |v: Option<f64>| v.filter(|x| x.is_finite() && *x > 0.0);
        let (ttft, tpot) = if o.request.streaming { (ok(o.ttft_ms), ok(o.tpot_ms)) } else { (None, None) };
        if ttft.is_none() && tpot.is_none() {
            return false;
        }
        let sample = Sample { row: features::row(&o.request, state), ttft_ms: ttft, tpot_ms: tpot };
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).push(&o.request_id, sample);
        true
    }

    /// Whether online training is on (off with a user model).
    pub fn trains(&self) -> bool {
        self.config.model_path.is_none()
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
        let (train, holdout, taken): (Vec<Sample>, Vec<Sample>, usize) = {
            let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            if s.new_since_training < self.config.min_new_samples {
                return TrainOutcome::Skipped;
            }
            (s.train.samples().cloned().collect(), s.holdout.samples().cloned().collect(), s.new_since_training)
        };
        let column = |f: fn(&Sample) -> Option<f64>| -> (Vec<Row>, Vec<f64>) {
            train.iter().filter_map(|s| f(s).map(|y| (s.row, y))).unzip()
        };
        let (ttft_rows, ttft_y) = column(|s| s.ttft_ms);
        let (tpot_rows, tpot_y) = column(|s| s.tpot_ms);
        if ttft_rows.len() < self.config.min_samples || tpot_rows.len() < self.config.min_samples {
            return TrainOutcome::Skipped;
        }
        let started = Instant::now();
        let params = Params {
            trees: self.config.trees,
            max_depth: self.config.max_depth,
            learning_rate: self.config.learning_rate,
            objective: self.config.objective(),
            ..Params::default()
        };
        let (Some(ttft), Some(tpot)) =
            (gbdt::fit(&ttft_rows, &ttft_y, &params), gbdt::fit(&tpot_rows, &tpot_y, &params))
        else {
            return TrainOutcome::Skipped;
        };
        let train_ms = started.elapsed().as_millis() as u64;
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).trained_on(taken);

        let objective = self.config.objective();
        let candidate = score(&holdout, objective, |r| (ttft.predict(r), tpot.predict(r)));
        let active = self.active.read().unwrap_or_else(|p| p.into_inner()).clone();
        let current = match &*active {
            None => score(&holdout, objective, |r| self.prior.predict(r)),
            Some(ActiveModel { onnx, .. }) => {
                let rows: Vec<Row> = holdout.iter().map(|s| s.row).collect();
                let preds = onnx.predict(&rows).unwrap_or_default();
                let mut it = preds.into_iter();
                score(&holdout, objective, |_| it.next().unwrap_or((f64::NAN, f64::NAN)))
            }
        };
        let enough_holdout = holdout.len() >= 20;
        if enough_holdout && candidate.error > current.error * (1.0 + self.config.keep_margin) {
            tracing::info!(
                candidate = candidate.error,
                active = current.error,
                "new model worse on the holdout; kept the active one"
            );
            self.persist_samples();
            return TrainOutcome::KeptActive { candidate_error: candidate.error, active_error: current.error };
        }
        let version = self.versions.lock().unwrap_or_else(|p| p.into_inner()).last().map_or(1, |(i, _)| i.version + 1);
        let info = ModelInfo {
            version,
            source: "trained".into(),
            objective,
            created_unix_ms: now_ms(),
            train_samples_ttft: ttft_rows.len(),
            train_samples_tpot: tpot_rows.len(),
            holdout_samples: holdout.len(),
            holdout_mape_ttft: candidate.mape_ttft,
            holdout_mape_tpot: candidate.mape_tpot,
            holdout_coverage_ttft: candidate.coverage_ttft,
            holdout_coverage_tpot: candidate.coverage_tpot,
            train_ms,
            sha256: None,
        };
        let meta = [
            ("version", info.name()),
            ("objective", serde_json::to_string(&objective).unwrap_or_default()),
            ("train_samples", format!("{}/{}", info.train_samples_ttft, info.train_samples_tpot)),
        ];
        let bytes = onnx::export(&ttft, &tpot, version as i64, &meta);
        let info = ModelInfo { sha256: Some(sha256_hex(&bytes)), ..info };
        match OnnxModel::load(&bytes) {
            Ok(model) => {
                tracing::info!(version = %info.name(), mape_ttft = ?info.holdout_mape_ttft, mape_tpot = ?info.holdout_mape_tpot, train_ms, "activated model");
                self.persist_model(&info, &bytes);
                self.install(model, info.clone(), Arc::new(bytes));
                self.persist_samples();
                TrainOutcome::Activated(info)
            }
            Err(e) => {
                tracing::error!(error = %e, "exported model does not load; kept the active one");
                self.persist_samples();
                TrainOutcome::Skipped
            }
        }
    }

    /// Writes a new model (file, metadata, `ACTIVE`) and prunes versions beyond `keep_versions`.
    fn persist_model(&self, info: &ModelInfo, bytes: &[u8]) {
        let Some(dir) = &self.config.data_dir else { return };
        let _writing = self.persist_lock.lock().unwrap_or_else(|p| p.into_inner());
        let models = dir.join("models");
        let result = write_atomic(&models.join(format!("{}.onnx", info.name())), bytes)
            .and_then(|_| {
                write_atomic(&models.join(format!("{}.json", info.name())), &serde_json::to_vec_pretty(info)?)
            })
            .and_then(|_| write_atomic(&dir.join("ACTIVE"), info.name().as_bytes()));
        match result {
            Ok(()) => prune_versions(&models, info.version, self.config.keep_versions.max(1) as u64),
            Err(e) => self.persist_failed(dir, "the model", &e),
        }
    }

    fn persist_failed(&self, dir: &Path, what: &str, e: &std::io::Error) {
        self.persist_failures.inc();
        tracing::error!(dir = %dir.display(), error = %e, "cannot persist {what}; serving on from memory");
    }

    /// Writes the sample reservoirs to the data directory (if one is set).
    pub fn persist_samples(&self) {
        let Some(dir) = &self.config.data_dir else { return };
        let bytes = {
            let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            rmp_serde::to_vec_named(&*s)
        };
        let _writing = self.persist_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) =
            bytes.map_err(std::io::Error::other).and_then(|b| write_atomic(&dir.join("samples.msgpack"), &b))
        {
            self.persist_failed(dir, "samples", &e);
        }
    }

    /// Every kept version, oldest first, and the active one's name.
    pub fn versions(&self) -> (Vec<ModelInfo>, String) {
        let versions = self.versions.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(i, _)| i.clone()).collect();
        (versions, self.active_name())
    }

    /// The ONNX bytes of version `name` (`v<N>`).
    pub fn onnx_bytes(&self, name: &str) -> Option<Arc<Vec<u8>>> {
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(i, _)| i.name() == name)
            .map(|(_, b)| b.clone())
    }

    /// (train, holdout) sample counts.
    pub fn sample_counts(&self) -> (usize, usize) {
        let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        (s.train.len(), s.holdout.len())
    }

    /// Training samples filed since the last training round used them (a round
    /// starts once there are `min_new_samples`).
    pub fn samples_since_training(&self) -> usize {
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).new_since_training
    }
}

/// The ONNX file of version `info` in `models`, if its SHA-256 is the one recorded for it.
fn read_verified(models: &Path, info: &ModelInfo) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(models.join(format!("{}.onnx", info.name())))?;
    let actual = sha256_hex(&bytes);
    match &info.sha256 {
        Some(recorded) if *recorded == actual => Ok(bytes),
        Some(recorded) => anyhow::bail!("checksum {actual} does not match the recorded {recorded}"),
        None => anyhow::bail!("no checksum recorded for it"),
    }
}

/// Removes temp files a crash left in `dir`.
fn remove_temp_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_name().to_str().is_some_and(|n| n.starts_with(TMP_PREFIX)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Deletes `v<N>.onnx` / `v<N>.json` in `models` older than the `keep` newest up to `newest`.
fn prune_versions(models: &Path, newest: u64, keep: u64) {
    let oldest_kept = newest.saturating_sub(keep - 1);
    for entry in std::fs::read_dir(models).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let version = name
            .strip_prefix('v')
            .and_then(|rest| rest.strip_suffix(".onnx").or_else(|| rest.strip_suffix(".json")))
            .and_then(|n| n.parse::<u64>().ok());
        if version.is_some_and(|v| v < oldest_kept) {
            if let Err(e) = std::fs::remove_file(entry.path()) {
                tracing::warn!(file = %entry.path().display(), error = %e, "cannot prune an old model version");
            }
        }
    }
}

/// Scores `predict` on held-out samples.
fn score(holdout: &[Sample], objective: Objective, mut predict: impl FnMut(&Row) -> (f64, f64)) -> Scores {
    let (mut ape, mut cover, mut pinball) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()], Vec::new());
    for s in holdout {
        let (t, p) = predict(&s.row);
        for (k, (pred, truth)) in [(t, s.ttft_ms), (p, s.tpot_ms)].into_iter().enumerate() {
            let Some(truth) = truth else { continue };
            if !pred.is_finite() {
                ape[k].push(1.0);
                continue;
            }
            ape[k].push((pred - truth).abs() / truth);
            cover[k].push(if pred >= truth { 1.0 } else { 0.0 });
            if let Objective::Quantile { q } = objective {
                let r = (truth - pred) / truth;
                pinball.push(if r > 0.0 { q * r } else { (q - 1.0) * r });
            }
        }
    }
    let mean = |v: &Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let (mape_ttft, mape_tpot) = (mean(&ape[0]), mean(&ape[1]));
    let error = match objective {
        Objective::Mean => (mape_ttft.unwrap_or(0.0) + mape_tpot.unwrap_or(0.0)) / 2.0,
        Objective::Quantile { .. } => mean(&pinball).unwrap_or(0.0),
    };
    Scores { mape_ttft, mape_tpot, coverage_ttft: mean(&cover[0]), coverage_tpot: mean(&cover[1]), error }
}
