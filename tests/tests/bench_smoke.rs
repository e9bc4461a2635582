//! A reduced `make bench`: every router, one workload, two short rates on three servers, the
//! rates near the cliff once more with a second seed.
//! Checks the pipeline end to end (stacks, identical traffic, report, chart, raw results);
//! the full comparison runs in `make bench` (docs/benchmark.md).

use std::process::Command;

use headroom_bench::gateway::GatewayResults;
use headroom_bench::{BenchResults, CONTENDERS};
use headroom_stack::locate;

#[test]
fn reduced_bench_writes_report_chart_and_results_for_every_router() {
    let bin = locate::bin_dir().unwrap().join("headroom-bench");
    let base = std::env::temp_dir().join(format!("headroom-bench-smoke-{}", std::process::id()));
    let (run_dir, out) = (base.join("run"), base.join("results"));
    let run = Command::new(&bin)
        .args(["--run-dir", run_dir.to_str().unwrap(), "run", "--workloads", "mixed", "--rates", "6,12"])
        .args(["--step", "2", "--warmup", "1", "--servers", "h100,h100,a100", "--seeds", "2"])
        // mixed is held at half speed by default (`default_lead_in`, `default_time_scale`),
        // which would triple this run's time; two light rates need neither.
        .args(["--lead-in", "0", "--time-scale", "1"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(run.status.success(), "bench failed: {stdout}\n{}", String::from_utf8_lossy(&run.stderr));

    let results: BenchResults = headroom_bench::read_results(&out).unwrap();
    assert_eq!(results.workloads.len(), 1);
    let mixed = &results.workloads[0];
    assert_eq!(mixed.runs.len(), CONTENDERS.len());
    for (run, contender) in mixed.runs.iter().zip(CONTENDERS.iter()) {
        assert_eq!(run.router, contender.name);
        assert!(!run.points.is_empty(), "{} measured nothing", run.router);
        let (rate, first) = &run.points[0];
        assert_eq!(*rate, 6.0);
        assert!(first.requests > 0 && first.attainment > 0.0, "{}: {first:?}", run.router);
        assert!(!first.per_server.is_empty(), "{}: no server named in responses", run.router);
        assert!(first.critical_attainment.is_some(), "{}: no critical attainment", run.router);
        assert!(first.per_class.contains_key("interactive"), "{}: per class {:?}", run.router, first.per_class);
        // Read from Envoy at every measurement; this light load never reaches its caps.
        assert_eq!(first.gateway_overflow, Some(0), "{}: gateway overflows", run.router);
        assert!(first.host_cpu_busy.is_some_and(|b| (0.0..=1.0).contains(&b)), "{}: host CPU", run.router);
    }
    // The rates near the cliff were measured again with another seed, by every router alike.
    let repeated: Vec<Vec<f64>> = mixed.runs.iter().map(|r| r.repeats.iter().map(|p| p.0).collect()).collect();
    assert!(repeated.iter().all(|r| !r.is_empty()), "every router repeats the cliff's rates: {repeated:?}");
    assert_eq!(mixed.profiles, vec!["h100", "h100", "a100"]);
    assert_eq!(mixed.time_scale, Some(1.0), "--time-scale overrides the workload's default");
    assert_eq!(mixed.lead_in_s, 0.0, "--lead-in overrides the workload's default");
    assert!(mixed.command.as_deref().is_some_and(|c| c.contains("--workloads mixed")), "{:?}", mixed.command);
    let ratios = mixed.ratios.clone().expect("the results file carries the headline ratios");
    assert!(ratios.capacity_within_noise.is_some(), "a tie or not, from the seeds: {ratios:?}");
    assert!(ratios.capacity_ratio > 0.0 && ratios.critical_capacity_ratio.is_some_and(|r| r > 0.0), "{ratios:?}");
    // Identical traffic: every router got the same number of requests at the first rate.
    let sent: Vec<usize> = mixed.runs.iter().map(|r| r.points[0].1.requests).collect();
    assert!(sent.windows(2).all(|w| w[0] == w[1]), "different request counts: {sent:?}");

    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## mixed") && report.contains("At equal load"), "{report}");
    assert!(report.contains("capacity") && report.contains("critical capacity"), "{report}");
    assert!(report.contains("By SLO class"), "{report}");
    let predicted = mixed.runs.iter().find(|r| r.router == "headroom predicted").expect("headroom predicted ran");
    assert!(predicted.points[0].1.positive_tier.is_some_and(|t| t.placed > 0), "positive-tier placements counted");
    // At this light load the predictor's answers come in time; plain Envoy places nothing itself.
    assert!(predicted.points[0].1.fallback.is_some_and(|f| f < 0.25), "{:?}", predicted.points[0].1.fallback);
    let plain = mixed.runs.iter().find(|r| r.router == "envoy least request").expect("least request ran");
    assert_eq!(plain.points[0].1.fallback, None);
    assert!(report.contains("Predictor answers: "), "{report}");
    assert!(
        report.contains("Tier precision by requested rate") && report.contains("| headroom predicted | "),
        "{report}"
    );
    assert!(report.contains("Interactive attainment / sheddable requests shed"), "{report}");
    assert!(report.contains("Fleet: 3 simulated servers (2 H100, 1 A100)"), "{report}");
    for c in CONTENDERS {
        assert!(report.contains(&format!("| {} |", c.name)), "{} missing from the report:\n{report}", c.name);
    }
    let svg = std::fs::read_to_string(out.join("mixed.svg")).unwrap();
    // All requests beside the critical classes: a line per router in each panel.
    assert_eq!(svg.matches(r#"class="series""#).count(), 2 * CONTENDERS.len());
    assert!(svg.contains("critical classes"));
    let raw = std::fs::read_dir(out.join("requests")).unwrap().count();
    assert!(raw >= CONTENDERS.len(), "per-request results: {raw} files");
    // Headroom's measurements keep the predictor's observations beside them, each with the
    // state it saw at dispatch.
    let observations = out.join("observations").join("mixed-headroom-predicted-6.jsonl");
    let first = std::fs::read_to_string(&observations).unwrap_or_default();
    let first: serde_json::Value = serde_json::from_str(first.lines().next().unwrap_or("")).unwrap_or_default();
    assert!(first["state_at_dispatch"].is_object(), "{}: {first}", observations.display());
    assert!(!out.join("observations").join("mixed-envoy-least-request-6.jsonl").exists(), "plain Envoy has none");
    let _ = std::fs::remove_dir_all(&base);
}

/// A reduced `make bench-gateway`: every phase runs and fills its table, the streaming one
/// included (its figures are the filter's cost per streamed token; docs/performance.md).
#[test]
fn reduced_gateway_bench_measures_latency_throughput_and_streaming() {
    let bin = locate::bin_dir().unwrap().join("headroom-bench");
    let base = std::env::temp_dir().join(format!("headroom-gateway-smoke-{}", std::process::id()));
    let (run_dir, out) = (base.join("run"), base.join("results"));
    let run = Command::new(&bin)
        .args(["--run-dir", run_dir.to_str().unwrap(), "gateway", "--requests", "20", "--rounds", "1"])
        .args(["--connections", "2,4", "--seconds", "1", "--throughput-rounds", "1"])
        .args(["--stream-tokens", "16", "--stream-connections", "4", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(run.status.success(), "gateway bench failed: {stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let r: GatewayResults = serde_json::from_str(&std::fs::read_to_string(out.join("gateway.json")).unwrap()).unwrap();
    assert_eq!(r.latency.len(), 5, "four paths and the endpoint picker's");
    assert!(r.epp_added_p50_ms.is_finite() && r.epp_added_p99_ms.is_finite(), "{:?}", r.latency);
    assert!(r.latency.iter().all(|l| l.errors == 0 && l.p50_us > 0.0), "{:?}", r.latency);
    assert_eq!(r.throughput.len(), 6, "3 paths at 2 connection counts");
    assert_eq!(r.throughput_share_by_connections.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [2, 4]);
    assert!(r.throughput_share.is_finite() && r.throughput_share > 0.0);
    assert!(r.throughput.iter().all(|t| t.errors == 0 && t.requests_per_s > 0.0), "{:?}", r.throughput);
    assert_eq!((r.stream_tokens, r.stream.len()), (16, 2));
    for s in &r.stream {
        assert!(s.errors == 0 && s.tokens_per_s > 0.0, "{s:?}");
        assert!(s.envoy_us_per_token.is_finite() && s.envoy_us_per_token > 0.0, "{s:?}");
    }
    assert!(r.stream_added_us_per_token.is_finite(), "{}", r.stream_added_us_per_token);
    let md = std::fs::read_to_string(out.join("gateway.md")).unwrap();
    assert!(md.contains("## Streaming") && md.contains("per token"), "{md}");
    let _ = std::fs::remove_dir_all(&base);
}
