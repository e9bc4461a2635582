//! `cargo run --release -p headroom-predictor --bin predictor-bench`
//!
//! Prediction latency of the trained ONNX model for 8 / 64 / 256 candidates
//! (one batched `Session::run`, one intra-op thread), predictions per second,
//! and training time for 5k / 20k / 50k samples. The analytic prior runs in the
//! same invocation as a baseline. Prints markdown tables.

use std::time::Instant;

use headroom_predictor::model::features::{self, Row};
use headroom_predictor::model::gbdt::{fit, Objective, Params};
use headroom_predictor::model::onnx::export;
use headroom_predictor::model::prior::AnalyticPrior;
use headroom_predictor::model::runtime::{init, OnnxModel};

fn rows(n: usize, seed: u64) -> Vec<Row> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 11) as f32 / (1u64 << 53) as f32
    };
    (0..n)
        .map(|_| {
            let mut r = [0f32; features::COUNT];
            let scale = [1.0, 4000.0, 12.0, 128.0, 1.0, 20000.0, 4000.0, 128.0, 300_000.0, 2.0];
            for (v, k) in r.iter_mut().zip(scale) {
                *v = (next() * k).floor();
            }
            r
        })
        .collect()
}

/// A latency-shaped target so trees grow as they would on real data.
fn targets(rows: &[Row]) -> (Vec<f64>, Vec<f64>) {
    rows.iter()
        .map(|r| {
            let f = |i: usize| f64::from(r[i]);
            let ttft = 10.0 + 0.03 * f(6) + 0.03 * f(5) + f(2) * (7.0 + 0.1 * f(3)) + 5.0 * f(9);
            let tpot = 6.8 + 0.024 * f(3) + 65e-6 * f(8) + 4.0 * f(9) + 10.0 * f(0);
            (ttft, tpot)
        })
        .unzip()
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

fn main() -> anyhow::Result<()> {
    init(None)?;
    // BENCH_TREES=N measures a smaller or larger ensemble than the default.
    let trees = std::env::var("BENCH_TREES").ok().and_then(|v| v.parse().ok()).unwrap_or(Params::default().trees);
    let params = Params { trees, ..Params::default() };
    println!(
        "Model: {} trees per target (TTFT, TPOT), depth {}, {} features.\n",
        params.trees,
        params.max_depth,
        features::COUNT
    );

    println!("## Training time (one thread, mean objective and p90)\n");
    println!("| samples | mean objective, both targets | p90 objective, both targets |");
    println!("| --- | --- | --- |");
    let mut model_bytes = Vec::new();
    for n in [5_000usize, 20_000, 50_000] {
        let x = rows(n, n as u64);
        let (t, p) = targets(&x);
        let started = Instant::now();
        let (a, b) = (fit(&x, &t, &params), fit(&x, &p, &params));
        let mean_ms = started.elapsed().as_secs_f64() * 1000.0;
        let q = Params { objective: Objective::Quantile { q: 0.9 }, ..params };
        let started = Instant::now();
        let _ = (fit(&x, &t, &q), fit(&x, &p, &q));
        let p90_ms = started.elapsed().as_secs_f64() * 1000.0;
        println!("| {n} | {mean_ms:.0} ms | {p90_ms:.0} ms |");
        if let (Some(a), Some(b), 20_000) = (a, b, n) {
            model_bytes = export(&a, &b, 1, &[]);
        }
    }
    let model = OnnxModel::load(&model_bytes)?;
    let prior = AnalyticPrior::default();

    println!("\n## Prediction latency per request (all candidates in one call)\n");
    println!("| candidates | ONNX p50 | ONNX p99 | prior p50 | prior p99 | ONNX predictions/s (one thread) |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for n in [8usize, 64, 256] {
        let x = rows(n, 99);
        let iterations = 20_000 / n.max(8) * 8;
        for _ in 0..200 {
            model.predict(&x)?; // warm-up
        }
        let mut onnx_us = Vec::with_capacity(iterations);
        let all = Instant::now();
        for _ in 0..iterations {
            let t = Instant::now();
            std::hint::black_box(model.predict(std::hint::black_box(&x))?);
            onnx_us.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let per_second = (iterations * n) as f64 / all.elapsed().as_secs_f64();
        let mut prior_us = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let t = Instant::now();
            let out: Vec<(f64, f64)> = std::hint::black_box(&x).iter().map(|r| prior.predict(r)).collect();
            std::hint::black_box(out);
            prior_us.push(t.elapsed().as_secs_f64() * 1e6);
        }
        println!(
            "| {n} | {:.0} us | {:.0} us | {:.1} us | {:.1} us | {:.0} |",
            percentile(&mut onnx_us, 0.5),
            percentile(&mut onnx_us, 0.99),
            percentile(&mut prior_us, 0.5),
            percentile(&mut prior_us, 0.99),
            per_second
        );
    }
    Ok(())
}
