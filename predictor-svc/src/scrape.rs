//! Scraping the model servers' Prometheus metrics from every endpoint, by each pool's engine
//! (`headroom_predictor_config::engine`: vLLM's series by default).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::heartbeat::Task;
use crate::state::AppState;
use headroom_predictor_config::engine::{self, EngineMetricNames};
use headroom_predictor_core::engine_metrics::parse_metrics;
use headroom_predictor_core::pool::EngineMetrics;
use headroom_predictor_core::service::{self, Scraped};

/// Scrapes every endpoint of every pool forever, one request per endpoint per interval.
///
/// Each endpoint is on its own clock: a scrape's result is applied, stamped with when it
/// arrived, as soon as it arrives, and an endpoint whose last scrape is still under way is
/// skipped on the next tick. So one server whose `/metrics` hangs until `scrape_timeout_ms`
/// only makes its own metrics stale; the others are refreshed every interval as before
/// (with one barrier per round, a hung server slowed every endpoint's refresh to the
/// timeout and stamped their metrics later than they were read).
pub async fn run(state: Arc<AppState>) {
    let interval = Duration::from_millis(state.core.config.scrape_interval_ms);
    let client = match scrape_client(Duration::from_millis(state.core.config.scrape_timeout_ms)) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the scrape client; endpoint metrics stay unknown");
            return;
        }
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running = futures_util::stream::FuturesUnordered::new();
    let mut busy: HashSet<(String, String)> = HashSet::new();
    // Ready once every endpoint known at the first tick has been tried once.
    let mut first_round: Option<usize> = None;
    // Each pool's engine series (checked when the configuration was read).
    let engines: std::collections::HashMap<String, Arc<EngineMetricNames>> = state
        .core
        .config
        .pools
        .iter()
        .filter_map(|p| {
            let names = engine::resolve(&p.engine, &state.core.config.engines).ok()?;
            Some((p.name.clone(), Arc::new(names)))
        })
        .collect();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                state.heartbeats.beat(Task::Scraper);
                let mut started = 0;
                for pool in state.core.pools.names() {
                    let addresses = state.core.pools.with(&pool, |p| {
                        p.endpoints.iter().map(|e| (e.address.clone(), e.max_context_tokens.is_some())).collect::<Vec<_>>()
                    });
                    for (address, context_known) in addresses.unwrap_or_default() {
                        if !busy.insert((pool.clone(), address.clone())) {
                            continue;
                        }
                        let (client, pool) = (client.clone(), pool.clone());
                        let max_bytes = state.core.config.max_scrape_bytes;
                        let names = engines.get(&pool).cloned().unwrap_or_else(|| std::sync::Arc::new(headroom_predictor_core::engine_metrics::vllm().clone()));
                        running.push(async move {
                            let result = scrape_one(&client, &address, max_bytes, &names).await;
                            // Its model and context length once, when it first answers: a
                            // server's model does not change while it runs.
                            let context = match (&result, context_known) {
                                (Ok(_), false) => served(&client, &address).await,
                                _ => None,
                            };
                            (pool, address, result, context)
                        });
                        started += 1;
                    }
                }
                if first_round.is_none() {
                    first_round = Some(started);
                }
            }
            Some((pool, address, result, context)) = running.next(), if !running.is_empty() => {
                busy.remove(&(pool.clone(), address.clone()));
                apply(&state, &pool, &address, &result, state.core.clock.now());
                if let Some((model, tokens)) = context {
                    // Requests for the model it serves get series of their own on /metrics.
                    state.core.metrics.model_served(&model);
                    state.core.pools.with(&pool, |p| {
                        if let Some(e) = p.endpoints.iter_mut().find(|e| e.address == address) {
                            e.max_context_tokens = tokens;
                        }
                    });
                }
                first_round = first_round.map(|n| n.saturating_sub(1));
            }
        }
        if first_round == Some(0) {
            state.scraped_once.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Why a scrape failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeError {
    /// Nothing accepted the connection: the server is down, not merely slow or odd.
    pub unreachable: bool,
    pub message: String,
}

impl ScrapeError {
    fn failed(message: impl Into<String>) -> ScrapeError {
        ScrapeError { unreachable: false, message: message.into() }
    }
}

impl std::fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Files one scrape's result (`service::scraped` decides what it means), logging failures
/// at 1, 2, 4, 8... in a row so a dead server does not flood the log.
fn apply(state: &AppState, pool: &str, address: &str, result: &Result<EngineMetrics, ScrapeError>, now: Instant) {
    let scraped = match result {
        Ok(m) => Scraped::Metrics(*m),
        Err(e) if e.unreachable => Scraped::Unreachable,
        Err(_) => Scraped::Failed,
    };
    if let (Some(failures), Err(err)) = (service::scraped(&state.core, pool, address, scraped, now), result) {
        if failures.is_power_of_two() {
            tracing::warn!(pool = %pool, endpoint = %address, error = %err, failures, "scrape failed");
        }
    }
}

/// Forgets requests never reported (`pool::Expiry`) and old finished ids, every second,
/// on its own ticker: tracking stays bounded even while every scrape fails or hangs.
pub async fn expire(state: Arc<AppState>) {
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        state.heartbeats.beat(Task::Expiry);
        for (pool, expired) in service::expire(&state.core, state.core.clock.now()) {
            tracing::warn!(pool = %pool, expired, "in-flight requests never reported were forgotten");
        }
    }
}

/// The model the server at `address` serves and its context length (the first model of its
/// `/v1/models` and its `max_model_len`, as vLLM and the simulator list them); `None` when it
/// lists none.
async fn served(client: &reqwest::Client, address: &str) -> Option<(String, Option<u32>)> {
    let response = client.get(format!("http://{address}/v1/models")).send().await.ok()?;
    let bytes = response.bytes().await.ok().filter(|b| b.len() <= 1 << 20)?;
    headroom_protocol::openai::served_model(&bytes)
}

/// One scrape; the body is read only up to `max_bytes` (a larger one fails the scrape).
/// The client every scrape uses: bounded by `timeout`, and following no redirect. A model
/// server's `/metrics` answers itself; one that redirects (a compromised or misconfigured
/// server) would otherwise have the predictor fetch, and trust as that server's load,
/// whatever address it names.
pub fn scrape_client(timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).build()
}

pub async fn scrape_one(
    client: &reqwest::Client,
    address: &str,
    max_bytes: usize,
    names: &EngineMetricNames,
) -> Result<EngineMetrics, ScrapeError> {
    let mut response = client
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .map_err(|e| ScrapeError { unreachable: e.is_connect(), message: e.to_string() })?;
    if !response.status().is_success() {
        return Err(ScrapeError::failed(format!("status {}", response.status())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| ScrapeError::failed(e.to_string()))? {
        if body.len() + chunk.len() > max_bytes {
            return Err(ScrapeError::failed(format!("/metrics body over max_scrape_bytes ({max_bytes})")));
        }
        body.extend_from_slice(&chunk);
    }
    parse_metrics(&String::from_utf8_lossy(&body), names)
        .ok_or_else(|| ScrapeError::failed(format!("none of engine {}'s series in /metrics", names.name)))
}
