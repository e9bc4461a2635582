//! `headroom-epp`: serves Envoy's ext_proc on `--listen`, deciding with the filter's
//! configuration (`--config`, the JSON `docs/configuration.md` describes) and calling the
//! predictor clusters it names at the addresses `--predictor` gives.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Parser;
use headroom_epp::grpc::StreamLimits;
use headroom_filter_core::FilterConfig;
use headroom_process::LogFormat;

#[derive(Parser)]
#[command(version, name = "headroom-epp", about = "headroom's endpoint picker over Envoy ext_proc")]
struct Args {
    /// Where to serve ext_proc, gRPC health and /metrics (HTTP/2 cleartext and HTTP/1.1).
    #[arg(long, default_value = "127.0.0.1:9002")]
    listen: SocketAddr,
    /// The filter configuration (JSON); absent, the filter's defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A predictor cluster of the configuration and where it is:
    /// `headroom_predictor=headroom-predictor:9000` (repeated for shards).
    #[arg(long = "predictor", value_parser = headroom_epp::parse_cluster)]
    predictors: Vec<(String, String)>,
    /// A file holding the predictor's token (a mounted Secret), in place of the
    /// configuration's `predictor_token`.
    #[arg(long)]
    predictor_token_file: Option<PathBuf>,
    /// Worker threads, each with its own VM (as Envoy's workers have).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// ext_proc streams held at once (one per request in flight through the gateway); more
    /// are refused RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = StreamLimits::default().max_streams)]
    max_streams: usize,
    /// The longest wait for Envoy's next message on a stream (s); as long as the gateway's
    /// stream idle timeout.
    #[arg(long, default_value_t = StreamLimits::default().idle.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    stream_idle_timeout_s: u64,
    /// The longest one stream lives (s): a request's whole life.
    #[arg(long, default_value_t = StreamLimits::default().total.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    stream_max_duration_s: u64,
    /// On SIGTERM, how long to answer health checks NOT_SERVING (and `/readyz` 503) while
    /// still serving, so probes and the gateway move new streams elsewhere first (s).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=3_600))]
    drain_delay_s: u64,
    /// Then, how long the streams under way may take to end before the picker exits
    /// anyway (s): with the delay, within Kubernetes' 30 s grace period by default.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=3_600))]
    drain_timeout_s: u64,
    /// Log lines as text, or as one JSON object each (for a cluster's log pipeline).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    headroom_process::init_logs(args.log_format);
    let bytes = match &args.config {
        Some(path) => std::fs::read(path).map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?,
        None => Vec::new(),
    };
    let mut config = FilterConfig::parse(&bytes).map_err(|e| anyhow::anyhow!("--config: {e}"))?;
    if let Some(path) = &args.predictor_token_file {
        let token = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--predictor-token-file {}: {e}", path.display()))?;
        anyhow::ensure!(!token.trim().is_empty(), "--predictor-token-file {}: empty", path.display());
        config.predictor_token = Some(token.trim().to_string());
    }
    for warning in config.warnings() {
        tracing::warn!("headroom-epp: {warning}");
    }
    let clusters: HashMap<String, String> = args.predictors.into_iter().collect();
    anyhow::ensure!(args.max_streams >= 1, "--max-streams must be at least 1");
    let limits = StreamLimits {
        max_streams: args.max_streams,
        idle: Duration::from_secs(args.stream_idle_timeout_s),
        total: Duration::from_secs(args.stream_max_duration_s),
    };
    let shared = headroom_epp::start(&config, clusters, args.workers, limits)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        tracing::info!("headroom-epp: serving ext_proc on {}", listener.local_addr()?);
        // Each answer is a small frame Envoy waits for: without TCP_NODELAY, Nagle's
        // algorithm holds it behind the last one's delayed ACK (40 ms a request, measured).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!("headroom-epp: TCP_NODELAY not set: {e}");
            }
        });
        let draining = shared.draining.clone();
        let (drain_delay, drain_timeout) =
            (Duration::from_secs(args.drain_delay_s), Duration::from_secs(args.drain_timeout_s));
        let (closing, mut closed) = tokio::sync::watch::channel(false);
        let shutdown = async move {
            headroom_process::terminated().await;
            draining.store(true, Ordering::SeqCst);
            tracing::info!("headroom-epp: draining: NOT_SERVING for {drain_delay:?}, then closing");
            tokio::time::sleep(drain_delay).await;
            let _ = closing.send(true);
        };
        let served = axum::serve(listener, headroom_epp::grpc::router(shared)).with_graceful_shutdown(shutdown);
        tokio::select! {
            served = served => served?,
            _ = async {
                let _ = closed.wait_for(|c| *c).await;
                tokio::time::sleep(drain_timeout).await;
            } => tracing::warn!("headroom-epp: streams still open after {drain_timeout:?}; exiting"),
        }
        Ok(())
    })
}
