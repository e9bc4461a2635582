//! `headroom-profile --server HOST:PORT --out DIR --name CLASS`: sweeps one model server
//! (real or simulated) over prompt lengths and decode batch sizes and writes
//! `DIR/CLASS-ttft.json` and `DIR/CLASS-tpot.json` in Llumnix's profiling schema, the
//! predictor's prior for that hardware class (`model.prior_profiles`, docs/configuration.md).

use std::path::PathBuf;

use clap::Parser;
use headroom_loadgen::profile::{self, Sweep};

#[derive(Parser)]
#[command(version, about = "Profile a model server's TTFT and TPOT for the predictor's prior")]
struct Args {
    /// The server to sweep (`HOST:PORT`, OpenAI-compatible). Nothing else should load it.
    #[arg(long)]
    server: std::net::SocketAddr,
    /// The model it serves (default: the first of its `/v1/models`).
    #[arg(long)]
    model: Option<String>,
    /// The hardware class the profile is for: the files' name prefix.
    #[arg(long)]
    name: String,
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Prompt lengths of the TTFT sweep (default: up to the server's context).
    #[arg(long, value_delimiter = ',')]
    prompts: Vec<u32>,
    /// Batch sizes of the TPOT sweep.
    #[arg(long, value_delimiter = ',')]
    batches: Vec<u32>,
    /// Context per request of the TPOT sweep.
    #[arg(long, value_delimiter = ',')]
    contexts: Vec<u32>,
    /// Batch sizes are capped here (the server's `--max-num-seqs`).
    #[arg(long, default_value_t = 32)]
    max_batch: u32,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let url = format!("http://{}", args.server);
    let runtime = tokio::runtime::Runtime::new()?;
    let (model, context) = runtime.block_on(profile::served(&url))?;
    let model = args.model.unwrap_or(model);
    let mut sweep = Sweep::for_engine(context, args.max_batch);
    for (given, field) in
        [(args.prompts, &mut sweep.prompts), (args.batches, &mut sweep.batches), (args.contexts, &mut sweep.contexts)]
    {
        if !given.is_empty() {
            *field = given;
        }
    }
    println!("profiling {url} ({model}, context {context} tokens)");
    let profiled = runtime.block_on(profile::run(&url, &model, &sweep, |line| println!("  {line}")))?;
    let (ttft, tpot) = profile::write(&profiled, &args.out, &args.name)?;
    println!("took {:.0} s; wrote {} and {}", profiled.took.as_secs_f64(), ttft.display(), tpot.display());
    let pct = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.1}%", s * 100.0));
    println!(
        "identical requests on the idle server spread {} (TTFT) and {} (TPOT) around each point's p50: \
         the floor under any predictor's MAPE here",
        pct(profiled.ttft.spread()),
        pct(profiled.tpot.spread())
    );
    Ok(())
}
