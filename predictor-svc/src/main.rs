//! `headroom-predictor --config predictor.toml [--listen ip:port]`

use std::path::PathBuf;

use clap::Parser;
use headroom_predictor::config::Config;

#[derive(Parser)]
#[command(version, about = "headroom predictor-svc")]
struct Args {
    /// TOML configuration file (pools and their endpoints).
    #[arg(long)]
    config: PathBuf,
    /// Overrides `listen` from the configuration.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let mut config = Config::load(&args.config)?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    tracing::info!(listen = %config.listen, pools = config.pools.len(), "predictor-svc started");
    headroom_predictor::serve(config, listener, shutdown_signal()).await?;
    tracing::info!("predictor-svc stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
