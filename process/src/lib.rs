//! What every long-running headroom service (predictor-svc, the picker) does alike, kept
//! once: its logs, as text for a terminal or one JSON object a line for a cluster's log
//! pipeline (`--log-format`, filtered by `RUST_LOG`, `info` by default), and the signal
//! that begins its shutdown (SIGTERM, as Kubernetes and the local stack send, or Ctrl-C).

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the process's log subscriber: `format`, filtered by `RUST_LOG` (`info` when unset).
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    match format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter).init(),
    }
}

/// Resolves at SIGTERM or Ctrl-C: when the service begins to stop.
pub async fn terminated() {
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
