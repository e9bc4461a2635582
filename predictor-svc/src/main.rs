//! `headroom-predictor --config predictor.toml [--listen ip:port] [--log-format json]`

use std::path::PathBuf;

use clap::Parser;
use headroom_predictor::config::Config;
use headroom_process::LogFormat;

#[derive(Parser)]
#[command(version, about = "headroom predictor-svc")]
struct Args {
    /// TOML configuration file (pools and their endpoints).
    #[arg(long)]
    config: PathBuf,
    /// Overrides `listen` from the configuration.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Log lines as text, or as one JSON object each (for a cluster's log pipeline).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    headroom_process::init_logs(args.log_format);
    let mut config = Config::load(&args.config)?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    tracing::info!(listen = %config.listen, pools = config.pools.len(), "predictor-svc started");
    headroom_predictor::serve(config, listener, headroom_process::terminated()).await?;
    tracing::info!("predictor-svc stopped");
    Ok(())
}
