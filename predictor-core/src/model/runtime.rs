//! Where latency models run. The store never names an inference engine: it hands ONNX
//! bytes to a [`Runtime`] and serves what comes back. The service runs ONNX Runtime
//! (`predictor-svc/src/ort.rs`), which takes any model with the signature
//! (`features[N,14] -> latency_ms[N,2]`, `model_path`); [`super::native::Native`] runs the
//! models this predictor exports in plain Rust, for tests and simulations that must not
//! load a shared library.

use super::features::{self, Row};

/// Turns ONNX bytes into a model that predicts.
pub trait Runtime: Send + Sync {
    /// The model in `onnx`; fails when the bytes are not a model this runtime can run
    /// with the predictor's signature.
    fn load(&self, onnx: &[u8]) -> anyhow::Result<Box<dyn LatencyModel>>;
}

/// A loaded model: (TTFT, TPOT) in ms for feature rows.
pub trait LatencyModel: Send + Sync {
    /// (TTFT, TPOT) in ms for every row, in one run.
    fn predict(&self, rows: &[Row]) -> anyhow::Result<Vec<(f64, f64)>>;
    /// How many times the model has run: what shares it, seen from outside.
    fn runs(&self) -> u64;
}

/// [`Runtime::load`], refusing a model that cannot run one row now rather than at the
/// first request.
pub fn load(runtime: &dyn Runtime, onnx: &[u8]) -> anyhow::Result<Box<dyn LatencyModel>> {
    let model = runtime.load(onnx)?;
    let out = model.predict(&[[0.0; features::COUNT]])?;
    anyhow::ensure!(out.len() == 1, "the model gave {} answers for one row", out.len());
    Ok(model)
}

/// The checks every runtime passes, run by each runtime's tests: models exported from
/// fitted ensembles predict what the ensembles predict (to 1e-4), a residual model adds
/// the prior's columns back inside the graph, and bytes that are no model are refused.
pub fn conformance(runtime: &dyn Runtime) -> anyhow::Result<()> {
    use headroom_protocol::{EndpointState, RequestFeatures};

    use super::gbdt::{fit, fit_residual, Ensemble, Params};
    use super::onnx::export;
    use super::prior::AnalyticPrior;

    fn agrees(runtime: &dyn Runtime, a: &Ensemble, b: &Ensemble, rows: &[Row]) -> anyhow::Result<()> {
        let model = load(runtime, &export(a, b, 1, &[("objective", "mean".into())]))?;
        let got = model.predict(rows)?;
        anyhow::ensure!(got.len() == rows.len(), "{} answers for {} rows", got.len(), rows.len());
        for (row, (t, p)) in rows.iter().zip(got) {
            let (want_t, want_p) = (a.predict(row), b.predict(row));
            anyhow::ensure!((t - want_t).abs() / want_t < 1e-4, "ttft: model {t}, trees {want_t}");
            anyhow::ensure!((p - want_p).abs() / want_p < 1e-4, "tpot: model {p}, trees {want_p}");
        }
        Ok(())
    }

    let params = Params::default();
    let mut seed = 7u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 11) as f32 / (1u64 << 53) as f32
    };
    let rows: Vec<Row> = (0..2000).map(|_| [0f32; features::COUNT].map(|_| next() * 100.0)).collect();
    let ttft: Vec<f64> = rows.iter().map(|r| 20.0 + f64::from(r[1]) * 3.0 + f64::from(r[2] * r[3]) * 0.1).collect();
    let tpot: Vec<f64> = rows.iter().map(|r| 6.0 + f64::from(r[8]) * 0.2).collect();
    let (Some(a), Some(b)) = (fit(&rows, &ttft, &params), fit(&rows, &tpot, &params)) else {
        anyhow::bail!("nothing was fitted");
    };
    agrees(runtime, &a, &b, &rows)?;

    // Truth: the prior, 30% slower when the queue is long; the trees learn only that.
    let prior = AnalyticPrior::default();
    let rows: Vec<Row> = (0..1500u32)
        .map(|i| {
            let req = RequestFeatures { input_tokens: 50 + (i * 37) % 6000, ..Default::default() };
            let state = EndpointState { running: i % 40, waiting: i % 7, in_flight: i % 40, ..Default::default() };
            features::row(&req, &state, &prior)
        })
        .collect();
    let truth = |r: &Row| {
        let (t, p) = prior.predict(r);
        let slower = if r[2] > 3.0 { 1.3 } else { 1.0 };
        (t * slower, p * slower)
    };
    let (ttft, tpot): (Vec<f64>, Vec<f64>) = rows.iter().map(truth).unzip();
    let a = fit_residual(&rows, &ttft, &params, Some(features::PRIOR_LOG_TTFT));
    let b = fit_residual(&rows, &tpot, &params, Some(features::PRIOR_LOG_TPOT));
    let (Some(a), Some(b)) = (a, b) else { anyhow::bail!("no residual was fitted") };
    agrees(runtime, &a, &b, &rows)?;
    let model = load(runtime, &export(&a, &b, 1, &[]))?;
    for (row, (t, _)) in rows.iter().zip(model.predict(&rows)?) {
        let want = truth(row).0;
        anyhow::ensure!((t - want).abs() / want < 0.05, "the residual was not learnt: {t} against {want}");
    }

    anyhow::ensure!(runtime.load(b"definitely not onnx").is_err(), "garbage bytes were taken for a model");
    Ok(())
}
