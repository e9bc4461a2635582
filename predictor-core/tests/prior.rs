//! The prior's formula and its profiled form, through the feature row the service builds.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use headroom_predictor_config::Profile;
use headroom_predictor_core::model::features::row;
use headroom_predictor_core::model::prior::AnalyticPrior;
use headroom_protocol::{EndpointState, RequestFeatures};

#[test]
fn latency_grows_with_load_and_prompt() {
    let p = AnalyticPrior::default();
    let req = RequestFeatures { input_tokens: 2000, ..Default::default() };
    let idle = p.predict(&row(&req, &EndpointState::default(), &p));
    let busy_state =
        EndpointState { running: 64, in_flight: 64, waiting: 4, tokens_in_flight: 131_072, ..Default::default() };
    let busy = p.predict(&row(&req, &busy_state, &p));
    assert!(busy.0 > idle.0 && busy.1 > idle.1);
    // Calibration anchors (H100, 8B): ~6.8 ms TPOT alone, ~15.6 ms at 64 x 2k context.
    assert!((idle.1 - 6.93).abs() < 0.2, "{idle:?}");
    assert!((busy.1 - 15.5).abs() < 1.0, "{busy:?}");
    let cached = p.predict(&row(&req, &EndpointState { prefix_match: 1.0, ..Default::default() }, &p));
    assert!(cached.0 < idle.0);
}

#[test]
fn prompts_arriving_at_a_server_slow_its_decodes_by_the_share_of_time_they_take() {
    let p = AnalyticPrior { hardware_scale: vec![1.0, 2.0], ..AnalyticPrior::default() };
    let req = RequestFeatures { input_tokens: 500, ..Default::default() };
    let tpot = |rate: f64, class: u32| {
        p.predict(&row(
            &req,
            &EndpointState { prefill_tokens_per_s: rate, hardware_class: class, ..Default::default() },
            &p,
        ))
        .1
    };
    let (quiet, ttft_quiet) = (tpot(0.0, 0), p.predict(&row(&req, &EndpointState::default(), &p)).0);
    // 20k prompt tokens a second at 0.024 ms each: 48% of an H100's time, so the decode
    // steps get 52% of it.
    assert!((tpot(20_000.0, 0) / quiet - 1.0 / 0.52).abs() < 1e-3, "{} vs {quiet}", tpot(20_000.0, 0));
    // An A100 at half the speed spends twice the share on the same prompts.
    assert!((tpot(10_000.0, 1) / tpot(0.0, 1) - 1.0 / 0.52).abs() < 1e-3);
    // Saturated: capped, so the factor stays finite.
    assert!((tpot(1e7, 0) / quiet - 5.0).abs() < 1e-3);
    // TTFT's terms do not read the rate: prompts after this one do not delay its first token.
    let ttft_busy =
        p.predict(&row(&req, &EndpointState { prefill_tokens_per_s: 20_000.0, ..Default::default() }, &p)).0;
    assert_eq!(ttft_busy, ttft_quiet);
}

#[test]
fn a_scaled_hardware_class_is_slower_by_its_factor() {
    let p = AnalyticPrior { hardware_scale: vec![1.0, 1.7], ..AnalyticPrior::default() };
    let req = RequestFeatures { input_tokens: 2000, ..Default::default() };
    let h100 = p.predict(&row(&req, &EndpointState::default(), &p));
    let a100 = p.predict(&row(&req, &EndpointState { hardware_class: 1, ..Default::default() }, &p));
    let unknown = p.predict(&row(&req, &EndpointState { hardware_class: 7, ..Default::default() }, &p));
    assert!((a100.1 / h100.1 - 1.7).abs() < 1e-6, "TPOT {a100:?} vs {h100:?}");
    let engine = |t: (f64, f64)| t.0 - p.overhead_ms;
    assert!((engine(a100) / engine(h100) - 1.7).abs() < 1e-6, "TTFT beyond the API overhead scales");
    assert_eq!(unknown, h100, "a class without a factor runs at the calibration");
}

fn measured() -> Profile {
    use headroom_predictor_config::profile::{Stats, TpotFile, TpotRow, TtftFile, TtftRow};
    let stats = |p50: f64| Stats { mean: p50, p50, ..Default::default() };
    let ttft = TtftFile {
        results: [(16, 40.0), (1024, 240.0)].map(|(n, ms)| TtftRow { tokens_num: n, stats: stats(ms) }).into(),
        ..Default::default()
    };
    let tpot = TpotFile {
        results: [(1, 5.0), (16, 9.0)]
            .map(|(b, ms)| TpotRow { batch_size: b, tokens_per_request: 512, stats: stats(ms) })
            .into(),
        ..Default::default()
    };
    Profile::from_files(&ttft, &tpot).unwrap()
}

#[test]
fn a_profiled_class_takes_its_costs_from_the_profile() {
    let p = AnalyticPrior {
        hardware_scale: vec![1.0, 1.0, 50.0],
        profiles: vec![None, None, Some(measured())],
        ..AnalyticPrior::default()
    };
    let req = RequestFeatures { input_tokens: 1024, ..Default::default() };
    let idle = EndpointState { hardware_class: 2, ..Default::default() };
    let (ttft, tpot) = p.predict(&row(&req, &idle, &p));
    assert_eq!((ttft, tpot), (240.0, 5.0), "the profile's own figures; the class's scale is not applied");
    // Decoding 15 others: each prefill chunk rides a step of that batch, and the request
    // decodes in a batch of 16.
    let busy = EndpointState { running: 15, in_flight: 15, tokens_in_flight: 15 * 512, ..idle.clone() };
    let (ttft, tpot) = p.predict(&row(&req, &busy, &p));
    let step = 5.0 + 4.0 * 14.0 / 15.0;
    assert!((ttft - (240.0 + step)).abs() < 1e-6, "{ttft}");
    assert!((tpot - 9.0).abs() < 0.1, "{tpot}");
    // The pool drains backlog at the profile's cost per prompt token.
    assert!((p.prefill_ms_per_token(2) - 200.0 / 1008.0).abs() < 1e-12);
    // Classes without a profile keep the formula.
    let h100 = p.predict(&row(&req, &EndpointState::default(), &p));
    assert_eq!(h100, AnalyticPrior::default().predict(&row(&req, &EndpointState::default(), &p)));
}
