//! predictor-svc: knows each pool's endpoints, scrapes their engine metrics,
//! tracks requests in flight, and predicts TTFT/TPOT for every candidate.
//!
//! Modules, one job each, layered one way: `config` (the file format, its own
//! crate) at the bottom; `pool` (endpoint state and in-flight tracking),
//! `discovery` (EndpointSlices), `scrape` (vLLM metrics), `model` (features, the
//! analytic prior, training, ONNX export and inference, the model store);
//! `service` (what each route does), `flow` (the flow-control queue, its decisions and admission), `auth` (the token guarding what teaches the
//! model), `api` (HTTP: decode, call `service`, encode), `stream` (the predict stream, gRPC over HTTP/2), `metrics` (Prometheus),
//! `clock` (the time every decision reads), `state` (what handlers share), `heartbeat` (whether each background task goes round),
//! `tasks` (the background tasks, restarted after a panic).

pub mod api;
pub mod auth;
pub mod clock;
/// The configuration file, parsed in its own crate (`predictor-config/`).
pub use headroom_predictor_config as config;
pub mod discovery;
pub mod flow;
pub mod heartbeat;
pub mod metrics;
pub mod model;
pub mod pool;
pub mod routes;
pub mod scrape;
pub mod service;
pub mod state;
pub mod stream;
pub mod tasks;

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
        tasks::supervise(state.clone(), Task::Flow, flow::admission::run),
    ];
    let closing = state.clone();
    let shutdown = async move {
        shutdown.await;
        closing.closing.send_replace(true);
        // The samples go to disk now, not after the drain: requests waiting in the flow
        // queue can hold the drain longer than the pod's grace period, and whatever is
        // killed then must not take the samples since the last training round with it.
        let models = closing.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || models.models.persist_samples()).await {
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
    state.models.persist_samples();
    result.map_err(Into::into)
}

/// Considers retraining every `retrain_interval_ms`, off the request path.
async fn train_loop(state: Arc<state::AppState>) {
    if !state.models.trains() {
        return;
    }
    let mut ticker = tokio::time::interval(std::time::Duration::from_millis(state.config.model.retrain_interval_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        state.heartbeats.beat(Task::Trainer);
        let s = state.clone();
        match tokio::task::spawn_blocking(move || s.models.train_if_due()).await {
            Ok(outcome) => state.metrics.trained(&outcome),
            Err(e) => tracing::error!(error = %e, "training task failed"),
        }
    }
}
