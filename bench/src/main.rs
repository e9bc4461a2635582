//! `headroom-bench run | report | analyze | gateway | soak`: the benchmarks behind `make bench`
//! (docs/benchmark.md), `make bench-gateway` (docs/performance.md) and `make soak`
//! (docs/reliability.md), and the tables read from a run's results.

use clap::{Parser, Subcommand};
use headroom_bench::{read_results, BenchOptions};
use headroom_stack::locate;

/// mimalloc, not glibc's malloc: `sim` allocates and frees small buffers at a high rate
/// (a fifth of its CPU went to glibc's allocator), and mimalloc's thread-local free
/// lists serve that for less (docs/benchmark.md, "Speed").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(version, about = "Compare routers on identical traffic through the local stack")]
struct Args {
    /// Where the stacks' configs, logs and pid records go.
    #[arg(long, global = true)]
    run_dir: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compare routers on identical request sequences over a rate ladder: plain Envoy round
    /// robin and least request, headroom with prediction off (composite) and on.
    Run {
        /// What serves the model: `sim` (8 simulated GPUs) or `vllm` (the local real vLLM servers,
        /// `make setup-vllm`; two, a core each, real time, restarted for every router).
        #[arg(long, default_value = "sim")]
        engine: String,
        /// Comma-separated workloads (mixed, short-long, long-short, shared-prefix, hetero, azure;
        /// mixed-small, sized for a small model on CPU; multi-turn and rag, conversations sized
        /// for the engine-bound model). Default: the six on the simulator, mixed-small on vLLM.
        #[arg(long)]
        workloads: Option<String>,
        /// Comma-separated rate ladder in requests/s (default: one per workload and engine; azure
        /// replays the same stretch of its trace compressed to each rate).
        #[arg(long)]
        rates: Option<String>,
        /// How many of the azure trace's requests every rate replays (default: as many as the
        /// ladder's lowest rate sends in one step). To add rungs to another run's ladder on the
        /// same traffic, give its `trace_window` from its results.
        #[arg(long)]
        trace_window: Option<usize>,
        /// Seconds of measured traffic per router and rate (default: 15 on the simulator, 40 on
        /// vLLM, whose rates are a hundred times lower).
        #[arg(long)]
        step: Option<f64>,
        /// Seconds of each rate's traffic sent before its measured step and not counted, so the
        /// step measures the fleet at that load, not filling up from empty, for every workload;
        /// with a lead-in the traffic also goes on until the step's last request has ended.
        /// Default: 20 for short-long, azure, hetero and mixed, whose long answers outlast most of a
        /// step near their cliffs, 0 for long-short and shared-prefix.
        #[arg(long)]
        lead_in: Option<f64>,
        /// Seconds of traffic (another seed, lowest rate) before measuring headroom, so its models are trained.
        #[arg(long, default_value_t = 20.0)]
        warmup: f64,
        /// Comma-separated hardware profile per simulated server, for every workload (default:
        /// 6 H100 + 2 A100, and 4 + 4 for hetero).
        #[arg(long)]
        servers: Option<String>,
        /// Simulator speed for every workload: below 1 keeps the host's CPU out of the measurement
        /// (rates stay in simulated time). Default (`default_time_scale`): real time, half speed for
        /// mixed, 0.25x for azure and shared-prefix and 0.15x for short-long, whose ladders would
        /// saturate this host.
        #[arg(long)]
        time_scale: Option<f64>,
        /// Comma-separated routers to run (default: all).
        #[arg(long, default_value = "")]
        routers: String,
        /// Measurements of each rate near the cliff, each with its own seed's traffic (1: no repeats).
        #[arg(long, default_value_t = 3)]
        seeds: u32,
        /// Where the report and per-request results go.
        #[arg(long, default_value = "results")]
        out: std::path::PathBuf,
    },
    /// The same ladders in simulated time, in one process: the load generator's requests, the
    /// filter's and the predictor's own decision code and the simulated engines on one clock,
    /// Envoy and the network modelled as delays (docs/benchmark.md, "The simulated-time bench").
    Sim(SimArgs),
    /// The gateway's own cost: added latency at low load, closed-loop throughput and Envoy's CPU
    /// per streamed token, plain Envoy against Envoy + headroom, in front of fast servers.
    Gateway(headroom_bench::gateway::GatewayOptions),
    /// Bytes between the gateway and the predictor per routed request, on the real stack
    /// (Envoy's counters of the predictor's cluster).
    Callouts(headroom_bench::callouts::CalloutOptions),
    /// Predict calls' latency while clients scrape the predictor's /metrics, against nobody
    /// scraping, in one sitting.
    Scrapes(headroom_bench::scrapes::ScrapeOptions),
    /// Other clients' SLO attainment alone and while one tenant's streams ask a tight TPOT
    /// goal, in one sitting.
    Claims(headroom_bench::claims::ClaimOptions),
    /// Steady mixed traffic for a long time: memory of the predictor, Envoy and the Wasm VMs
    /// sampled, failures counted, the predictor's books balanced at the end (exit 1 on failure).
    Soak {
        /// Seconds of traffic, warm-up included.
        #[arg(long, default_value_t = 1800.0)]
        seconds: f64,
        /// Seconds before the memory baseline (default: a third of the run, at most 600: at the
        /// default rate the predictor's bounded stores take about 9 minutes to fill).
        #[arg(long)]
        warmup: Option<f64>,
        /// Offered load, requests/s (about 70% of the 2 H100 + 1 A100 fleet's capacity).
        #[arg(long, default_value_t = 35.0)]
        rate: f64,
        /// Shrink the predictor's bounded stores so a short soak sees them full (`make test`).
        #[arg(long)]
        small_caps: bool,
        /// Where samples.csv, memory.svg and soak.json go.
        #[arg(long, default_value = "results/soak")]
        out: std::path::PathBuf,
    },
    /// Tables the report leaves out, from runs' results.json and per-request logs: every class
    /// over every seed, each server's share, how flow control let each class through.
    Analyze {
        /// classes, servers or flows.
        view: headroom_bench::analyze::View,
        /// `run --out` directories (one or more: their rows are told apart by a run column).
        #[arg(required = true)]
        dirs: Vec<std::path::PathBuf>,
    },
    /// How far `sim` agrees with `run` on the same traffic: three rungs per workload near the
    /// real run's cliffs, each class's attainment both ways, and each workload's verdict.
    Agreement {
        /// The real bench's run directory or results file (the judge of record).
        #[arg(long)]
        real: std::path::PathBuf,
        /// `sim`'s run directory or results file.
        #[arg(long)]
        sim: std::path::PathBuf,
    },
    /// Re-render report.md and the charts from the results.json.gz of an earlier `run`.
    Report {
        #[arg(long, default_value = "results")]
        out: std::path::PathBuf,
        /// Another run's directory or results file (repeatable): its workloads are added to OUT's,
        /// and OUT's results.json.gz is rewritten with them. A workload OUT has too gains its routers when both
        /// were measured the same way (step, lead-in, fleet, speed), and is replaced otherwise.
        /// For a reference run made in parts; each merged workload keeps its commands and speed.
        #[arg(long)]
        merge: Vec<std::path::PathBuf>,
        /// Summarize every measurement again from the per-request results under OUT/requests
        /// (fills the figures the report gained since the run was made).
        #[arg(long)]
        recompute: bool,
        /// Keep only these routers (comma-separated names) once merged: a reference made from
        /// parts that also ran other routers.
        #[arg(long, default_value = "")]
        routers: String,
    },
}

#[derive(clap::Args)]
struct SimArgs {
    /// Comma-separated workloads (as `run`; `trace` replays --trace FILE). Default: the six of
    /// the reference run, or `trace` with --trace.
    #[arg(long)]
    workloads: Option<String>,
    /// Comma-separated rate ladder in requests/s (default: each workload's, as `run`; for a
    /// trace, 0.5x to 3x its own mean rate).
    #[arg(long)]
    rates: Option<String>,
    /// How many of a trace's requests every rate replays (default: the lowest rate's step).
    #[arg(long)]
    trace_window: Option<usize>,
    /// Seconds of measured traffic per router and rate.
    #[arg(long, default_value_t = 15.0)]
    step: f64,
    /// Seconds of each rate's traffic before its step, not counted (default: as `run`; 20 for a trace).
    #[arg(long)]
    lead_in: Option<f64>,
    /// Seconds of warm-up traffic before headroom's ladder.
    #[arg(long, default_value_t = 20.0)]
    warmup: f64,
    /// The fleet for every workload: `h100:6,a100:2` (default: each workload's, as `run`).
    #[arg(long)]
    fleet: Option<String>,
    /// Simulator speed for every workload (default: each workload's, as `run`, so the
    /// gateway's and the predictor's intervals fall in engine time where the real bench's did).
    #[arg(long)]
    time_scale: Option<f64>,
    /// Comma-separated routers (default: all).
    #[arg(long, default_value = "")]
    routers: String,
    /// Measurements of each rate near the cliffs, each with its own seed's traffic.
    #[arg(long, default_value_t = 10)]
    seeds: u32,
    /// Your own trace (CSV `arrived_at,num_prefill_tokens,num_decode_tokens`, the format of
    /// `loadgen/workloads/azure-conv-2023.csv`), replayed as workload `trace`: how each router
    /// would do on your traffic and --fleet.
    #[arg(long)]
    trace: Option<std::path::PathBuf>,
    /// Ladders measured side by side (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Write each measurement's per-request outcomes under OUT/requests (for `analyze`).
    #[arg(long)]
    keep_requests: bool,
    #[arg(long, default_value = "results/sim")]
    out: std::path::PathBuf,
}

/// Comma-separated rates from `--rates`.
fn parse_rates(text: &str) -> anyhow::Result<Vec<f64>> {
    text.split(',')
        .map(|x| x.trim().parse::<f64>().map_err(|_| anyhow::anyhow!("--rates: not a number: {x:?}")))
        .collect()
}

/// `headroom-bench sim`.
fn sim(args: SimArgs, run_dir: std::path::PathBuf) -> anyhow::Result<()> {
    let list = |s: &str| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect::<Vec<_>>();
    let trace = match &args.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("--trace {}: {e}", path.display()))?;
            Some(std::sync::Arc::<str>::from(text))
        }
        None => None,
    };
    let default_workloads = if trace.is_some() { headroom_bench::USER_TRACE } else { SIM_WORKLOADS };
    let workloads = list(args.workloads.as_deref().unwrap_or(default_workloads));
    let rates = match (&args.rates, &trace) {
        (Some(r), _) => Some(parse_rates(r)?),
        // A user's trace: its own rate and around it, up to where most fleets fall.
        (None, Some(csv)) if workloads.iter().all(|w| w == headroom_bench::USER_TRACE) => {
            let native = headroom_loadgen::workload::trace_rate(csv).map_err(|e| anyhow::anyhow!("--trace: {e}"))?;
            Some(
                [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0]
                    .iter()
                    .map(|k| (k * native * 100.0).round() / 100.0)
                    .collect(),
            )
        }
        _ => None,
    };
    let lead_in = args.lead_in.or((trace.is_some()).then_some(20.0));
    let opts = BenchOptions {
        engine: headroom_stack::Engine::Simulator,
        workloads,
        rates,
        trace_window: args.trace_window,
        step_s: args.step,
        lead_in_s: lead_in,
        warmup_s: args.warmup,
        profiles: args.fleet.as_deref().map(headroom_bench::sim::parse_fleet).transpose()?,
        time_scale: args.time_scale,
        routers: headroom_bench::parse_routers(&args.routers)?,
        seeds: args.seeds,
        trace,
        run_dir,
        out: args.out.clone(),
    };
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let lab = headroom_bench::sim::SimLab { opts: &opts, threads, keep_requests: args.keep_requests };
    let command = format!("headroom-bench {}", std::env::args().skip(1).collect::<Vec<_>>().join(" "));
    let started = std::time::Instant::now();
    headroom_bench::run_on(&lab, &opts, command.trim())?;
    println!("\nreport: {} ({:.0} s)", args.out.join("report.md").display(), started.elapsed().as_secs_f64());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let run_dir = args.run_dir.unwrap_or_else(|| locate::root().join(".run"));
    match args.command {
        Cmd::Analyze { view, dirs } => {
            let mut measured = Vec::new();
            for dir in &dirs {
                measured.extend(headroom_bench::analyze::load(dir)?);
            }
            print!("{}", headroom_bench::analyze::table(view, &measured));
        }
        Cmd::Report { out, merge, recompute, routers } => {
            // A reference assembled from parts into an empty directory starts from its first part.
            let fresh = !out.join(headroom_bench::RESULTS_FILE).exists() && !merge.is_empty();
            let (mut results, merge) = if fresh {
                println!("{}: the first part", merge[0].display());
                (read_results(&merge[0])?, &merge[1..])
            } else {
                (read_results(&out)?, &merge[..])
            };
            for path in merge {
                for line in results.merge(read_results(path)?) {
                    println!("{}: {line}", path.display());
                }
            }
            results.keep_routers(&headroom_bench::parse_routers(&routers)?)?;
            if recompute {
                let n = headroom_bench::recompute(&out, &mut results)?;
                println!("{n} measurements summarized again from {}", out.join("requests").display());
            }
            headroom_bench::write_outputs(&out, &results)?;
            println!("report: {}", out.join("report.md").display());
        }
        Cmd::Soak { seconds, warmup, rate, small_caps, out } => {
            let opts = headroom_bench::soak::SoakOptions {
                seconds,
                warmup_s: warmup.unwrap_or_else(|| headroom_bench::soak::default_warmup(seconds)),
                rate,
                small_caps,
                run_dir,
                out: out.clone(),
                ..Default::default()
            };
            let command = format!("headroom-bench {}", std::env::args().skip(1).collect::<Vec<_>>().join(" "));
            let summary = headroom_bench::soak::run(&opts, command.trim())?;
            println!("{}", summary.line());
            for f in &summary.first_failures {
                println!("  failed: {f}");
            }
            println!("samples and chart: {}", out.display());
            if !summary.passed {
                std::process::exit(1);
            }
        }
        Cmd::Callouts(opts) => headroom_bench::callouts::run(&opts)?,
        Cmd::Scrapes(opts) => headroom_bench::scrapes::run(&opts)?,
        Cmd::Claims(opts) => headroom_bench::claims::run(&opts)?,
        Cmd::Agreement { real, sim } => {
            print!("{}", headroom_bench::agreement::table(&read_results(&real)?, &read_results(&sim)?));
        }
        Cmd::Sim(args) => sim(args, run_dir)?,
        Cmd::Gateway(mut opts) => {
            opts.run_dir = run_dir;
            let command = format!("headroom-bench {}", std::env::args().skip(1).collect::<Vec<_>>().join(" "));
            headroom_bench::gateway::run(&opts, command.trim())?;
            println!("report: {}", opts.out.join("gateway.md").display());
        }
        Cmd::Run {
            engine,
            workloads,
            rates,
            trace_window,
            step,
            lead_in,
            warmup,
            servers,
            time_scale,
            routers,
            seeds,
            out,
        } => {
            let list = |s: &str| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect();
            let rates = rates.as_deref().map(parse_rates).transpose()?;
            let engine = headroom_stack::Engine::parse(&engine)?;
            let workloads = workloads.unwrap_or_else(|| match engine {
                headroom_stack::Engine::Simulator => SIM_WORKLOADS.to_string(),
                headroom_stack::Engine::Vllm => headroom_bench::VLLM_WORKLOADS.join(","),
            });
            let opts = BenchOptions {
                engine,
                workloads: list(&workloads),
                rates,
                trace_window,
                step_s: step.unwrap_or(match engine {
                    headroom_stack::Engine::Simulator => 15.0,
                    headroom_stack::Engine::Vllm => headroom_bench::VLLM_STEP_S,
                }),
                lead_in_s: lead_in,
                warmup_s: warmup,
                profiles: servers.as_deref().map(list),
                time_scale,
                routers: headroom_bench::parse_routers(&routers)?,
                seeds,
                trace: None,
                run_dir,
                out: out.clone(),
            };
            let command = format!("headroom-bench {}", std::env::args().skip(1).collect::<Vec<_>>().join(" "));
            headroom_bench::run(&opts, command.trim())?;
            println!("\nreport: {}", out.join("report.md").display());
        }
    }
    Ok(())
}

/// The workloads a simulated run measures unless `--workloads` says otherwise.
const SIM_WORKLOADS: &str = "mixed,azure,hetero,shared-prefix,short-long,long-short";
