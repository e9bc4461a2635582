//! `headroom-stack up | down | demo`: the local stack behind `make up`, `make down`, `make demo`.

use std::time::Duration;

use clap::{Parser, Subcommand};
use headroom_loadgen::{report, runner, workload};
use headroom_stack::{locate, Router, Stack, StackOptions, StackState};

#[derive(Parser)]
#[command(about = "Run the local headroom stack")]
struct Args {
    /// Where configs, logs and the pid record go.
    #[arg(long, global = true)]
    run_dir: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start Envoy + filter + predictor + 3 simulated servers in the background.
    Up,
    /// Stop exactly what `up` started.
    Down,
    /// Start the stack, send mixed SLO traffic, print a table, stop the stack.
    Demo {
        /// Seconds of traffic.
        #[arg(long, default_value_t = 60.0)]
        duration: f64,
        /// Mean requests per second (30 loads 3 simulated H100s enough for the classes to differ).
        #[arg(long, default_value_t = 30.0)]
        rate: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Compare routers on the identical request sequence: plain Envoy round robin and
    /// least request, headroom with prediction off (composite) and on.
    Bench {
        /// Comma-separated workloads (mixed, short-long, long-short, shared-prefix, azure).
        #[arg(long, default_value = "mixed,shared-prefix")]
        workloads: String,
        /// Mean requests per second (azure: the trace's own rate times --speedup).
        #[arg(long, default_value_t = 40.0)]
        rate: f64,
        /// Seconds of measured traffic per router and workload.
        #[arg(long, default_value_t = 60.0)]
        duration: f64,
        /// Seconds of traffic (another seed) before measuring headroom, so its models are trained.
        #[arg(long, default_value_t = 30.0)]
        warmup: f64,
        /// Trace replay speed-up (azure).
        #[arg(long, default_value_t = 8.0)]
        speedup: f64,
        /// Where the report and per-request results go.
        #[arg(long, default_value = "results")]
        out: std::path::PathBuf,
    },
    /// Measure prediction accuracy on simulator traffic through the real stack,
    /// then after a workload shift (docs/predictor.md).
    Accuracy {
        /// Seconds of mixed traffic before the shift.
        #[arg(long, default_value_t = 120.0)]
        warmup: f64,
        /// Seconds of prefill-heavy traffic after the shift.
        #[arg(long, default_value_t = 90.0)]
        shift: f64,
        #[arg(long, default_value_t = 15.0)]
        rate: f64,
        /// Training objective: mean or p90.
        #[arg(long, default_value = "mean")]
        objective: String,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let run_dir = args.run_dir.unwrap_or_else(|| locate::root().join(".run"));
    match args.command {
        Cmd::Up => {
            if let Some(old) = StackState::load(&run_dir)? {
                let stopped = old.stop_all(&run_dir);
                if stopped > 0 {
                    println!("stopped {stopped} processes of a previous `make up`");
                }
            }
            let stack = Stack::start(StackOptions { run_dir: run_dir.clone(), attached: false, ..Default::default() })?;
            let state = stack.detach();
            println!("gateway: http://{}", state.gateway);
            println!("predictor: http://{}", state.predictor);
            for s in &state.servers {
                println!("server: http://{s}");
            }
            println!("envoy admin: http://{}", state.admin);
            println!("logs: {}", run_dir.display());
            println!(
                "try: curl -si http://{}/v1/completions -H 'content-type: application/json' -H 'x-slo-ttft-ms: 500' \
                 -H 'x-slo-tpot-ms: 50' -d '{{\"model\":\"sim-llama-8b\",\"prompt\":\"Hello\",\"max_tokens\":8}}'",
                state.gateway
            );
            println!("stop with: make down");
        }
        Cmd::Down => match StackState::load(&run_dir)? {
            Some(state) => println!("stopped {} processes", state.stop_all(&run_dir)),
            None => println!("nothing to stop (no {}/stack.json)", run_dir.display()),
        },
        Cmd::Demo { duration, rate, seed } => {
            let stack = Stack::start(StackOptions { run_dir: run_dir.clone(), ..Default::default() })?;
            println!(
                "stack up: gateway http://{}, {} simulated H100 servers",
                stack.state.gateway,
                stack.state.servers.len()
            );
            println!("sending {duration:.0} s of mixed traffic at {rate} req/s (interactive / batch / sheddable SLO classes)...");
            let work = workload::mixed(seed, rate, duration);
            let target = gateway_target(&stack, Some(true));
            let runtime = tokio::runtime::Runtime::new()?;
            let outcomes = runtime.block_on(runner::run(&target, &work))?;
            println!();
            print!("{}", report::table(&outcomes));
            drop(stack);
            println!("\nstack stopped");
        }
        Cmd::Accuracy { warmup, shift, rate, objective } => accuracy(&run_dir, warmup, shift, rate, &objective)?,
        Cmd::Bench { workloads, rate, duration, warmup, speedup, out } => {
            bench(&run_dir, &workloads, rate, duration, warmup, speedup, &out)?
        }
    }
    Ok(())
}

/// Clients of the stack's gateway: the simulated model, SLO headers on.
fn gateway_target(stack: &Stack, prediction_based: Option<bool>) -> runner::Target {
    runner::Target {
        url: format!("http://{}", stack.state.gateway),
        model: "sim-llama-8b".into(),
        slo_headers: true,
        prediction_based,
        timeout: Duration::from_secs(120),
    }
}

/// One line of the accuracy log: time, phase, active model, live MAPE and coverage.
fn accuracy_sample(stack: &Stack, started: std::time::Instant, phase: &str) -> String {
    let metrics = headroom_stack::http::get(stack.state.predictor, "/metrics").map(|r| r.1).unwrap_or_default();
    let value = |name: &str, target: &str| {
        let key = format!("{name}{{target=\"{target}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse::<f64>().ok())
    };
    let models = headroom_stack::http::get(stack.state.predictor, "/v1/models").map(|r| r.1).unwrap_or_default();
    let models: serde_json::Value = serde_json::from_str(&models).unwrap_or_default();
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
    format!(
        "| {:>4.0} s | {phase} | {} | {} | {} | {} | {} | {} |",
        started.elapsed().as_secs_f64(),
        models["active"].as_str().unwrap_or("?"),
        models["samples"]["train"],
        pct(value("headroom_live_mape", "ttft")),
        pct(value("headroom_live_mape", "tpot")),
        pct(value("headroom_live_coverage", "ttft")),
        pct(value("headroom_live_coverage", "tpot")),
    )
}

fn accuracy(run_dir: &std::path::Path, warmup: f64, shift: f64, rate: f64, objective: &str) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(run_dir.join("predictor-data"));
    let profiles = vec!["h100".to_string(), "h100".to_string(), "a100".to_string()];
    let opts = StackOptions {
        run_dir: run_dir.to_path_buf(),
        profiles,
        objective: objective.to_string(),
        ..Default::default()
    };
    let stack = Stack::start(opts)?;
    println!("stack up: 2 simulated H100 + 1 A100, objective {objective}, {rate} req/s\n");
    println!(
        "| time | phase | model | train samples | live MAPE TTFT | live MAPE TPOT | coverage TTFT | coverage TPOT |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let target = gateway_target(&stack, Some(true));
    let runtime = tokio::runtime::Runtime::new()?;
    let started = std::time::Instant::now();
    for (phase, work) in
        [("mixed", workload::mixed(7, rate, warmup)), ("shifted", workload::long_prompts(8, rate / 2.0, shift))]
    {
        let t = target.clone();
        let traffic = runtime.spawn(async move { runner::run(&t, &work).await });
        while !traffic.is_finished() {
            std::thread::sleep(Duration::from_secs(10));
            println!("{}", accuracy_sample(&stack, started, phase));
        }
        let _ = runtime.block_on(traffic);
    }
    std::thread::sleep(Duration::from_secs(3));
    println!("{}", accuracy_sample(&stack, started, "end"));
    let models = headroom_stack::http::get(stack.state.predictor, "/v1/models").map(|r| r.1).unwrap_or_default();
    let models: serde_json::Value = serde_json::from_str(&models).unwrap_or_default();
    println!("\nmodel versions (held-out error at training time):\n");
    println!("| version | train samples TTFT/TPOT | holdout | holdout MAPE TTFT | holdout MAPE TPOT | coverage TTFT | coverage TPOT | train ms |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let pct = |v: &serde_json::Value| v.as_f64().map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
    for v in models["versions"].as_array().cloned().unwrap_or_default() {
        println!(
            "| v{} | {}/{} | {} | {} | {} | {} | {} | {} |",
            v["version"],
            v["train_samples_ttft"],
            v["train_samples_tpot"],
            v["holdout_samples"],
            pct(&v["holdout_mape_ttft"]),
            pct(&v["holdout_mape_tpot"]),
            pct(&v["holdout_coverage_ttft"]),
            pct(&v["holdout_coverage_tpot"]),
            v["train_ms"]
        );
    }
    Ok(())
}

/// One router setup of the benchmark.
struct Contender {
    name: &'static str,
    router: Router,
    /// `x-prediction-based-scheduling` sent by the clients (headroom only).
    prediction_based: Option<bool>,
    /// Filter `strategy` for the positive tier (headroom only).
    strategy: &'static str,
}

const CONTENDERS: [Contender; 5] = [
    Contender { name: "envoy round robin", router: Router::RoundRobin, prediction_based: None, strategy: "" },
    Contender { name: "envoy least request", router: Router::LeastRequest, prediction_based: None, strategy: "" },
    Contender {
        name: "headroom composite",
        router: Router::Headroom,
        prediction_based: Some(false),
        strategy: "least",
    },
    Contender { name: "headroom predicted", router: Router::Headroom, prediction_based: Some(true), strategy: "least" },
    Contender {
        name: "headroom predicted, most",
        router: Router::Headroom,
        prediction_based: Some(true),
        strategy: "most",
    },
];

/// A summary row: attainment, goodput, latency percentiles, shed rate, load spread.
fn bench_row(name: &str, outcomes: &[runner::Outcome], duration: f64) -> String {
    use headroom_loadgen::report::quantile;
    let n = outcomes.len().max(1) as f64;
    let met = outcomes.iter().filter(|o| o.met_slo()).count() as f64;
    let shed = outcomes.iter().filter(|o| o.shed()).count() as f64;
    let ttft: Vec<f64> = outcomes.iter().filter(|o| o.status == 200).filter_map(|o| o.ttft_ms).collect();
    let tpot: Vec<f64> = outcomes.iter().filter(|o| o.status == 200).filter_map(|o| o.tpot_ms).collect();
    let mut load: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for o in outcomes {
        if let Some(s) = &o.served_by {
            *load.entry(s.as_str()).or_default() += 1;
        }
    }
    let (lo, hi) = (load.values().min().copied().unwrap_or(0), load.values().max().copied().unwrap_or(0));
    let q = |v: &[f64], p: f64| quantile(v, p).map_or("-".to_string(), |x| format!("{x:.0}"));
    let q1 = |v: &[f64], p: f64| quantile(v, p).map_or("-".to_string(), |x| format!("{x:.1}"));
    format!(
        "| {name} | {} | {:.1}% | {:.2} | {} / {} / {} | {} / {} / {} | {:.1}% | {lo}-{hi} |",
        outcomes.len(),
        100.0 * met / n,
        met / duration,
        q(&ttft, 0.5),
        q(&ttft, 0.9),
        q(&ttft, 0.99),
        q1(&tpot, 0.5),
        q1(&tpot, 0.9),
        q1(&tpot, 0.99),
        100.0 * shed / n,
    )
}

#[allow(clippy::too_many_arguments)]
fn bench(
    run_dir: &std::path::Path,
    workloads: &str,
    rate: f64,
    duration: f64,
    warmup: f64,
    speedup: f64,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let profiles: Vec<String> = ["h100"; 6].into_iter().chain(["a100"; 2]).map(String::from).collect();
    let runtime = tokio::runtime::Runtime::new()?;
    let mut report = format!(
        "# Benchmark: SLO attainment by router\n\n8 simulated servers (6 H100, 2 A100), the real Envoy; every router gets the identical request sequence.\n\nCommand: `headroom-stack bench --workloads {workloads} --rate {rate} --duration {duration} --warmup {warmup}`\n"
    );
    for name in workloads.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let work = workload::by_name(name, 11, rate, duration, speedup).map_err(anyhow::Error::msg)?;
        let warm = workload::by_name(name, 12, rate, warmup, speedup).map_err(anyhow::Error::msg)?;
        println!("workload {name}: {} requests", work.len());
        report.push_str(&format!(
            "\n## {name} ({} requests in {duration:.0} s)\n\n| router | requests | SLO attainment | goodput (req/s) | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms | shed | requests per server (min-max) |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
            work.len()
        ));
        for c in &CONTENDERS {
            let _ = std::fs::remove_dir_all(run_dir.join("predictor-data"));
            let mut plugin = serde_json::Map::new();
            if c.router == Router::Headroom {
                plugin.insert("strategy".into(), c.strategy.into());
                // Without SLO routing the filter places by this profile: "composite" means composite.
                plugin.insert("default_profile".into(), "composite".into());
            }
            let opts = StackOptions {
                run_dir: run_dir.to_path_buf(),
                profiles: profiles.clone(),
                router: c.router,
                plugin,
                ..Default::default()
            };
            let stack = Stack::start(opts)?;
            let target = gateway_target(&stack, c.prediction_based);
            if c.router == Router::Headroom && warmup > 0.0 {
                runtime.block_on(runner::run(&target, &warm))?;
            }
            let outcomes = runtime.block_on(runner::run(&target, &work))?;
            drop(stack);
            let row = bench_row(c.name, &outcomes, duration);
            println!("{row}");
            report.push_str(&row);
            report.push('\n');
            let file = out.join(format!("{name}-{}.jsonl", c.name.replace(' ', "-")));
            let lines: Vec<String> = outcomes.iter().filter_map(|o| serde_json::to_string(o).ok()).collect();
            std::fs::write(file, lines.join("\n") + "\n")?;
        }
    }
    report.push_str("\nSLO attainment: share of requests meeting both their TTFT and TPOT SLO (shed and failed requests count as misses); goodput: such requests per second.\n");
    std::fs::write(out.join("report.md"), &report)?;
    println!("\nreport: {}", out.join("report.md").display());
    Ok(())
}
