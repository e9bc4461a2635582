//! `headroom-stack up | down | demo | accuracy`: the local stack behind `make up`, `make down`,
//! `make demo`, and the prediction accuracy run (docs/predictor.md). The router benchmark is
//! its own crate (`bench/`, `headroom-bench`).

use std::time::Duration;

use clap::{Parser, Subcommand};
use headroom_loadgen::{report, runner, workload};
use headroom_stack::accuracy::{self, AccuracyOptions};
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
        /// Also run a p90 pass and write the figures (holdout/live MAPE, shift recovery,
        /// p90 coverage, tier precision) to this JSON file.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
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
        Cmd::Accuracy { warmup, shift, rate, objective, json } => {
            let opts = AccuracyOptions { run_dir, warmup_s: warmup, shift_s: shift, rate, objective, json };
            accuracy::run(&opts)?;
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
