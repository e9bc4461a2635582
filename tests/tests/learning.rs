//! The learning loop through the real stack: reports from Envoy traffic become
//! samples, a trained ONNX model replaces the prior, and survives a restart.

use std::time::Duration;

use headroom_e2e::{wait_until, Harness, StackOptions};
use headroom_loadgen::runner::{self, Target};
use headroom_loadgen::workload::{self, RequestSpec, SloClass};
use serde_json::json;

fn predict_model_version(h: &Harness) -> String {
    let body =
        json!({"pool": "default", "request_id": "probe", "request": {"model": "sim-llama-8b", "input_tokens": 500}});
    h.predict(&body)["model_version"].as_str().unwrap_or("").to_string()
}

#[test]
fn traffic_trains_a_model_that_takes_over_and_survives_a_restart() {
    // A100 servers behind a prior left at H100's costs (2.7x fast) and without its live
    // correction: the prior a model must beat on the holdout to take over (an accurate
    // prior is rightly kept). The stack's own prior, scaled for A100 and corrected live, is
    // the simulator's formula: a model beat it on 6 runs of 7, so this test, which is about
    // the loop (reports, training, takeover, restore), failed on the seventh.
    let opts = StackOptions {
        profiles: vec!["a100".into(); 3],
        predictor_tweak: |c| {
            c.model.prior_hardware_scale.clear();
            c.model.calibration_rate = 0.0;
        },
        ..Default::default()
    };
    let mut h = Harness::start_opts(opts).unwrap();
    assert_eq!(predict_model_version(&h), "analytic-prior", "cold start: the prior predicts");

    let class = SloClass { name: "t".into(), ttft_ms: Some(2000.0), tpot_ms: Some(200.0), priority: 0 };
    let work: Vec<RequestSpec> = (0..330)
        .map(|i| RequestSpec {
            at_s: f64::from(i) / 40.0,
            prompt_tokens: 50 + (i * 37 % 900) as u32,
            max_tokens: 8 + (i % 16) as u32,
            stream: true,
            class: class.clone(),
            shared_prefix: None,
            conversation: None,
            run: 0,
        })
        .collect();
    let target = Target {
        url: h.gateway(),
        model: "sim-llama-8b".into(),
        slo_headers: true,
        prediction_based: Some(true),
        timeout: Duration::from_secs(60),
    };
    let outcomes = tokio::runtime::Runtime::new().unwrap().block_on(runner::run(&target, &work)).unwrap();
    assert!(outcomes.iter().all(|o| o.status == 200), "every request served");

    let models = |h: &Harness| h.get(&format!("{}/v1/models", h.predictor())).map(|r| r.json()).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(20), || models(&h)["active"].as_str().is_some_and(|a| a.starts_with('v'))),
        "no model was trained from the traffic: {}",
        models(&h)
    );
    let active = models(&h)["active"].as_str().unwrap().to_string();
    assert_eq!(predict_model_version(&h), active, "predictions now come from the trained model");
    let v = &models(&h)["versions"][0];
    assert!(v["train_samples_ttft"].as_u64() >= Some(200) && v["holdout_samples"].as_u64() > Some(0), "{v}");
    let url = format!("{}/v1/models/{active}.onnx", h.predictor());
    assert_eq!(h.get(&url).unwrap().status, 401, "model downloads need the token");
    let onnx = h.http.get(&url).bearer_auth(h.stack.state.token.as_deref().unwrap()).send().unwrap();
    assert_eq!(onnx.status(), 200);
    assert!(onnx.bytes().unwrap().len() > 1000, "the model downloads as ONNX");

    // Let training catch up before the restart: every request's sample filed and fewer
    // than `min_new_samples` (50) left unused. Otherwise the restarted predictor rightly
    // trains on the pending ones at once, and what it serves would not show the restore.
    // Counted by `filed`, not the reservoirs' sizes: a drift round forgets the samples of
    // the regime before it (the test's CI failure: 221 kept of 330 filed).
    let settled = wait_until(Duration::from_secs(20), || {
        let s = &models(&h)["samples"];
        s["filed"].as_u64() == Some(work.len() as u64) && s["since_training"].as_u64().is_some_and(|n| n < 50)
    });
    if !settled {
        let metrics = h.get(&format!("{}/metrics", h.predictor())).map(|r| r.body).unwrap_or_default();
        let reports: Vec<&str> = metrics.lines().filter(|l| l.starts_with("headroom_reports_total")).collect();
        panic!("samples never settled: {} ({reports:?})", models(&h)["samples"]);
    }
    let active = models(&h)["active"].as_str().unwrap().to_string();

    let now_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    h.stack.stop_predictor();
    let stopped_at = now_ms();
    h.stack.start_predictor().unwrap();
    let after = models(&h);
    let restored = after["active"].as_str().unwrap_or("").to_string();
    let version = |name: &str| name.trim_start_matches('v').parse::<u64>().unwrap_or(0);
    assert!(version(&restored) >= version(&active), "the model survives a restart: {after}");
    let info = after["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["version"].as_u64() == Some(version(&restored)))
        .cloned();
    assert!(
        info.is_some_and(|i| i["created_unix_ms"].as_u64() < Some(stopped_at)),
        "the active model was restored from disk, not retrained: {after}"
    );
    assert_eq!(predict_model_version(&h), restored);
    assert!(models(&h)["samples"]["train"].as_u64() >= Some(200), "samples survive a restart: {}", models(&h));
}

/// A hardware class the analytic prior knows nothing of starts from its measured profile:
/// the simulated A100 at half speed prefills about five times slower than the H100 real-time
/// formula the prior holds when no `prior_hardware_scale` is set (as here). With the profile
/// the stack measured, the first prediction of a 2,000-token prompt, before any traffic, is
/// within a quarter of what the request then takes through the gateway; ignoring the profile
/// predicts a fifth of it.
#[test]
fn a_measured_profile_is_the_prior_of_a_class_from_the_first_request() {
    let opts = StackOptions {
        profiles: vec!["a100".into(); 2],
        profile: true,
        time_scale: 0.5,
        predictor_tweak: |c| c.model.prior_hardware_scale.clear(),
        ..Default::default()
    };
    let h = Harness::start_opts(opts).unwrap();
    let body = json!({"pool": "default", "request_id": "probe",
        "request": {"model": "sim-llama-8b", "input_tokens": 2000}});
    let answer = h.predict(&body);
    assert_eq!(answer["model_version"], "analytic-prior", "no traffic yet: {answer}");
    let predicted: Vec<f64> =
        answer["endpoints"].as_array().into_iter().flatten().filter_map(|e| e["ttft_ms"].as_f64()).collect();
    assert_eq!(predicted.len(), 2, "{answer}");

    // The same prompt, streamed through the gateway to an idle fleet: its TTFT as a client sees it.
    let class = SloClass { name: "t".into(), ttft_ms: None, tpot_ms: None, priority: 0 };
    let work: Vec<RequestSpec> = (0..3)
        .map(|i| RequestSpec { run: 1 + i as u32, ..workload::spec(f64::from(i), 2000, 4, true, class.clone()) })
        .collect();
    let target = Target {
        url: h.gateway(),
        model: "sim-llama-8b".into(),
        slo_headers: false,
        prediction_based: None,
        timeout: Duration::from_secs(30),
    };
    let outcomes = tokio::runtime::Runtime::new().unwrap().block_on(runner::run(&target, &work)).unwrap();
    let mut measured: Vec<f64> = outcomes.iter().filter_map(|o| o.ttft_ms).collect();
    assert_eq!(measured.len(), 3, "{outcomes:?}");
    measured.sort_by(f64::total_cmp);
    let median = measured[1];
    for p in predicted {
        assert!((p / median - 1.0).abs() < 0.25, "predicted {p:.0} ms, measured {median:.0} ms ({measured:?})");
    }
}
