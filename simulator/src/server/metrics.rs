//! What a simulated server's `/metrics` shows: vLLM's gauges, counters and
//! latency histograms (in simulated seconds, with vLLM's buckets), and the
//! simulator's own count of requests that arrived carrying gateway routing hints.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use axum::http::HeaderMap;
use headroom_protocol::headers as names;

use crate::engine::Engine;
use crate::histogram::Histogram;

/// A snapshot of engine gauges and counters for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
struct Gauges {
    running: usize,
    waiting: usize,
    kv_usage: f64,
    counters: crate::engine::Counters,
}

/// Request latency histograms, in simulated seconds, with vLLM's buckets.
pub struct Latencies {
    pub ttft: Histogram,
    pub inter_token: Histogram,
    pub e2e: Histogram,
}

impl Latencies {
    fn new() -> Self {
        Latencies {
            ttft: Histogram::new(&[
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0,
            ]),
            inter_token: Histogram::new(&[
                0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0,
            ]),
            e2e: Histogram::new(&[
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                960.0, 1920.0, 7680.0,
            ]),
        }
    }
}

/// Everything `/metrics` renders, updated by the engine driver and the HTTP handlers.
pub struct Telemetry {
    gauges: Mutex<Gauges>,
    latencies: Mutex<Latencies>,
    /// Requests that arrived still carrying a gateway routing hint header.
    leaked_hints: AtomicU64,
}

impl Telemetry {
    pub fn new() -> Telemetry {
        Telemetry {
            gauges: Mutex::new(Gauges::default()),
            latencies: Mutex::new(Latencies::new()),
            leaked_hints: AtomicU64::new(0),
        }
    }

    /// Takes the engine's gauges and counters after a step.
    pub fn publish(&self, engine: &Engine) {
        let mut g = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        *g = Gauges {
            running: engine.num_running(),
            waiting: engine.num_waiting(),
            kv_usage: engine.kv_usage(),
            counters: engine.counters,
        };
    }

    /// The latency histograms, to record a step's tokens.
    pub fn latencies(&self) -> MutexGuard<'_, Latencies> {
        self.latencies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a request that still carries SLO/priority headers: a gateway routes by
    /// them and must not forward them to model servers.
    pub fn count_leaked_hints(&self, headers: &HeaderMap) {
        if headers.keys().any(|k| names::is_routing_hint(k.as_str(), names::PRIORITY)) {
            self.leaked_hints.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The `/metrics` text for a server of `model`.
    pub fn render(&self, model: &str) -> String {
        let g = *self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        let c = g.counters;
        let labels = format!("model_name=\"{model}\"");
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}\n"));
        };
        metric("vllm:num_requests_running", "gauge", "Requests in the running batch.", g.running.to_string());
        metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", g.waiting.to_string());
        metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 = full.", format!("{:.6}", g.kv_usage));
        metric(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            c.prefix_queries.to_string(),
        );
        metric(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            c.prefix_hits.to_string(),
        );
        metric("vllm:num_preemptions_total", "counter", "Requests preempted (KV full).", c.preemptions.to_string());
        metric("vllm:prompt_tokens_total", "counter", "Prompt tokens received.", c.prompt_tokens.to_string());
        metric("vllm:generation_tokens_total", "counter", "Tokens generated.", c.generation_tokens.to_string());
        let leaked = self.leaked_hints.load(Ordering::Relaxed).to_string();
        metric(
            "sim:requests_with_routing_hints_total",
            "counter",
            "Requests that arrived with SLO/priority routing headers (a gateway should strip them).",
            leaked,
        );
        let lat = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        lat.ttft.render(&mut out, "vllm:time_to_first_token_seconds", "Time to first token (simulated s).", &labels);
        lat.inter_token.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Time between tokens (simulated s).",
            &labels,
        );
        lat.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency (simulated s).",
            &labels,
        );
        out
    }
}
