//! `headroom-sim --server 127.0.0.1:8001 --server 127.0.0.1:8002=a100 [--time-scale 1]`
//! (`--server 127.0.0.1:8003=h100:sim-llama-70b`: a server of another model than `--model`)
//!
//! Runs several simulated model servers in one process, one port each, each
//! with its own engine and hardware profile.

use std::net::SocketAddr;

use clap::Parser;
use headroom_sim::profile::Profile;
use headroom_sim::server::{self, ServerConfig};

#[derive(Parser)]
#[command(version, about = "Simulated vLLM-compatible model servers")]
struct Args {
    /// A server as `ip:port`, `ip:port=profile` (profiles: h100, a100, engine-bound) or
    /// `ip:port=profile:model` (it serves `model` instead of `--model`). Repeatable.
    #[arg(long = "server", required = true)]
    servers: Vec<String>,
    /// Model name served.
    #[arg(long, default_value = "sim-llama-8b")]
    model: String,
    /// Simulated time runs this many times faster than real time.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
}

fn parse_server(spec: &str, model: &str, time_scale: f64) -> anyhow::Result<ServerConfig> {
    let (addr, profile) = match spec.split_once('=') {
        Some((a, p)) => (a, p),
        None => (spec, "h100"),
    };
    let (profile, model) = match profile.split_once(':') {
        Some((_, m)) if m.trim().is_empty() => anyhow::bail!("--server {spec:?}: an empty model name"),
        Some((p, m)) => (p, m),
        None => (profile, model),
    };
    let address: SocketAddr =
        addr.parse().map_err(|_| anyhow::anyhow!("--server {spec:?}: {addr:?} is not ip:port"))?;
    let profile = Profile::by_name(profile).ok_or_else(|| {
        anyhow::anyhow!("--server {spec:?}: unknown profile {profile:?} ({})", Profile::NAMES.join(", "))
    })?;
    Ok(ServerConfig { address, profile, model: model.to_string(), time_scale })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    anyhow::ensure!(args.time_scale.is_finite() && args.time_scale > 0.0, "--time-scale must be > 0");
    let configs = args
        .servers
        .iter()
        .map(|s| parse_server(s, &args.model, args.time_scale))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for config in configs {
        let listener = tokio::net::TcpListener::bind(config.address)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.address))?;
        tracing::info!(address = %config.address, profile = config.profile.name, "simulated server started");
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(server::serve(config, listener, async move {
            let _ = stop.changed().await;
        })));
    }
    wait_for_signal().await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
