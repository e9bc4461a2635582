//! ONNX Runtime, the service's model runtime (`predictor_core::model::runtime`): finding
//! the library, and running any latency model with the predictor's signature.
//!
//! `ort` is built with `load-dynamic`: nothing is downloaded at build time and
//! the library is loaded when the service starts, from (first found)
//! `ORT_DYLIB_PATH`, the `onnxruntime_library` config value, or the
//! `onnxruntime` package `make setup` installs into the project's `.venv`.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::session::Session;
use ort::value::TensorRef;

use headroom_predictor_core::model::features::{self, Row};
use headroom_predictor_core::model::onnx::{INPUT, OUTPUT};
use headroom_predictor_core::model::runtime::{LatencyModel, Runtime};

static ENVIRONMENT: OnceLock<ort::environment::Environment> = OnceLock::new();

/// Candidate library paths, in the order tried.
fn candidates(configured: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        out.push(PathBuf::from(p));
    }
    if let Some(p) = configured {
        out.push(p.to_path_buf());
    }
    let mut roots: Vec<PathBuf> = vec![std::env::current_dir().unwrap_or_default()];
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/headroom-predictor (or .../deps/<test>) -> the repository root
        roots.extend(exe.ancestors().skip(1).take(4).map(Path::to_path_buf));
    }
    for root in roots {
        let lib = root.join(".venv/lib");
        let Ok(entries) = std::fs::read_dir(&lib) else { continue };
        for python in entries.flatten() {
            let capi = python.path().join("site-packages/onnxruntime/capi");
            let Ok(files) = std::fs::read_dir(&capi) else { continue };
            for f in files.flatten() {
                let name = f.file_name().to_string_lossy().to_string();
                if name.starts_with("libonnxruntime.so.") {
                    out.push(f.path());
                }
            }
        }
    }
    out
}

/// ONNX Runtime as the predictor's model runtime.
#[derive(Debug, Clone, Copy)]
pub struct Ort;

impl Ort {
    /// Loads the library (once per process) from the first place it is found; the error
    /// names every place looked at.
    pub fn init(configured: Option<&Path>) -> anyhow::Result<Ort> {
        init(configured)?;
        Ok(Ort)
    }
}

impl Runtime for Ort {
    fn load(&self, onnx: &[u8]) -> anyhow::Result<Box<dyn LatencyModel>> {
        Ok(Box::new(OnnxModel::load(onnx)?))
    }
}

fn init(configured: Option<&Path>) -> anyhow::Result<()> {
    if ENVIRONMENT.get().is_some() {
        return Ok(());
    }
    let tried = candidates(configured);
    let Some(path) = tried.iter().find(|p| p.is_file()) else {
        anyhow::bail!(
            "ONNX Runtime library not found (tried ORT_DYLIB_PATH, onnxruntime_library, and .venv/lib/python*/site-packages/onnxruntime/capi/libonnxruntime.so.*{}); run `make setup` or set ORT_DYLIB_PATH",
            if tried.is_empty() { String::new() } else { format!(": {tried:?}") }
        );
    };
    let env = ort::init_from(path)
        .map_err(|e| anyhow::anyhow!("loading ONNX Runtime from {}: {e}", path.display()))?
        .with_name("headroom")
        .build()
        .map_err(|e| anyhow::anyhow!("starting ONNX Runtime: {e}"))?;
    let _ = ENVIRONMENT.set(env);
    tracing::info!(library = %path.display(), "ONNX Runtime loaded");
    Ok(())
}

/// A loaded latency model (`features[N,14] -> latency_ms[N,2]`).
pub struct OnnxModel {
    session: Mutex<Session>,
    /// `Session::run` calls so far: what shares the session, seen from outside.
    runs: std::sync::atomic::AtomicU64,
}

impl OnnxModel {
    /// Builds a session from ONNX bytes and checks the signature.
    pub fn load(bytes: &[u8]) -> anyhow::Result<OnnxModel> {
        let env = ENVIRONMENT.get().ok_or_else(|| anyhow::anyhow!("ONNX Runtime is not loaded"))?;
        let mut builder = Session::builder(env).map_err(|e| anyhow::anyhow!("{e}"))?;
        builder = builder.with_intra_threads(1).map_err(|e| anyhow::anyhow!("{e}"))?;
        let session = builder.commit_from_memory(bytes).map_err(|e| anyhow::anyhow!("not a usable ONNX model: {e}"))?;
        anyhow::ensure!(
            session.inputs().iter().any(|i| i.name() == INPUT) && session.outputs().iter().any(|o| o.name() == OUTPUT),
            "the model must take `{INPUT}` float[N,{}] and give `{OUTPUT}` float[N,2]",
            features::COUNT
        );
        Ok(OnnxModel { session: Mutex::new(session), runs: Default::default() })
    }
}

impl LatencyModel for OnnxModel {
    fn runs(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One `Session::run` for all the rows.
    fn predict(&self, rows: &[Row]) -> anyhow::Result<Vec<(f64, f64)>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let input = TensorRef::from_array_view(([rows.len(), features::COUNT], &flat[..]))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let outputs = session.run(ort::inputs![INPUT => input]).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (shape, values) = outputs[OUTPUT].try_extract_tensor::<f32>().map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(
            values.len() == rows.len() * 2,
            "model output has shape {shape:?}, expected [{}, 2]",
            rows.len()
        );
        Ok(values.chunks_exact(2).map(|c| (f64::from(c[0]), f64::from(c[1]))).collect())
    }
}

#[cfg(test)]
mod tests {
    use headroom_predictor_core::model::runtime;

    use super::*;

    #[test]
    fn onnx_runtime_runs_exported_models_as_the_trees_do() {
        let ort = Ort::init(None).unwrap_or_else(|e| panic!("{e}"));
        runtime::conformance(&ort).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn garbage_bytes_are_refused_with_the_reason() {
        let ort = Ort::init(None).unwrap_or_else(|e| panic!("{e}"));
        let err = ort.load(b"definitely not onnx").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("not a usable ONNX model"), "{err}");
    }
}
