//! `headroom-stack up | down | demo | accuracy`: the local stack behind `make up`, `make down`,
//! `make demo`, and the prediction accuracy run (docs/predictor.md). The router benchmark is
//! its own crate (`bench/`, `headroom-bench`).

use std::time::Duration;

use clap::{Parser, Subcommand};
use headroom_loadgen::{chart, report, runner, workload};
use headroom_stack::accuracy::{self, AccuracyOptions};
use headroom_stack::{locate, Engine, Router, Stack, StackOptions, StackState};

#[derive(Parser)]
#[command(version, about = "Run the local headroom stack")]
struct Args {
    /// Where configs, logs and the pid record go.
    #[arg(long, global = true)]
    run_dir: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start Envoy + filter + predictor + model servers in the background: 3 simulated
    /// servers, 2 real vLLM servers (`--engine vllm`), or none, in front of yours (`--servers`).
    Up {
        /// `sim` (simulated vLLM) or `vllm` (real vLLM's CPU build, `make setup-vllm`).
        #[arg(long, default_value = "sim")]
        engine: String,
        /// Model servers you already run (`HOST:PORT,...`, OpenAI-compatible, vLLM metrics):
        /// the gateway goes in front of them and starts none.
        #[arg(long, value_delimiter = ',')]
        servers: Vec<std::net::SocketAddr>,
        /// Hardware class of each server (`--servers`' order, or the servers started): a
        /// model feature, so one pool can mix GPUs.
        #[arg(long, value_delimiter = ',')]
        hardware: Vec<String>,
        /// Profile each hardware class's first server before traffic (`headroom-profile`'s
        /// sweep, seconds) for the predictor's prior: always on for the servers the stack
        /// starts; for `--servers`, it loads your servers for those seconds.
        #[arg(long)]
        profile: bool,
    },
    /// Stop exactly what `up` started.
    Down,
    /// The same mixed SLO traffic through Envoy least request, then through headroom: each
    /// router's table, both side by side per SLO class, and a chart (SVG).
    Demo {
        /// `sim` (3 simulated servers) or `vllm` (2 real vLLM servers on this host's cores).
        #[arg(long, default_value = "sim")]
        engine: String,
        /// Seconds of traffic per router (default: 50 on the simulator, 90 on vLLM).
        #[arg(long)]
        duration: Option<f64>,
        /// Mean requests per second: enough to load the fleet past where least request
        /// keeps the interactive class's SLOs (default: 40 on the simulator; 2 on vLLM,
        /// where the host's two cores are the fleet and 4 keeps them 99% busy).
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Hardware profile per server (default: h100,h100,a100 simulated; cpu,cpu on vLLM).
        #[arg(long, value_delimiter = ',')]
        servers: Vec<String>,
        /// Where the chart goes.
        #[arg(long, default_value = "results/demo.svg")]
        chart: std::path::PathBuf,
    },
    /// Measure prediction accuracy on simulator traffic through the real stack,
    /// then after a workload shift (docs/predictor.md).
    Accuracy {
        /// `sim` (2 simulated H100 + 1 A100) or `vllm` (2 real vLLM servers, the small
        /// model and its workload, `mixed-small`).
        #[arg(long, default_value = "sim")]
        engine: String,
        /// With `--engine vllm`: the analytic prior instead of the profiled one (the
        /// comparison the profile is judged by).
        #[arg(long)]
        no_profile: bool,
        /// Seconds of mixed traffic before the shift.
        #[arg(long, default_value_t = 120.0)]
        warmup: f64,
        /// Seconds of prefill-heavy traffic after the shift.
        #[arg(long, default_value_t = 90.0)]
        shift: f64,
        /// Mean requests per second of the mixed phase (default: 15 on the simulator, 1.2 on
        /// vLLM, which keeps this 2-core host about 70% busy).
        #[arg(long)]
        rate: Option<f64>,
        /// Training objective: mean or p90.
        #[arg(long, default_value = "mean")]
        objective: String,
        /// Also run a p90 pass and write the figures (holdout/live MAPE, shift recovery,
        /// p90 coverage, tier precision) to this JSON file.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Instead of running the stack: the error floor of each phase, measured on the
        /// simulated engines in simulated time with this many replayed futures per request
        /// (what no dispatch-time predictor can go under on this traffic; docs/predictor.md).
        #[arg(long)]
        floor: Option<usize>,
        /// With --floor: how late dispatches and first tokens reach a tracking predictor
        /// in the recorded lagged state (the filter's flush tick, 20 ms by default).
        #[arg(long, default_value_t = 20.0)]
        report_lag_ms: f64,
        /// With --floor: write each phase's scored requests (state at arrival, latency)
        /// to DIR/<phase>.csv.
        #[arg(long)]
        floor_dump: Option<std::path::PathBuf>,
        /// Filter configuration fields (a JSON object) over the stack's defaults.
        #[arg(long, default_value = "{}")]
        plugin: String,
        /// Write every observation of the first pass here (JSON lines, with the phase).
        #[arg(long)]
        observations: Option<std::path::PathBuf>,
        /// Simulator time scale (below 1: slower servers, the host's jitter weighs less).
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let run_dir = args.run_dir.unwrap_or_else(|| locate::root().join(".run"));
    match args.command {
        Cmd::Up { engine, servers, hardware, profile } => {
            let engine = Engine::parse(&engine)?;
            let profiles = if !hardware.is_empty() {
                anyhow::ensure!(
                    servers.is_empty() || hardware.len() == servers.len(),
                    "--hardware names {} classes for {} servers: one per server",
                    hardware.len(),
                    servers.len()
                );
                hardware
            } else if servers.is_empty() {
                engine.default_profiles()
            } else {
                Vec::new()
            };
            anyhow::ensure!(
                !(profile && !servers.is_empty() && profiles.is_empty()),
                "--profile measures a hardware class: name each server's with --hardware"
            );
            if let Some(old) = StackState::load(&run_dir)? {
                let stopped = old.stop_all(&run_dir);
                if stopped > 0 {
                    println!("stopped {stopped} processes of a previous `make up`");
                }
            }
            if engine == Engine::Vllm && servers.is_empty() {
                println!("starting {} real vLLM servers (a minute or two)...", profiles.len());
            }
            let profile = profile || servers.is_empty();
            let opts = StackOptions {
                run_dir: run_dir.clone(),
                attached: false,
                engine,
                servers,
                profiles,
                profile,
                ..Default::default()
            };
            let stack = Stack::start(opts)?;
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
                 -H 'x-slo-tpot-ms: 50' -d '{{\"model\":\"{}\",\"prompt\":\"Hello\",\"max_tokens\":8}}'",
                state.gateway, state.model
            );
            println!("stop with: make down");
        }
        Cmd::Down => match StackState::load(&run_dir)? {
            Some(state) => println!("stopped {} processes", state.stop_all(&run_dir)),
            None => println!("nothing to stop (no {}/stack.json)", run_dir.display()),
        },
        Cmd::Demo { engine, duration, rate, seed, servers, chart } => {
            let engine = Engine::parse(&engine)?;
            let (default_duration, default_rate) = match engine {
                Engine::Simulator => (50.0, 40.0),
                Engine::Vllm => (90.0, 2.0),
            };
            let servers = if servers.is_empty() { engine.default_profiles() } else { servers };
            let (duration, rate) = (duration.unwrap_or(default_duration), rate.unwrap_or(default_rate));
            demo(&run_dir, engine, duration, rate, seed, servers, &chart)?
        }
        Cmd::Accuracy {
            engine,
            no_profile,
            warmup,
            shift,
            rate,
            objective,
            json,
            floor,
            report_lag_ms,
            floor_dump,
            plugin,
            observations,
            time_scale,
        } => {
            let plugin = headroom_stack::plugin_fields(&plugin)?;
            anyhow::ensure!(time_scale > 0.0 && time_scale.is_finite(), "--time-scale must be > 0");
            let engine = Engine::parse(&engine)?;
            anyhow::ensure!(
                engine == Engine::Simulator || floor.is_none(),
                "--floor measures the simulated engines; it has no meaning with --engine vllm"
            );
            let opts = AccuracyOptions {
                run_dir,
                engine,
                profile: engine == Engine::Vllm && !no_profile,
                warmup_s: warmup,
                rate: rate.unwrap_or(match engine {
                    Engine::Simulator => 15.0,
                    Engine::Vllm => 1.2,
                }),
                shift_s: shift,
                objective,
                json,
                plugin,
                observations,
                time_scale,
            };
            match floor {
                Some(futures) => {
                    anyhow::ensure!(futures > 0, "--floor takes the number of futures per request, at least 1");
                    anyhow::ensure!(report_lag_ms >= 0.0, "--report-lag-ms must be >= 0");
                    let floors = accuracy::floors(&opts, futures, report_lag_ms)?;
                    accuracy::print_floors(&floors);
                    if let Some(dir) = &floor_dump {
                        accuracy::write_floor_records(dir, &floors)?;
                    }
                }
                None => {
                    accuracy::run(&opts)?;
                }
            }
        }
    }
    Ok(())
}

/// `make demo`: one workload, two routers, one stack each (started, loaded, stopped in turn).
fn demo(
    run_dir: &std::path::Path,
    engine: Engine,
    duration: f64,
    rate: f64,
    seed: u64,
    servers: Vec<String>,
    chart: &std::path::Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(duration > 0.0 && rate > 0.0, "--duration and --rate must be > 0");
    anyhow::ensure!(!servers.is_empty(), "--servers needs at least one hardware profile");
    // Each router's stack starts servers of its own, so neither finds the other's prompts in
    // a prefix cache: both get the very same requests.
    let work = match engine {
        Engine::Simulator => workload::mixed(seed, rate, duration),
        Engine::Vllm => workload::mixed_small(seed, rate, duration),
    };
    println!(
        "{} requests of mixed SLO traffic ({duration:.0} s at {rate} req/s: interactive / batch / sheddable classes)",
        work.len()
    );
    let what = match engine {
        Engine::Simulator => "simulated servers",
        Engine::Vllm => "real vLLM servers (each on a core of this host; started per router, a minute or two each)",
    };
    println!("on {} {what} ({}), first through Envoy least request, then headroom", servers.len(), servers.join(", "));
    let routers = [("envoy least request", Router::LeastRequest, None), ("headroom", Router::Headroom, Some(true))];
    let mut results = Vec::new();
    for (name, router, prediction_based) in routers {
        let opts = StackOptions {
            run_dir: run_dir.to_path_buf(),
            router,
            engine,
            profile: router == Router::Headroom,
            profiles: servers.clone(),
            ..Default::default()
        };
        let stack = Stack::start(opts)?;
        println!("\n== {name} (gateway http://{}) ==", stack.state.gateway);
        let target = gateway_target(&stack, prediction_based);
        let busy = headroom_stack::host::Busy::start();
        let outcomes = tokio::runtime::Runtime::new()?.block_on(runner::run(&target, &work))?;
        println!("host CPU busy while it ran: {:.0}%", busy.percent());
        drop(stack);
        print!("{}", report::table(&outcomes));
        results.push((name, outcomes));
    }
    let [(a_name, a), (b_name, b)] = <[_; 2]>::try_from(results).map_err(|_| anyhow::anyhow!("two runs"))?;
    println!("\n== side by side: the same {} requests ==", a.len());
    print!("{}", report::compare((a_name, &a), (b_name, &b)));
    let (a_classes, b_classes) = (report::attainment_by_class(&a), report::attainment_by_class(&b));
    let groups: Vec<&str> = a_classes.iter().map(|(c, _)| c.as_str()).collect();
    let bars = |name, classes: &[(String, f64)]| chart::Series {
        name,
        points: classes.iter().enumerate().map(|(i, (_, y))| (i as f64, *y)).collect(),
        ..Default::default()
    };
    let title = format!("SLO attainment by class: {rate} req/s on {}", servers.join(", "));
    let svg = chart::bars_svg(&title, &groups, &[bars(a_name, &a_classes), bars(b_name, &b_classes)], 0.9);
    if let Some(dir) = chart.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(chart, svg)?;
    println!("\nchart: {}", chart.display());
    Ok(())
}

/// Clients of the stack's gateway: the model its servers serve, SLO headers on.
fn gateway_target(stack: &Stack, prediction_based: Option<bool>) -> runner::Target {
    runner::Target {
        url: format!("http://{}", stack.state.gateway),
        model: stack.state.model.clone(),
        slo_headers: true,
        prediction_based,
        timeout: Duration::from_secs(120),
    }
}
