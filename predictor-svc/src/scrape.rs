//! Scraping the model servers' Prometheus metrics from every endpoint, by each pool's engine
//! (`headroom_predictor_config::engine`: vLLM's series by default).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::heartbeat::Task;
use crate::state::AppState;
use headroom_predictor_config::engine::{self, EngineMetricNames, MetricSpec};
use headroom_predictor_core::pool::{DecodeCounter, EngineMetrics};
use headroom_predictor_core::service::{self, Scraped};

/// vLLM's series (the default engine): what [`parse_engine_metrics`] reads.
pub fn vllm() -> &'static EngineMetricNames {
    static VLLM: std::sync::LazyLock<EngineMetricNames> = std::sync::LazyLock::new(|| {
        engine::resolve(engine::DEFAULT_ENGINE, &[]).unwrap_or_else(|_| EngineMetricNames {
            name: engine::DEFAULT_ENGINE.into(),
            running: Vec::new(),
            waiting: Vec::new(),
            kv_usage: Vec::new(),
            decode_latency: Vec::new(),
        })
    });
    &VLLM
}

/// Reads vLLM's engine metrics from Prometheus text ([`parse_metrics`] with [`vllm`]).
pub fn parse_engine_metrics(text: &str) -> Option<EngineMetrics> {
    parse_metrics(text, vllm())
}

/// Reads an engine's metrics from Prometheus text, by its series (`names`). Series of one
/// name are summed (one per model/engine) except KV usage, of which the highest is kept.
/// Where a field lists several series (a series renamed across versions), the first one
/// present is read, so a server exposing both counts its tokens once. `None` when no known
/// series is present.
pub fn parse_metrics(text: &str, names: &EngineMetricNames) -> Option<EngineMetrics> {
    // Per field, per spec: the sum (or highest) seen, `None` while unseen.
    let mut running: Vec<Option<f64>> = vec![None; names.running.len()];
    let mut waiting: Vec<Option<f64>> = vec![None; names.waiting.len()];
    let mut kv: Vec<Option<f64>> = vec![None; names.kv_usage.len()];
    let mut decode: Vec<Option<DecodeCounter>> = vec![None; names.decode_latency.len()];
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        let (labels, value_text) = match (rest.strip_prefix('{'), rest.rfind('}')) {
            (Some(_), Some(close)) => (&rest[1..close], &rest[close + 1..]),
            _ => ("", rest),
        };
        let Some(value) = value_text.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        let add = |slots: &mut [Option<f64>], specs: &[MetricSpec], combine: fn(f64, f64) -> f64| {
            for (slot, spec) in slots.iter_mut().zip(specs) {
                if spec.matches(series, labels) {
                    *slot = Some(slot.map_or(value, |v| combine(v, value)));
                }
            }
        };
        add(&mut running, &names.running, |a, b| a + b);
        add(&mut waiting, &names.waiting, |a, b| a + b);
        add(&mut kv, &names.kv_usage, f64::max);
        for (slot, base) in decode.iter_mut().zip(&names.decode_latency) {
            match series.strip_prefix(base.as_str()) {
                Some("_sum") => slot.get_or_insert_default().sum_s += value,
                Some("_count") => slot.get_or_insert_default().tokens += value,
                _ => {}
            }
        }
    }
    let first = |slots: &[Option<f64>]| slots.iter().flatten().next().copied();
    let decode = decode.into_iter().flatten().next();
    let (running, waiting, kv) = (first(&running), first(&waiting), first(&kv));
    if running.is_none() && waiting.is_none() && kv.is_none() && decode.is_none() {
        return None;
    }
    Some(EngineMetrics {
        // `as` saturates a huge float.
        running: running.map_or(0, |v| v as u32),
        waiting: waiting.map_or(0, |v| v as u32),
        kv_usage: kv.map_or(0.0, |v| v.min(1.0)),
        decode,
        queue_read: running.is_some() || waiting.is_some(),
    })
}

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
                        let names = engines.get(&pool).cloned().unwrap_or_else(|| std::sync::Arc::new(vllm().clone()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_metrics() {
        let text = "# HELP vllm:num_requests_running Running\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3.0\n\
            vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 2.0\n\
            vllm:num_requests_waiting{model_name=\"m\"} 7\n\
            vllm:kv_cache_usage_perc{model_name=\"m\"} 0.42\n\
            vllm:prompt_tokens_total{model_name=\"m\"} 1e6\n";
        assert_eq!(
            parse_engine_metrics(text),
            Some(EngineMetrics { running: 5, waiting: 7, kv_usage: 0.42, decode: None, queue_read: true })
        );
    }

    #[test]
    fn older_kv_name_and_garbage() {
        assert_eq!(parse_engine_metrics("vllm:gpu_cache_usage_perc 0.5\n").map(|m| m.kv_usage), Some(0.5));
        assert_eq!(parse_engine_metrics("up 1\nnonsense\n{}\n"), None);
        assert_eq!(parse_engine_metrics("vllm:num_requests_running{a=\"}\"} NaN\n"), None);
    }

    #[test]
    fn the_inter_token_histogram_is_read_under_either_name_once() {
        let itl = "vllm:inter_token_latency_seconds_bucket{le=\"0.01\",model_name=\"m\"} 3\n\
            vllm:inter_token_latency_seconds_sum{model_name=\"m\",engine=\"0\"} 1.5\n\
            vllm:inter_token_latency_seconds_sum{model_name=\"m\",engine=\"1\"} 0.5\n\
            vllm:inter_token_latency_seconds_count{model_name=\"m\",engine=\"0\"} 60\n\
            vllm:inter_token_latency_seconds_count{model_name=\"m\",engine=\"1\"} 40\n";
        let decode = |text: &str| parse_engine_metrics(text).and_then(|m| m.decode);
        assert_eq!(decode(itl), Some(DecodeCounter { sum_s: 2.0, tokens: 100.0 }), "summed over engines");
        let older = "vllm:time_per_output_token_seconds_sum 3\nvllm:time_per_output_token_seconds_count 150\n";
        assert_eq!(decode(older), Some(DecodeCounter { sum_s: 3.0, tokens: 150.0 }));
        let both = format!("{itl}{older}");
        assert_eq!(decode(&both), Some(DecodeCounter { sum_s: 2.0, tokens: 100.0 }), "the same tokens, counted once");
        assert_eq!(decode("vllm:num_requests_running 1\n"), None);
    }

    #[test]
    fn each_engine_is_read_by_its_own_series() {
        let sglang = engine::resolve("sglang", &[]).unwrap();
        let text = "sglang:num_running_reqs{model_name=\"m\"} 4\nsglang:num_queue_reqs{model_name=\"m\"} 2\n\
            sglang:token_usage{model_name=\"m\"} 0.25\nvllm:num_requests_running 99\n";
        assert_eq!(
            parse_metrics(text, &sglang),
            Some(EngineMetrics { running: 4, waiting: 2, kv_usage: 0.25, decode: None, queue_read: true })
        );
        let triton = engine::resolve("triton-tensorrt-llm", &[]).unwrap();
        let text = "nv_trt_llm_request_metrics{model=\"t\",request_type=\"scheduled\",version=\"1\"} 3\n\
            nv_trt_llm_request_metrics{model=\"t\",request_type=\"waiting\",version=\"1\"} 5\n\
            nv_trt_llm_request_metrics{model=\"t\",request_type=\"max\",version=\"1\"} 64\n\
            nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\",model=\"t\"} 0.5\n\
            nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\",model=\"t\"} 4096\n";
        assert_eq!(
            parse_metrics(text, &triton),
            Some(EngineMetrics { running: 3, waiting: 5, kv_usage: 0.5, decode: None, queue_read: true })
        );
        assert_eq!(
            parse_metrics("vllm:num_requests_running 2\n", &triton),
            None,
            "another engine's series are not read"
        );
    }

    #[test]
    fn huge_values_saturate() {
        let text = "vllm:num_requests_running 1e300\nvllm:num_requests_running 5e9\nvllm:kv_cache_usage_perc 7\n";
        assert_eq!(
            parse_engine_metrics(text),
            Some(EngineMetrics { running: u32::MAX, waiting: 0, kv_usage: 1.0, decode: None, queue_read: true })
        );
    }
}
