//! The data directory: where models and samples outlive a restart.
//!
//! Layout (all writes atomic and durable: a uniquely named temp file, fsync,
//! rename, fsync of the directory): `models/v<N>.onnx`, `models/v<N>.json` (its
//! [`ModelInfo`], with the ONNX file's SHA-256: a model file is loaded only if it
//! matches), `ACTIVE` (the active version), `samples.msgpack` (the reservoirs).
//! Only the newest `keep_versions` models stay on disk. Writes are serialised, so
//! a training round and the shutdown never write at once; a failed write (disk
//! full, read-only) is an error log and `headroom_persist_failures`, never a crash.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use sha2::{Digest, Sha256};

use super::registry::ModelInfo;
use super::runtime::{self, LatencyModel, Runtime};
use super::sampler::Samples;

/// Prefix of temp files; leftovers of a crash are removed at start.
const TMP_PREFIX: &str = ".tmp-";

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

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

/// A loadable model found on disk.
pub struct RestoredModel {
    pub onnx: Box<dyn LatencyModel>,
    pub info: ModelInfo,
    pub bytes: Vec<u8>,
    /// Older versions whose files verify, oldest first (the history `/v1/models` lists).
    pub older: Vec<(ModelInfo, Vec<u8>)>,
}

/// One data directory, written by one writer at a time.
pub struct DataDir {
    dir: PathBuf,
    keep_versions: u64,
    lock: Mutex<()>,
    failures: Counter,
}

impl DataDir {
    /// `failures` counts failed writes (shared with the metrics). The directory is
    /// created now, so a data dir that cannot be written is in the log (and the metric)
    /// from the start, not at the first training round minutes later; the predictor
    /// serves on from memory either way.
    pub fn open(dir: PathBuf, keep_versions: usize, failures: Counter) -> DataDir {
        let data = DataDir { dir, keep_versions: keep_versions.max(1) as u64, lock: Mutex::new(()), failures };
        if let Err(e) = std::fs::create_dir_all(&data.dir) {
            data.failed("anything (cannot create the directory)", &e);
        }
        data
    }

    fn models(&self) -> PathBuf {
        self.dir.join("models")
    }

    /// The active model as `ACTIVE` names it, or the newest older one that verifies and
    /// loads: a corrupt file is refused (logged), never served. Also removes temp files
    /// a crash left behind.
    pub fn restore_model(&self, runtime: &dyn Runtime) -> Option<RestoredModel> {
        let models = self.models();
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
        let active: Option<u64> = std::fs::read_to_string(self.dir.join("ACTIVE"))
            .ok()
            .and_then(|s| s.trim().trim_start_matches('v').parse().ok());
        remove_temp_files(&self.dir);
        remove_temp_files(&models);
        for info in infos.iter().rev().filter(|i| active.is_none_or(|a| i.version <= a)) {
            let loaded = read_verified(&models, info).and_then(|b| Ok((runtime::load(runtime, &b)?, b)));
            match loaded {
                Ok((onnx, bytes)) => {
                    tracing::info!(version = %info.name(), "restored model");
                    let older = infos
                        .iter()
                        .filter(|i| i.version < info.version)
                        .filter_map(|i| Some((i.clone(), read_verified(&models, i).ok()?)))
                        .collect();
                    return Some(RestoredModel { onnx, info: info.clone(), bytes, older });
                }
                Err(e) => tracing::error!(
                    file = %models.join(format!("{}.onnx", info.name())).display(),
                    error = %e,
                    "refusing corrupt model file; keeping the last good model"
                ),
            }
        }
        None
    }

    /// The persisted sample reservoirs, if any are readable.
    pub fn restore_samples(&self) -> Option<Samples> {
        match std::fs::read(self.dir.join("samples.msgpack")) {
            Ok(bytes) => match rmp_serde::from_slice::<Samples>(&bytes) {
                Ok(restored) => Some(restored),
                Err(e) => {
                    tracing::error!(error = %e, "refusing corrupt samples.msgpack; starting with no samples");
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::error!(error = %e, "cannot read samples.msgpack");
                None
            }
        }
    }

    /// Writes a new model (file, metadata, `ACTIVE`) and prunes versions beyond `keep_versions`.
    pub fn write_model(&self, info: &ModelInfo, bytes: &[u8]) {
        let _writing = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let models = self.models();
        let result = write_atomic(&models.join(format!("{}.onnx", info.name())), bytes)
            .and_then(|_| {
                write_atomic(&models.join(format!("{}.json", info.name())), &serde_json::to_vec_pretty(info)?)
            })
            .and_then(|_| write_atomic(&self.dir.join("ACTIVE"), info.name().as_bytes()));
        match result {
            Ok(()) => prune_versions(&models, info.version, self.keep_versions),
            Err(e) => self.failed("the model", &e),
        }
    }

    /// Writes the sample reservoirs, encoded by [`encode_samples`] (so the caller's lock
    /// on them is not held through the write).
    pub fn write_samples(&self, encoded: std::io::Result<Vec<u8>>) {
        let _writing = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = encoded.and_then(|b| write_atomic(&self.dir.join("samples.msgpack"), &b)) {
            self.failed("samples", &e);
        }
    }

    fn failed(&self, what: &str, e: &std::io::Error) {
        self.failures.inc();
        tracing::error!(dir = %self.dir.display(), error = %e, "cannot persist {what}; serving on from memory");
    }
}

/// The bytes `samples.msgpack` holds.
pub fn encode_samples(samples: &Samples) -> std::io::Result<Vec<u8>> {
    rmp_serde::to_vec_named(samples).map_err(std::io::Error::other)
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
