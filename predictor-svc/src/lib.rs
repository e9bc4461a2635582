//! predictor-svc: the predictor as a service. Its decisions (pools and in-flight books,
//! flow control, features, the prior, the models' serving and training) are
//! predictor-core's, plain Rust on an injected clock; this crate adds the transport, the
//! background tasks and the process.
//!
//! Modules, one job each, layered one way on top of predictor-core: `ort` (ONNX Runtime,
//! the model runtime), `discovery` (EndpointSlices, and starting every Kubernetes watch),
//! `inference_pool` (an InferencePool's pods), `listing` (what both do with a watch's
//! events), `scrape` (engine metrics), `tokens` (the
//! callers' tokens), `auth` (the guard they make of what teaches the model), `state` (what handlers share: the predictor and
//! the process's own state), `heartbeat` (whether each background task goes round), `flow`
//! (the flow-control task), `api` (HTTP: decode, call the service, encode), `stream` (the
//! predict stream, gRPC over HTTP/2), `routes`, and `tasks` (the background tasks,
//! restarted after a panic).

pub mod api;
pub mod auth;
/// The configuration file, parsed in its own crate (`predictor-config/`).
pub use headroom_predictor_config as config;
pub mod discovery;
pub mod flow;
pub mod heartbeat;
pub mod inference_pool;
pub mod listing;
pub mod ort;
pub mod routes;
pub mod scrape;
pub mod state;
pub mod stream;
pub mod tasks;
pub mod tokens;

use std::sync::Arc;

use heartbeat::Task;

/// Serves the API on `listener` and scrapes in the background until `shutdown` resolves.
pub async fn serve(
    config: config::Config,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = Arc::new(state::AppState::new(config)?);
    let watches = discovery::start(state.clone()).await?;
    let background = [
        tasks::supervise(state.clone(), Task::Scraper, scrape::run),
        tasks::supervise(state.clone(), Task::Expiry, scrape::expire),
        tasks::supervise(state.clone(), Task::Trainer, train_loop),
        tasks::supervise(state.clone(), Task::Flow, flow::run),
        tasks::supervise(state.clone(), Task::Tokens, auth::reload),
    ];
    let closing = state.clone();
    let shutdown = async move {
        shutdown.await;
        closing.closing.send_replace(true);
        // The samples go to disk now, not after the drain: requests waiting in the flow
        // queue can hold the drain longer than the pod's grace period, and whatever is
        // killed then must not take the samples since the last training round with it.
        let models = closing.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || models.core.models.persist_samples()).await {
            tracing::error!(error = %e, "persisting samples at shutdown failed");
        }
    };
    // Small answers, each written at once: Nagle's algorithm would hold a stream's answer
    // back until the previous one is acknowledged.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set: {e}");
        }
    });
    let result = axum::serve(listener, routes::router(state.clone())).with_graceful_shutdown(shutdown).await;
    background.iter().for_each(|t| t.abort());
    watches.iter().for_each(|w| w.abort());
    // Again: what the reports during the drain taught.
    state.core.models.persist_samples();
    result.map_err(Into::into)
}

/// Considers retraining every `retrain_interval_ms`, off the request path.
async fn train_loop(state: Arc<state::AppState>) {
    if !state.core.models.trains() {
        return;
    }
    let mut ticker =
        tokio::time::interval(std::time::Duration::from_millis(state.core.config.model.retrain_interval_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        state.heartbeats.beat(Task::Trainer);
        let s = state.clone();
        match tokio::task::spawn_blocking(move || s.core.models.train_if_due()).await {
            Ok(outcome) => state.core.metrics.trained(&outcome),
            Err(e) => tracing::error!(error = %e, "training task failed"),
        }
    }
}
