//! The model store end to end: cold start, online training, validation,
//! persistence across restarts, corrupt files, user-supplied models.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use headroom_predictor_core::config::ModelConfig;
use headroom_predictor_core::model::features;
use headroom_predictor_core::model::store::{ModelStore, TrainOutcome, PRIOR};
use headroom_protocol::{EndpointState, Observation, Report, RequestFeatures, RouteSource, Slo};

/// The exported models run in plain Rust: these tests need no ONNX Runtime.
fn native() -> std::sync::Arc<dyn headroom_predictor_core::model::runtime::Runtime> {
    std::sync::Arc::new(headroom_predictor_core::model::native::Native)
}

/// The "true" latency of the synthetic world: grows with queue, load and prompt.
fn truth(input: u32, state: &EndpointState) -> (f64, f64) {
    let ttft = 15.0 + 0.05 * f64::from(input) * (1.0 - state.prefix_match) + 40.0 * f64::from(state.waiting);
    let tpot = 7.0 + 0.3 * f64::from(state.running) + 20.0 * state.kv_usage;
    (ttft, tpot)
}

fn observation(i: u64) -> Observation {
    let input = 100 + (i * 7919 % 3000) as u32;
    let state = EndpointState {
        running: (i * 31 % 40) as u32,
        waiting: (i * 17 % 6) as u32,
        kv_usage: (i * 13 % 100) as f64 / 100.0,
        prefix_match: (i % 4) as f64 / 4.0,
        in_flight: (i * 31 % 40) as u32,
        ..Default::default()
    };
    let (ttft, tpot) = truth(input, &state);
    let request = RequestFeatures { input_tokens: input, streaming: true, slo: Slo::default(), ..Default::default() };
    Observation {
        report: Report {
            pool: "p".into(),
            request_id: format!("req-{i}"),
            endpoint: "127.0.0.1:1".into(),
            source: RouteSource::PredictedPositive,
            ttft_ms: Some(ttft),
            tpot_ms: Some(tpot),
            e2e_ms: ttft + 100.0 * tpot,
            output_tokens: Some(100),
            cached_tokens: None,
            status: 200,
            failed_at: None,
        },
        request,
        state_at_dispatch: Some(state),
        predicted_ttft_ms: None,
        predicted_tpot_ms: None,
    }
}

/// The mean objective: these tests judge models by their mean error.
fn config(dir: Option<PathBuf>) -> ModelConfig {
    let objective = "mean".into();
    ModelConfig { data_dir: dir, objective, min_samples: 100, min_new_samples: 50, trees: 60, ..ModelConfig::default() }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("headroom-models-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// MAPE of the store's TTFT and TPOT predictions on fresh synthetic requests.
fn mape(store: &ModelStore) -> (f64, f64) {
    let obs: Vec<Observation> = (100_000..100_300).map(observation).collect();
    let rows: Vec<features::Row> =
        obs.iter().map(|o| store.row(&o.request, o.state_at_dispatch.as_ref().unwrap())).collect();
    let (preds, _) = store.predict(&rows);
    let mut err = (0.0, 0.0);
    for (o, (t, p)) in obs.iter().zip(preds) {
        err.0 += (t - o.report.ttft_ms.unwrap()).abs() / o.report.ttft_ms.unwrap() / 300.0;
        err.1 += (p - o.report.tpot_ms.unwrap()).abs() / o.report.tpot_ms.unwrap() / 300.0;
    }
    err
}

#[test]
fn cold_start_predicts_with_the_prior_then_training_takes_over() {
    let store = ModelStore::open(config(None), native()).unwrap();
    let (preds, name) = store.predict(&[[0.0; features::COUNT]]);
    assert_eq!(name, PRIOR, "before any model, the analytic prior predicts");
    assert!(preds[0].0 > 0.0 && preds[0].1 > 0.0);
    assert_eq!(store.train_if_due(), TrainOutcome::Skipped, "no samples yet");

    let prior_error = mape(&store);
    for i in 0..2000 {
        store.observe(&observation(i));
    }
    let TrainOutcome::Activated(info) = store.train_if_due() else { panic!("expected a model") };
    assert_eq!(store.active_name(), "v1");
    let (ttft, tpot) = mape(&store);
    assert!(ttft < 0.10 && tpot < 0.10, "trained MAPE ttft {ttft:.3} tpot {tpot:.3}");
    assert!(ttft < prior_error.0, "the model beats the prior: {ttft:.3} vs {:.3}", prior_error.0);
    assert!(info.holdout_samples > 100 && info.holdout_mape_ttft.unwrap() < 0.10, "{info:?}");
    let (versions, active) = store.versions();
    assert_eq!((versions.len(), active.as_str()), (1, "v1"));
    let bytes = store.onnx_bytes("v1").unwrap();
    assert!(bytes.len() > 1000);
}

#[test]
fn unusable_observations_are_not_learned_from() {
    let store = ModelStore::open(config(None), native()).unwrap();
    let mut o = observation(1);
    o.report.source = RouteSource::Fallback; // its state came from a stale cache, not a predict call
    assert!(!store.observe(&o));
    let mut o = observation(2);
    o.report.status = 503;
    assert!(!store.observe(&o));
    let mut o = observation(3);
    o.request.streaming = false; // TTFT of a non-streaming response is its e2e
    assert!(!store.observe(&o));
    assert!(store.observe(&observation(4)));
}

#[test]
fn a_restart_keeps_models_and_samples() {
    let dir = temp_dir("restart");
    {
        let store = ModelStore::open(config(Some(dir.clone())), native()).unwrap();
        for i in 0..2000 {
            store.observe(&observation(i));
        }
        assert!(matches!(store.train_if_due(), TrainOutcome::Activated(_)));
        store.persist_samples();
    }
    let store = ModelStore::open(config(Some(dir.clone())), native()).unwrap();
    assert_eq!(store.active_name(), "v1");
    let c = store.sample_counts();
    let (train, holdout) = (c.train, c.holdout);
    assert!(train > 1000 && holdout > 100, "samples restored: {train} / {holdout}");
    let (ttft, _) = mape(&store);
    assert!(ttft < 0.10);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupt_model_file_is_refused_and_the_last_good_one_kept() {
    let dir = temp_dir("corrupt");
    {
        let store = ModelStore::open(config(Some(dir.clone())), native()).unwrap();
        for i in 0..2000 {
            store.observe(&observation(i));
        }
        assert!(matches!(store.train_if_due(), TrainOutcome::Activated(_)));
        for i in 2000..2200 {
            store.observe(&observation(i));
        }
        let second = store.train_if_due();
        assert!(matches!(second, TrainOutcome::Activated(ref info) if info.version == 2), "{second:?}");
    }
    std::fs::write(dir.join("models/v2.onnx"), b"\x08\x01 truncated garbage").unwrap();
    let store = ModelStore::open(config(Some(dir.clone())), native()).unwrap();
    assert_eq!(store.active_name(), "v1", "v2 is corrupt: the last good model serves");
    std::fs::write(dir.join("samples.msgpack"), b"not msgpack").unwrap();
    let store = ModelStore::open(config(Some(dir.clone())), native()).unwrap();
    let c = store.sample_counts();
    assert_eq!((c.train, c.holdout), (0, 0), "corrupt samples are refused, not half-loaded");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_user_supplied_model_replaces_online_training() {
    let dir = temp_dir("user");
    let trained = ModelStore::open(config(None), native()).unwrap();
    for i in 0..2000 {
        trained.observe(&observation(i));
    }
    assert!(matches!(trained.train_if_due(), TrainOutcome::Activated(_)));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mine.onnx");
    std::fs::write(&path, trained.onnx_bytes("v1").unwrap().as_slice()).unwrap();

    let user = ModelStore::open(ModelConfig { model_path: Some(path.clone()), ..config(None) }, native()).unwrap();
    assert!(!user.trains());
    assert_eq!(user.versions().0[0].source, "user");
    assert!(mape(&user).0 < 0.10);
    for i in 0..500 {
        user.observe(&observation(i));
    }
    assert_eq!(user.train_if_due(), TrainOutcome::Skipped, "no online training with a user model");

    std::fs::write(&path, b"garbage").unwrap();
    let err =
        ModelStore::open(ModelConfig { model_path: Some(path), ..config(None) }, native()).err().unwrap().to_string();
    assert!(err.contains("mine.onnx") && err.contains("not a usable ONNX model"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model whose TTFT runs off to infinity for prompts over 5,000 tokens (a region it never
/// trained on) and is sane below: only the bad row is served by the prior, counted, and the
/// other rows of the same call keep the model. One bad row used to send the whole call to
/// the prior.
#[test]
fn one_row_out_of_range_is_served_by_the_prior_alone() {
    use headroom_predictor_core::model::gbdt::{Ensemble, Node};
    let split = vec![
        Node::Split { feature: 1, threshold: 5000.0, left: 1, right: 2 },
        Node::Leaf { value: 0.0 },
        Node::Leaf { value: 1000.0 },
    ];
    let ttft = Ensemble { base: 50f64.ln(), trees: vec![split], offset_feature: None };
    let tpot = Ensemble { base: 9f64.ln(), trees: vec![vec![Node::Leaf { value: 0.0 }]], offset_feature: None };
    let dir = temp_dir("wild");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wild.onnx");
    std::fs::write(&path, headroom_predictor_core::model::onnx::export(&ttft, &tpot, 1, &[])).unwrap();
    let store = ModelStore::open(ModelConfig { model_path: Some(path), ..config(None) }, native()).unwrap();
    let prior = ModelStore::open(config(None), native()).unwrap();

    let state = EndpointState::default();
    let row =
        |input| store.row(&RequestFeatures { input_tokens: input, streaming: true, ..Default::default() }, &state);
    let rows = [row(100), row(9000), row(200)];
    let (served, name) = store.predict(&rows);
    assert_ne!(name, PRIOR, "the model still serves the call");
    assert!((served[0].0 - 50.0).abs() < 0.5 && (served[2].0 - 50.0).abs() < 0.5, "{served:?}");
    assert_eq!(served[1].0, prior.predict(&rows[1..2]).0[0].0, "the bad value is the prior's");
    assert!((served[1].1 - 9.0).abs() < 0.1, "the row's sane TPOT stays the model's: {served:?}");
    assert_eq!(store.substituted.get(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
