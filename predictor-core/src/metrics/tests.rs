//! The metrics' unit tests.

use super::*;
use headroom_protocol::RequestFeatures;

fn placed(source: RouteSource, slo_ttft: f64, ttft: f64) -> Observation {
    let mut request = RequestFeatures { streaming: true, ..Default::default() };
    request.slo.ttft_ms = Some(slo_ttft);
    Observation {
        report: Report {
            pool: "p".into(),
            request_id: "r".into(),
            endpoint: "e:1".into(),
            source,
            ttft_ms: Some(ttft),
            tpot_ms: None,
            e2e_ms: ttft,
            output_tokens: Some(1),
            cached_tokens: None,
            status: 200,
            failed_at: None,
        },
        request,
        state_at_dispatch: None,
        predicted_ttft_ms: Some(100.0),
        predicted_tpot_ms: None,
    }
}

fn gauge(m: &Metrics, name: &str) -> f64 {
    let text = m.render();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

#[test]
fn tier_precision_and_recall_judge_placements_by_their_outcome() {
    let m = Metrics::default();
    // Three positive placements, two met; one negative placement that met anyway.
    m.observed(&placed(RouteSource::PredictedPositive, 500.0, 300.0));
    m.observed(&placed(RouteSource::PredictedPositive, 500.0, 450.0));
    m.observed(&placed(RouteSource::PredictedPositive, 500.0, 900.0));
    m.observed(&placed(RouteSource::PredictedNegative, 500.0, 200.0));
    // Not a tier placement: ignored.
    m.observed(&placed(RouteSource::Fallback, 500.0, 900.0));
    assert!((gauge(&m, "headroom_tier_precision") - 2.0 / 3.0).abs() < 1e-9);
    assert!((gauge(&m, "headroom_tier_recall") - 2.0 / 3.0).abs() < 1e-9);
}

/// The value of the series `name{labels}` exactly as rendered, NaN when absent.
fn series(m: &Metrics, name_and_labels: &str) -> f64 {
    let text = m.render();
    let line = text.lines().find(|l| l.starts_with(&format!("{name_and_labels} "))).unwrap_or_default();
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

#[test]
fn the_objective_families_carry_llm_ds_model_labels_and_split_violations_by_type() {
    let m = Metrics::default();
    m.model_served("llama");
    let mut o = placed(RouteSource::PredictedPositive, 100.0, 300.0);
    o.request.model = "llama".into();
    o.request.slo.tpot_ms = Some(10.0);
    o.report.tpot_ms = Some(20.0);
    o.report.output_tokens = Some(10);
    m.observed(&o);
    let mut failed = o.clone();
    failed.report.status = 503;
    m.observed(&failed);
    let model = r#"model_name="llama",target_model_name="llama""#;
    assert_eq!(series(&m, &format!("inference_objective_request_total{{{model}}}")), 2.0);
    assert_eq!(series(&m, &format!(r#"inference_objective_request_error_total{{{model},error_code="503"}}"#)), 1.0);
    for kind in ["ttft", "tpot"] {
        let name = format!(r#"inference_objective_request_slo_violation_total{{{model},type="{kind}_slo_violation"}}"#);
        assert_eq!(series(&m, &name), 1.0, "{name}");
    }
    assert_eq!(series(&m, &format!("inference_objective_request_ttft_seconds_count{{{model}}}")), 1.0);
    assert_eq!(series(&m, &format!("inference_objective_request_predicted_ttft_seconds_count{{{model}}}")), 1.0);
    assert_eq!(series(&m, &format!("inference_objective_request_duration_seconds_count{{{model}}}")), 1.0);
    assert_eq!(series(&m, &format!("inference_objective_input_tokens_count{{{model}}}")), 2.0);
    assert_eq!(series(&m, &format!("inference_objective_output_tokens_sum{{{model}}}")), 10.0);
    let judged = r#"headroom_slo_requests_total{pool="p",priority="0",result="missed"}"#;
    assert_eq!(series(&m, judged), 1.0, "one judged request, TTFT and TPOT both missed; the 503 is not judged");
    let ntpot = series(&m, &format!("inference_objective_normalized_time_per_output_token_seconds_sum{{{model}}}"));
    assert!((ntpot - 0.03).abs() < 1e-9, "300 ms over 10 tokens: {ntpot}");
}

#[test]
fn only_served_model_names_get_series_and_invented_ones_share_one() {
    let m = Metrics::default();
    m.model_served("llama");
    for i in 0..3_000 {
        let mut o = placed(RouteSource::Fallback, 500.0, 100.0);
        o.request.model = format!("made-up-{i}");
        m.observed(&o);
    }
    let mut real = placed(RouteSource::Fallback, 500.0, 100.0);
    real.request.model = "llama".into();
    m.observed(&real);
    let text = m.render();
    let families = text.lines().filter(|l| l.starts_with("inference_objective_request_total{")).count();
    assert_eq!(families, 2, "the served model and other");
    let other = r#"inference_objective_request_total{model_name="other",target_model_name="other"}"#;
    assert_eq!(series(&m, other), 3_000.0);
    let llama = r#"inference_objective_request_total{model_name="llama",target_model_name="llama"}"#;
    assert_eq!(series(&m, llama), 1.0, "a model served after invented names still gets its series");
    // Servers listing more names than the bound: the first ones served keep theirs.
    for i in 0..MAX_MODEL_SERIES + 10 {
        m.model_served(&format!("served-{i}"));
    }
    let mut late = placed(RouteSource::Fallback, 500.0, 100.0);
    late.request.model = format!("served-{}", MAX_MODEL_SERIES + 5);
    m.observed(&late);
    assert_eq!(series(&m, other), 3_001.0);
}

#[test]
fn attainment_counts_judged_requests_by_priority_bounded() {
    let m = Metrics::default();
    for priority in 0..MAX_PRIORITY_SERIES as i32 + 3 {
        let mut o = placed(RouteSource::PredictedPositive, 500.0, 100.0);
        o.request.priority = priority;
        m.observed(&o);
    }
    let mut unjudged = placed(RouteSource::PredictedPositive, 500.0, 100.0);
    unjudged.request.slo.ttft_ms = None;
    m.observed(&unjudged);
    let met = |p: &str| series(&m, &format!(r#"headroom_slo_requests_total{{pool="p",priority="{p}",result="met"}}"#));
    assert_eq!(met("0"), 1.0, "the request without an SLO is not judged");
    assert_eq!(met("15"), 1.0);
    assert_eq!(met("other"), 3.0);
}

#[test]
fn pool_gauges_follow_the_pools_and_their_endpoints() {
    let m = Metrics::default();
    let gauges = PoolGauges {
        ready: 2,
        kv_usage: 0.5,
        waiting: 1.5,
        running: 4.0,
        waiting_by_endpoint: vec![("10.0.0.1:8000".into(), 1), ("10.0.0.2:8000".into(), 2)],
    };
    m.set_pools(&[("llama".into(), gauges.clone())]);
    assert_eq!(series(&m, r#"inference_pool_ready_pods{name="llama"}"#), 2.0);
    assert_eq!(series(&m, r#"inference_pool_average_kv_cache_utilization{name="llama"}"#), 0.5);
    assert_eq!(series(&m, r#"inference_pool_average_queue_size{name="llama"}"#), 1.5);
    assert_eq!(series(&m, r#"inference_pool_average_running_requests{name="llama"}"#), 4.0);
    let pod = r#"inference_pool_per_pod_queue_size{name="llama",model_server_pod="10.0.0.2:8000"}"#;
    assert_eq!(series(&m, pod), 2.0);
    // An endpoint leaves: its series goes.
    m.set_pools(&[(
        "llama".into(),
        PoolGauges { waiting_by_endpoint: gauges.waiting_by_endpoint[..1].to_vec(), ..gauges },
    )]);
    assert!(series(&m, pod).is_nan());
}

/// Every scrape says which build answers it, as the picker's does: a rollout's two
/// releases tell apart on one dashboard.
#[test]
fn the_build_is_a_series() {
    let m = Metrics::default();
    let version = headroom_protocol::build::VERSION;
    let line = format!(r#"headroom_build_info{{component="predictor",version="{version}"}}"#);
    assert_eq!(series(&m, &line), 1.0, "{}", m.render());
}
