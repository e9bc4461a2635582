//! Which model serves, and the versions kept for `/v1/models`.
//!
//! The active model is swapped by one pointer store: predictions in flight finish
//! on the model they started with. `None` means the analytic prior serves.

use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};

use super::gbdt::Objective;
use super::runtime::LatencyModel;
use super::spread::ErrorSpread;

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
    /// The held-out errors as drift judges them (TTFT, TPOT; `spread::ErrorSpread`).
    /// Absent when judged on too few to tell (`spread::MIN_HOLDOUT_TO_COMPARE`), as a
    /// drift round's model may be, and in models saved before drift judged spreads: drift does not
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
}

impl ModelInfo {
    pub fn name(&self) -> String {
        format!("v{}", self.version)
    }
}

/// The model serving predictions.
pub struct ActiveModel {
    pub onnx: Box<dyn LatencyModel>,
    pub info: ModelInfo,
}

/// The active model and the kept versions (info and ONNX bytes), oldest first.
pub struct Registry {
    active: RwLock<Arc<Option<ActiveModel>>>,
    versions: Mutex<Vec<(ModelInfo, Arc<Vec<u8>>)>>,
    keep: usize,
}

impl Registry {
    /// Keeps at most `keep` versions (at least one).
    pub fn new(keep: usize) -> Registry {
        Registry { active: RwLock::new(Arc::new(None)), versions: Mutex::new(Vec::new()), keep: keep.max(1) }
    }

    /// Adds an older version to the history without serving it (a restart's history).
    pub fn remember(&self, info: ModelInfo, bytes: Vec<u8>) {
        self.versions.lock().unwrap_or_else(|p| p.into_inner()).push((info, Arc::new(bytes)));
    }

    /// Makes `onnx` the active model and the newest version.
    pub fn install(&self, onnx: Box<dyn LatencyModel>, info: ModelInfo, bytes: Vec<u8>) {
        let mut versions = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        versions.retain(|(i, _)| i.version != info.version);
        versions.push((info.clone(), Arc::new(bytes)));
        if versions.len() > self.keep {
            let extra = versions.len() - self.keep;
            versions.drain(..extra);
        }
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Some(ActiveModel { onnx, info }));
    }

    /// The active model (`None`: the prior serves), held for as long as the caller needs it.
    pub fn active(&self) -> Arc<Option<ActiveModel>> {
        self.active.read().unwrap_or_else(|p| p.into_inner()).clone()
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
