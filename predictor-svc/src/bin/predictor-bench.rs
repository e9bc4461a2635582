//! `cargo run --release -p headroom-predictor --bin predictor-bench`
//!
//! Prediction latency of the trained ONNX model for 8 / 64 / 256 candidates
//! (one batched `Session::run`, one intra-op thread), predictions per second,
//! and training time for 5k / 20k / 50k samples. The analytic prior runs in the
//! same invocation as a baseline. Then the service's own predict path
//! (`ModelStore::predict`, 64 candidates) on one thread, idle and while another
//! thread runs training rounds back to back (fit, score the holdout, swap), the
//! idle figures the baseline. Prints markdown tables.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_predictor::ort::Ort;
use headroom_predictor_core::model::features::{self, Row};
use headroom_predictor_core::model::gbdt::{fit, Ensemble, Objective, Params};
use headroom_predictor_core::model::onnx::export;
use headroom_predictor_core::model::prior::AnalyticPrior;
use headroom_predictor_core::model::runtime;
use headroom_predictor_core::model::store::{ModelStore, TrainOutcome};
use headroom_protocol::Observation;

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
    // BENCH_SECTION=training runs the last section alone (unpinned: it wants two cores);
    // BENCH_SECTION=fit the first.
    if std::env::var("BENCH_SECTION").is_ok_and(|s| s == "training") {
        return during_training();
    }
    // BENCH_TREES=N measures a smaller or larger ensemble than the default.
    let trees = std::env::var("BENCH_TREES").ok().and_then(|v| v.parse().ok()).unwrap_or(Params::default().trees);
    let params = Params { trees, ..Params::default() };
    println!(
        "Model: {} trees per target (TTFT, TPOT), depth {}, {} features.\n",
        params.trees,
        params.max_depth,
        features::COUNT
    );
    let model_bytes = training_time(&params);
    // BENCH_SECTION=fit stops after the training times.
    if std::env::var("BENCH_SECTION").is_ok_and(|s| s == "fit") {
        return Ok(());
    }
    let ort = Ort::init(None)?;
    let model = runtime::load(&ort, &model_bytes)?;
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
    during_training()
}

/// Fits of 5k / 20k / 50k samples, timed (the fastest of three) and fingerprinted: a change
/// meant to leave the trees as they were shows the same fingerprints. Returns the 20k model.
fn training_time(params: &Params) -> Vec<u8> {
    println!("## Training time (one thread, mean objective and p90; fastest of 3)\n");
    println!("| samples | mean objective, both targets | p90 objective, both targets | fingerprint |");
    println!("| --- | --- | --- | --- |");
    let mut model_bytes = Vec::new();
    let fastest = |f: &dyn Fn() -> (Option<Ensemble>, Option<Ensemble>)| {
        let mut best = f64::INFINITY;
        let mut fitted = (None, None);
        for _ in 0..3 {
            let started = Instant::now();
            fitted = f();
            best = best.min(started.elapsed().as_secs_f64() * 1000.0);
        }
        (best, fitted)
    };
    for n in [5_000usize, 20_000, 50_000] {
        let x = rows(n, n as u64);
        let (t, p) = targets(&x);
        let (mean_ms, (a, b)) = fastest(&|| (fit(&x, &t, params), fit(&x, &p, params)));
        let q = Params { objective: Objective::Quantile { q: 0.9 }, ..*params };
        let (p90_ms, (qa, qb)) = fastest(&|| (fit(&x, &t, &q), fit(&x, &p, &q)));
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&format!("{a:?}{b:?}{qa:?}{qb:?}"), &mut hash);
        let fingerprint = std::hash::Hasher::finish(&hash);
        println!("| {n} | {mean_ms:.0} ms | {p90_ms:.0} ms | {fingerprint:016x} |");
        if let (Some(a), Some(b), 20_000) = (a, b, n) {
            model_bytes = export(&a, &b, 1, &[]);
        }
    }
    model_bytes
}

/// A report the store learns from: latency follows the queue and the prompt.
fn observation(i: u64) -> anyhow::Result<Observation> {
    let (running, waiting, input) = (i % 31, i % 7, 50 + (i * 37) % 3000);
    let ttft = 20.0 + 0.05 * input as f64 + 15.0 * waiting as f64 + 0.5 * running as f64;
    let tpot = 7.0 + 0.3 * running as f64;
    let value = serde_json::json!({"pool": "p", "request_id": format!("r{i}"), "endpoint": "e:1",
        "request": {"model": "m", "input_tokens": input, "streaming": true, "max_tokens": 100},
        "state_at_dispatch": {"running": running, "waiting": waiting, "kv_usage": (i % 10) as f64 / 10.0,
            "prefix_match": 0.0, "in_flight": running + waiting, "uncached_tokens_in_flight": input,
            "tokens_in_flight": input * (running + 1)},
        "source": "predicted_positive", "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": ttft + 100.0 * tpot,
        "output_tokens": 100, "status": 200});
    Ok(serde_json::from_value(value)?)
}

/// `ModelStore::predict` of 64 candidates for `for_how_long`, timed each (us); with `only_while`,
/// only the calls made while it is set count.
fn predict_latencies(store: &ModelStore, for_how_long: Duration, only_while: Option<&AtomicBool>) -> Vec<f64> {
    let x = rows(64, 7);
    let mut us = Vec::new();
    let started = Instant::now();
    while started.elapsed() < for_how_long {
        let counts = only_while.is_none_or(|f| f.load(Ordering::Relaxed));
        let t = Instant::now();
        std::hint::black_box(store.predict(std::hint::black_box(&x)));
        let took = t.elapsed().as_secs_f64() * 1e6;
        if counts && only_while.is_none_or(|f| f.load(Ordering::Relaxed)) {
            us.push(took);
        }
    }
    us
}

/// The service's predict path, idle and while training rounds run on another thread.
fn during_training() -> anyhow::Result<()> {
    let config = headroom_predictor::config::ModelConfig { min_new_samples: 20, ..Default::default() };
    let store = Arc::new(ModelStore::open(config, Arc::new(Ort::init(None)?))?);
    for i in 0..20_000 {
        store.observe(&observation(i)?);
    }
    let first = store.train_if_due();
    anyhow::ensure!(matches!(first, TrainOutcome::Activated(_)), "the bench store trained no model: {first:?}");
    let counts = store.sample_counts();
    println!(
        "\n## Predict latency (`ModelStore::predict`, 64 candidates) while training rounds run\n\n\
         {} training and {} held-out samples; one thread predicts while another trains back to back.\n",
        counts.train, counts.holdout
    );
    println!("| phase | calls | p50 | p99 | max |");
    println!("| --- | --- | --- | --- | --- |");
    let row = |phase: &str, mut us: Vec<f64>| {
        let n = us.len();
        let max = us.iter().copied().fold(0.0, f64::max);
        println!(
            "| {phase} | {n} | {:.0} us | {:.0} us | {max:.0} us |",
            percentile(&mut us, 0.5),
            percentile(&mut us, 0.99)
        );
    };
    row("idle", predict_latencies(&store, Duration::from_secs(3), None));
    let training = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let trainer = {
        let (store, training, stop) = (store.clone(), training.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0;
            let mut next = 20_000;
            while !stop.load(Ordering::Relaxed) {
                for o in (next..next + 50).filter_map(|i| observation(i).ok()) {
                    store.observe(&o);
                }
                next += 50;
                training.store(true, Ordering::Relaxed);
                store.train_if_due();
                training.store(false, Ordering::Relaxed);
                rounds += 1;
            }
            rounds
        })
    };
    let during = predict_latencies(&store, Duration::from_secs(10), Some(&training));
    stop.store(true, Ordering::Relaxed);
    let rounds = trainer.join().map_err(|_| anyhow::anyhow!("the training thread panicked"))?;
    row(&format!("during {rounds} training rounds"), during);
    Ok(())
}
