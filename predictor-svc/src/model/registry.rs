//! Which model serves, and the versions kept for `/v1/models`.
//!
//! The active model is swapped by one pointer store: predictions in flight finish
//! on the model they started with. `None` means the analytic prior serves.
//!
//! The models that served in the last [`RECALL`] stay at hand with the instant each
//! began (`active_at`): a report is judged against what the model serving at its
//! dispatch said, or would have said, not against a model trained since on its
//! neighbours (`store`, the contest of `duel`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::gbdt::Objective;
use super::runtime::OnnxModel;
use super::seen::Edge;
use super::training::ErrorSpread;

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
    /// The held-out errors as drift judges them (TTFT, TPOT; `training::ErrorSpread`).
    /// Absent when judged on too few to tell (`training::MIN_HOLDOUT_TO_COMPARE`), as a
    /// drift round's model may be, and in models saved before 2026-11-26: drift does not
    /// judge those; the next round's model, judged on the refilled reservoir, restores it.
    #[serde(default)]
    pub holdout_drift: [Option<ErrorSpread>; 2],
    pub train_ms: u64,
    /// Hex SHA-256 of the ONNX file, recorded when it was written.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Trained because the served error drifted (newest samples weighted, judged on
    /// the newest held-out ones).
    #[serde(default)]
    pub trained_on_drift: bool,
    /// The edge of the load it was trained on (`seen`): per target, by hardware class,
    /// the highest prior prediction (ms) among its samples; rows beyond it are served
    /// by the prior. Absent for a user's model and in models saved before 2026-11-28:
    /// no edge.
    #[serde(default)]
    pub seen_prior_ms: Option<Edge>,
}

impl ModelInfo {
    pub fn name(&self) -> String {
        format!("v{}", self.version)
    }
}

/// The model serving predictions.
pub struct ActiveModel {
    pub onnx: OnnxModel,
    pub info: ModelInfo,
}

/// How far back `Registry::active_at` reaches: as far as the live correction's history
/// (`calibration`), beyond the longest request a report is judged on.
pub const RECALL: Duration = Duration::from_secs(120);
/// The most models kept for it: one every 5 s by default (`retrain_interval_ms`) is 25;
/// a shorter interval keeps the newest, and a report from before them is not judged.
pub const MAX_RECALLED: usize = 64;

/// The models that served, each from its instant, oldest first.
struct Served {
    entries: VecDeque<(Instant, Arc<Option<ActiveModel>>)>,
    /// Whether the oldest entry held before its instant too: true from construction (the
    /// prior, as far as this process knows) until the first trimming.
    covers_before: bool,
}

/// The active model and the kept versions (info and ONNX bytes), oldest first.
pub struct Registry {
    active: RwLock<Arc<Option<ActiveModel>>>,
    /// The models that served, each from its instant, oldest first.
    served: Mutex<Served>,
    versions: Mutex<Vec<(ModelInfo, Arc<Vec<u8>>)>>,
    keep: usize,
}

impl Registry {
    /// Keeps at most `keep` versions (at least one).
    pub fn new(keep: usize) -> Registry {
        let none = Arc::new(None);
        Registry {
            active: RwLock::new(none.clone()),
            served: Mutex::new(Served { entries: VecDeque::from([(Instant::now(), none)]), covers_before: true }),
            versions: Mutex::new(Vec::new()),
            keep: keep.max(1),
        }
    }

    /// Adds an older version to the history without serving it (a restart's history).
    pub fn remember(&self, info: ModelInfo, bytes: Vec<u8>) {
        self.versions.lock().unwrap_or_else(|p| p.into_inner()).push((info, Arc::new(bytes)));
    }

    /// Makes `onnx` the active model and the newest version.
    pub fn install(&self, onnx: OnnxModel, info: ModelInfo, bytes: Vec<u8>) {
        let mut versions = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        versions.retain(|(i, _)| i.version != info.version);
        versions.push((info.clone(), Arc::new(bytes)));
        if versions.len() > self.keep {
            let extra = versions.len() - self.keep;
            versions.drain(..extra);
        }
        drop(versions);
        let model = Arc::new(Some(ActiveModel { onnx, info }));
        let now = Instant::now();
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        served.entries.push_back((now, model.clone()));
        // Keep the one that held at the edge of the recall.
        while served.entries.len() > MAX_RECALLED
            || served.entries.get(1).is_some_and(|(from, _)| now.saturating_duration_since(*from) > RECALL)
        {
            served.entries.pop_front();
            served.covers_before = false;
        }
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = model;
    }

    /// The active model (`None`: the prior serves), held for as long as the caller needs it.
    pub fn active(&self) -> Arc<Option<ActiveModel>> {
        self.active.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The model that was active at `at`, if the registry still knows: `None` once
    /// entries older than [`RECALL`] were trimmed and `at` is before the oldest kept.
    pub fn active_at(&self, at: Instant) -> Option<Arc<Option<ActiveModel>>> {
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        match served.entries.partition_point(|(from, _)| *from <= at) {
            0 => served.entries.front().filter(|_| served.covers_before).map(|(_, m)| m.clone()),
            i => Some(served.entries[i - 1].1.clone()),
        }
    }

    /// The version number the next trained model gets.
    pub fn next_version(&self) -> u64 {
        self.versions.lock().unwrap_or_else(|p| p.into_inner()).last().map_or(1, |(i, _)| i.version + 1)
    }

    /// Every kept version, oldest first.
    pub fn versions(&self) -> Vec<ModelInfo> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(i, _)| i.clone()).collect()
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
}

#[cfg(test)]
mod tests {
    use super::super::features;
    use super::super::gbdt::{fit, Params};
    use super::super::onnx::export;
    use super::super::runtime::init;
    use super::*;

    /// A tiny trained model, as version `version`.
    fn model(version: u64) -> (OnnxModel, ModelInfo, Vec<u8>) {
        let rows: Vec<features::Row> = (0..200).map(|i| [i as f32; features::COUNT]).collect();
        let y: Vec<f64> = (0..200).map(|i| 10.0 + f64::from(i)).collect();
        let tree = fit(&rows, &y, &Params::default()).unwrap_or_else(|| panic!("fit"));
        let bytes = export(&tree, &tree, version as i64, &[]);
        let onnx = OnnxModel::load(&bytes).unwrap_or_else(|e| panic!("{e}"));
        let info = ModelInfo {
            version,
            source: "trained".into(),
            objective: Objective::Mean,
            created_unix_ms: 0,
            train_samples_ttft: 0,
            train_samples_tpot: 0,
            holdout_samples: 0,
            holdout_mape_ttft: None,
            holdout_mape_tpot: None,
            holdout_coverage_ttft: None,
            holdout_coverage_tpot: None,
            holdout_drift: [None, None],
            train_ms: 0,
            sha256: None,
            trained_on_drift: false,
            seen_prior_ms: None,
        };
        (onnx, info, bytes)
    }

    fn version_at(r: &Registry, at: Instant) -> Option<Option<u64>> {
        r.active_at(at).map(|m| m.as_ref().as_ref().map(|a| a.info.version))
    }

    #[test]
    fn the_model_active_at_an_instant_is_the_one_installed_last_before_it() {
        init(None).unwrap_or_else(|e| panic!("{e}"));
        let before = Instant::now();
        let r = Registry::new(3);
        assert_eq!(version_at(&r, before), Some(None), "the prior, from before construction on");
        let (onnx, info, bytes) = model(1);
        r.install(onnx, info, bytes);
        let after_first = Instant::now();
        assert_eq!(version_at(&r, before), Some(None));
        assert_eq!(version_at(&r, after_first), Some(Some(1)));
        // More installs than it keeps: the oldest are forgotten, and an instant before the
        // oldest kept is not told.
        for v in 2..=MAX_RECALLED as u64 + 2 {
            let (onnx, info, bytes) = model(v);
            r.install(onnx, info, bytes);
        }
        assert_eq!(version_at(&r, before), None);
        assert_eq!(version_at(&r, after_first), None);
        assert_eq!(version_at(&r, Instant::now()), Some(Some(MAX_RECALLED as u64 + 2)));
        assert_eq!(r.versions().len(), 3, "the kept versions are another matter");
    }
}
