//! `headroom-stack up | down | demo`: the local stack behind `make up`, `make down`, `make demo`.

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
        /// Mean requests per second.
        #[arg(long, default_value_t = 20.0)]
        rate: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
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
            let target = runner::Target {
                url: format!("http://{}", stack.state.gateway),
                model: "sim-llama-8b".into(),
                slo_headers: true,
                prediction_based: Some(true),
                timeout: Duration::from_secs(120),
            };
            let runtime = tokio::runtime::Runtime::new()?;
            let outcomes = runtime.block_on(runner::run(&target, &work))?;
            println!();
            print!("{}", report::table(&outcomes));
            drop(stack);
            println!("\nstack stopped");
        }
    }
    Ok(())
}
