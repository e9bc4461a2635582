//! `headroom-stack up | down | demo | accuracy`: the local stack behind `make up`, `make down`,
//! `make demo`, and the prediction accuracy run (docs/predictor.md). The router benchmark is
//! its own crate (`bench/`, `headroom-bench`).

use std::time::Duration;

use clap::{Parser, Subcommand};
use headroom_loadgen::{report, runner, workload};
use headroom_stack::{locate, Stack, StackOptions, StackState};

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
            println!(
                "predictor token (its /v1/predict, dispatch, report, observations, model downloads): {}",
                run_dir.join("predictor-token").display()
            );
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
