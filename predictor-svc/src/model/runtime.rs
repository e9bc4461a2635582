//! ONNX Runtime: finding the library, and running a latency model.
//!
//! `ort` is built with `load-dynamic`: nothing is downloaded at build time and
//! the library is loaded when the service starts, from (first found)
//! `ORT_DYLIB_PATH`, the `onnxruntime_library` config value, or the
//! `onnxruntime` package `make setup` installs into the project's `.venv`.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::session::Session;
use ort::value::TensorRef;

use super::features;
use super::onnx::{INPUT, OUTPUT};

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

/// Loads ONNX Runtime once. The error names every place looked at.
pub fn init(configured: Option<&Path>) -> anyhow::Result<()> {
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
        let model = OnnxModel { session: Mutex::new(session), runs: Default::default() };
        // A model that cannot run one row is refused now, not at the first request.
        model.predict(&[[0.0; features::COUNT]])?;
        Ok(model)
    }

    /// How many times the session has run.
    pub fn runs(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// (TTFT, TPOT) in ms for every row, in one `Session::run`.
    pub fn predict(&self, rows: &[features::Row]) -> anyhow::Result<Vec<(f64, f64)>> {
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
    use super::super::gbdt::{fit, Params};
    use super::super::onnx::export;
    use super::*;

    #[test]
    fn exported_onnx_predicts_what_the_trees_predict() {
        init(None).unwrap_or_else(|e| panic!("{e}"));
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 11) as f32 / (1u64 << 53) as f32
        };
        let rows: Vec<features::Row> = (0..2000)
            .map(|_| {
                let mut r = [0f32; features::COUNT];
                for v in r.iter_mut() {
                    *v = next() * 100.0;
                }
                r
            })
            .collect();
        let ttft: Vec<f64> = rows.iter().map(|r| 20.0 + f64::from(r[1]) * 3.0 + f64::from(r[2] * r[3]) * 0.1).collect();
        let tpot: Vec<f64> = rows.iter().map(|r| 6.0 + f64::from(r[8]) * 0.2).collect();
        let params = Params::default();
        let (a, b) = (fit(&rows, &ttft, &params).unwrap(), fit(&rows, &tpot, &params).unwrap());
        let model = OnnxModel::load(&export(&a, &b, 1, &[("objective", "mean".into())])).unwrap();
        let got = model.predict(&rows).unwrap();
        for (row, (t, p)) in rows.iter().zip(got) {
            let (want_t, want_p) = (a.predict(row), b.predict(row));
            assert!((t - want_t).abs() / want_t < 1e-4, "ttft onnx {t} trees {want_t}");
            assert!((p - want_p).abs() / want_p < 1e-4, "tpot onnx {p} trees {want_p}");
        }
    }

    #[test]
    fn a_residual_model_adds_the_prior_columns_back_in_the_graph() {
        use super::super::gbdt::fit_residual;
        use super::super::prior::AnalyticPrior;
        use headroom_protocol::{EndpointState, RequestFeatures};
        init(None).unwrap_or_else(|e| panic!("{e}"));
        let prior = AnalyticPrior::default();
        let rows: Vec<features::Row> = (0..1500u32)
            .map(|i| {
                let req = RequestFeatures { input_tokens: 50 + (i * 37) % 6000, ..Default::default() };
                let state = EndpointState { running: i % 40, waiting: i % 7, in_flight: i % 40, ..Default::default() };
                features::row(&req, &state, &prior)
            })
            .collect();
        // Truth: the prior, 30% slower when the queue is long.
        let truth = |r: &features::Row, k: usize| {
            let p = prior.predict(r);
            let v = if k == 0 { p.0 } else { p.1 };
            v * if r[2] > 3.0 { 1.3 } else { 1.0 }
        };
        let (ttft, tpot): (Vec<f64>, Vec<f64>) = rows.iter().map(|r| (truth(r, 0), truth(r, 1))).unzip();
        let params = Params::default();
        let a = fit_residual(&rows, &ttft, &params, Some(features::PRIOR_LOG_TTFT)).unwrap();
        let b = fit_residual(&rows, &tpot, &params, Some(features::PRIOR_LOG_TPOT)).unwrap();
        let model = OnnxModel::load(&export(&a, &b, 1, &[])).unwrap();
        for (row, (t, p)) in rows.iter().zip(model.predict(&rows).unwrap()) {
            let (want_t, want_p) = (a.predict(row), b.predict(row));
            assert!((t - want_t).abs() / want_t < 1e-4, "ttft onnx {t} trees {want_t}");
            assert!((p - want_p).abs() / want_p < 1e-4, "tpot onnx {p} trees {want_p}");
            assert!((t - truth(row, 0)).abs() / truth(row, 0) < 0.05, "learnt the residual: {t} vs {}", truth(row, 0));
        }
    }

    #[test]
    fn garbage_bytes_are_refused() {
        init(None).unwrap_or_else(|e| panic!("{e}"));
        let err = OnnxModel::load(b"definitely not onnx").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("not a usable ONNX model"), "{err}");
    }
}
