//! Bursts of SLO-routed completions through a gateway, each request on its own thread,
//! and what each saw: the flow-control tests' client (`tests/flow.rs`, `tests/make_up_down.rs`).

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use headroom_protocol::headers::{DEBUG_FLOW, DEBUG_QUEUED, DROPPED_REASON};
use serde_json::json;

/// What one request saw, timed from its send.
#[derive(Debug, Clone)]
pub struct Seen {
    pub status: u16,
    /// Time to the first body bytes: for a stream, the client-side TTFT (queue wait included).
    pub first_byte: Duration,
    pub retry_after: Option<String>,
    /// `x-headroom-queued-ms`: it waited in the predictor's queue this long.
    pub queued_ms: Option<f64>,
    /// `x-headroom-flow`: how it left the queue (`released`, `expired`).
    pub flow: Option<String>,
    /// `x-llm-d-request-dropped-reason`, on the gateway's own 429s.
    pub dropped_reason: Option<String>,
    pub sent: Instant,
}

impl Seen {
    /// When it left the queue, if it waited there.
    pub fn left_queue(&self) -> Option<Instant> {
        self.queued_ms.map(|ms| self.sent + Duration::from_secs_f64(ms / 1000.0))
    }

    pub fn released(&self) -> bool {
        self.flow.as_deref() == Some("released")
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A completion through the gateway; `slo` = (TTFT SLO ms, priority) routes it by SLO.
pub fn send(gateway: &str, prompt_tokens: usize, max_tokens: u32, slo: Option<(u32, i32)>, timeout: Duration) -> Seen {
    let started = Instant::now();
    let client = reqwest::blocking::Client::builder().timeout(timeout).build().expect("client");
    // A different first block per request: no prompt finds another's prefix cached.
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let prompt = format!("request {n:>08} of this test. {}", "word ".repeat(prompt_tokens * 4 / 5));
    let body = json!({"model": "sim-llama-8b", "prompt": prompt,
                      "max_tokens": max_tokens, "stream": true});
    let mut req = client.post(format!("{gateway}/v1/completions")).header("content-type", "application/json");
    if let Some((ttft, priority)) = slo {
        req = req
            .header("x-slo-ttft-ms", ttft.to_string())
            .header("x-request-priority", priority.to_string())
            .header("x-prediction-based-scheduling", "true");
    }
    match req.body(body.to_string()).send() {
        Ok(mut r) => {
            let status = r.status().as_u16();
            let header = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            let retry_after = header("retry-after");
            let queued_ms = header(DEBUG_QUEUED).and_then(|v| v.parse().ok());
            let flow = header(DEBUG_FLOW);
            let dropped_reason = header(DROPPED_REASON);
            let mut first = [0u8; 1];
            let _ = r.read(&mut first);
            let first_byte = started.elapsed();
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
            Seen { status, first_byte, retry_after, queued_ms, flow, dropped_reason, sent: started }
        }
        Err(_) => Seen {
            status: 0,
            first_byte: started.elapsed(),
            retry_after: None,
            queued_ms: None,
            flow: None,
            dropped_reason: None,
            sent: started,
        },
    }
}

/// `headroom_flow_queued_requests` summed over bands, from the predictor's metrics text.
pub fn queued(predictor_metrics: &str) -> f64 {
    predictor_metrics
        .lines()
        .filter(|l| l.starts_with("headroom_flow_queued_requests{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sends `n` requests of `tokens` prompt tokens at once, each on its own thread: SLO-routed
/// with `(ttft_slo_ms, priority)`, or without SLO headers (`None`: placed at once, never queued).
pub fn spawn(
    gateway: &str,
    n: usize,
    tokens: usize,
    max_tokens: u32,
    slo: Option<(u32, i32)>,
) -> Vec<std::thread::JoinHandle<Seen>> {
    (0..n)
        .map(|_| {
            let g = gateway.to_string();
            std::thread::spawn(move || send(&g, tokens, max_tokens, slo, Duration::from_secs(120)))
        })
        .collect()
}

pub fn join(threads: Vec<std::thread::JoinHandle<Seen>>) -> Vec<Seen> {
    threads.into_iter().map(|t| t.join().expect("client thread")).collect()
}
