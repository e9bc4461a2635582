//! `headroom-epp`: serves Envoy's ext_proc on `--listen`, deciding with the filter's
//! configuration (`--config`, the JSON `docs/configuration.md` describes) and calling the
//! predictor clusters it names at the addresses `--predictor` gives.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use headroom_filter_core::FilterConfig;

#[derive(Parser)]
#[command(name = "headroom-epp", about = "headroom's endpoint picker over Envoy ext_proc")]
struct Args {
    /// Where to serve ext_proc, gRPC health and /metrics (HTTP/2 cleartext and HTTP/1.1).
    #[arg(long, default_value = "127.0.0.1:9002")]
    listen: SocketAddr,
    /// The filter configuration (JSON); absent, the filter's defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A predictor cluster of the configuration and its address: `headroom_predictor=10.0.0.5:8080`.
    #[arg(long = "predictor", value_parser = headroom_epp::parse_cluster)]
    predictors: Vec<(String, SocketAddr)>,
    /// Worker threads, each with its own VM (as Envoy's workers have).
    #[arg(long, default_value_t = 2)]
    workers: usize,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let bytes = match &args.config {
        Some(path) => std::fs::read(path).map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?,
        None => Vec::new(),
    };
    let config = FilterConfig::parse(&bytes).map_err(|e| anyhow::anyhow!("--config: {e}"))?;
    for warning in config.warnings() {
        tracing::warn!("headroom-epp: {warning}");
    }
    let clusters: HashMap<String, SocketAddr> = args.predictors.into_iter().collect();
    let shared = headroom_epp::start(&config, clusters, args.workers)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        tracing::info!("headroom-epp: serving ext_proc on {}", listener.local_addr()?);
        axum::serve(listener, headroom_epp::grpc::router(shared)).with_graceful_shutdown(terminated()).await?;
        Ok(())
    })
}

/// SIGTERM (how Kubernetes and the local stack stop it) or Ctrl-C.
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
