//! predictor-svc: knows each pool's endpoints, scrapes their engine metrics,
//! tracks requests in flight, and predicts TTFT/TPOT for every candidate.
//!
//! Modules, one job each: `config` (file format), `pool` (endpoint state and
//! in-flight tracking), `scrape` (vLLM metrics), `predict` (the prior), `api` (HTTP), `metrics`
//! (Prometheus), `state` (what handlers share).

pub mod api;
pub mod config;
pub mod metrics;
pub mod model;
pub mod pool;
pub mod predict;
pub mod scrape;
pub mod state;

use std::sync::Arc;

/// Serves the API on `listener` and scrapes in the background until `shutdown` resolves.
pub async fn serve(
    config: config::Config,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = Arc::new(state::AppState::new(config));
    let scraper = tokio::spawn(scrape::run(state.clone()));
    let result = axum::serve(listener, api::router(state)).with_graceful_shutdown(shutdown).await;
    scraper.abort();
    result.map_err(Into::into)
}
