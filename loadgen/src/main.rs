//! `headroom-loadgen --url http://127.0.0.1:10000 [--workload mixed] --rate 4 --duration 60 [--out results.jsonl]`
//!
//! Workloads: `mixed`, `short-long`, `long-short`, `shared-prefix`, `azure` (the bundled
//! Azure conversation trace, `--speedup` times faster), or `--workload-file` with one
//! JSON `RequestSpec` per line.

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use headroom_loadgen::{report, runner, workload};

#[derive(Parser)]
#[command(version, about = "Open-loop load with SLO headers against an OpenAI-compatible gateway")]
struct Args {
    /// Gateway base URL.
    #[arg(long)]
    url: String,
    /// Model name to request.
    #[arg(long, default_value = "sim-llama-8b")]
    model: String,
    /// mixed, short-long, long-short, shared-prefix or azure.
    #[arg(long, default_value = "mixed")]
    workload: String,
    /// One JSON RequestSpec per line (overrides --workload).
    #[arg(long)]
    workload_file: Option<std::path::PathBuf>,
    /// Trace replay speed-up (azure).
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Mean requests per second (Poisson arrivals).
    #[arg(long, default_value_t = 4.0)]
    rate: f64,
    /// Seconds of traffic.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Send `x-prediction-based-scheduling: true` (without it the header is not sent, and
    /// headroom routes a request that states goals by them all the same).
    #[arg(long)]
    slo_routing: bool,
    /// Write one JSON line per request here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rate > 0.0 && args.duration > 0.0, "--rate and --duration must be > 0");
    let work = match &args.workload_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--workload-file {}: {e}", path.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), i + 1))
            })
            .collect::<anyhow::Result<Vec<workload::RequestSpec>>>()?,
        None => workload::by_name(&args.workload, args.seed, args.rate, args.duration, args.speedup)
            .map_err(anyhow::Error::msg)?,
    };
    let target = runner::Target {
        url: args.url.trim_end_matches('/').to_string(),
        model: args.model,
        slo_headers: true,
        prediction_based: args.slo_routing.then_some(true),
        timeout: Duration::from_secs(120),
    };
    let outcomes = runner::run(&target, &work).await?;
    if let Some(path) = args.out {
        let mut f = std::fs::File::create(&path)?;
        for o in &outcomes {
            writeln!(f, "{}", serde_json::to_string(o)?)?;
        }
    }
    print!("{}", report::table(&outcomes));
    Ok(())
}
