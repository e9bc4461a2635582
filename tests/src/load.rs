//! Steady traffic for the fault tests: a few clients sending completions back to back
//! while a test breaks something, every outcome kept with its time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_protocol::headers as names;

/// What one request of the load got.
#[derive(Debug, Clone)]
pub struct Sent {
    /// When it was sent and when its response ended.
    pub at: Instant,
    pub done: Instant,
    /// HTTP status (0: no response).
    pub status: u16,
    /// The response broke off or never came.
    pub error: Option<String>,
    /// `x-served-by` (the model server that answered).
    pub served_by: Option<String>,
    /// `x-headroom-tier`: how the filter chose (positive, negative, fallback, ...).
    pub tier: Option<String>,
    /// `x-headroom-endpoint`: the filter's choice (and its fallbacks, comma-separated).
    pub chosen: Option<String>,
    /// The chosen endpoint's predicted TTFT and TPOT (debug headers), when it had them.
    pub predicted: (Option<String>, Option<String>),
}

impl Sent {
    /// A whole 200 response.
    pub fn ok(&self) -> bool {
        self.status == 200 && self.error.is_none()
    }
}

/// Clients sending until [`SteadyLoad::stop`].
pub struct SteadyLoad {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Sent>>>,
}

impl SteadyLoad {
    /// `clients` threads, each sending a completion of `max_tokens` (streamed when `stream`)
    /// with the SLO headers, then pausing `pause`, until stopped.
    pub fn start(gateway: String, clients: usize, max_tokens: u32, stream: bool, pause: Duration) -> SteadyLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..clients)
            .map(|c| {
                let (stop, gateway) = (stop.clone(), gateway.clone());
                std::thread::spawn(move || client(&gateway, c, max_tokens, stream, pause, &stop))
            })
            .collect();
        SteadyLoad { stop, threads }
    }

    /// Stops sending, waits for the requests under way, and returns every outcome in time order.
    pub fn stop(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all: Vec<Sent> = self.threads.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect();
        all.sort_by_key(|s| s.at);
        all
    }
}

fn client(gateway: &str, c: usize, max_tokens: u32, stream: bool, pause: Duration, stop: &AtomicBool) -> Vec<Sent> {
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let mut out = Vec::new();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let body = serde_json::json!({
            "model": "sim-llama-8b",
            "prompt": format!("client {c} request {i}: {}", "tell me about the fox and the dog. ".repeat(1 + i % 20)),
            "max_tokens": max_tokens,
            "stream": stream,
            "stream_options": {"include_usage": stream},
        });
        let at = Instant::now();
        let sent = http
            .post(format!("{gateway}/v1/completions"))
            .header("content-type", "application/json")
            .header("x-slo-ttft-ms", "2000")
            .header("x-slo-tpot-ms", "100")
            .header(names::PREDICTION_BASED, "true")
            .body(body.to_string())
            .send();
        let mut outcome = Sent {
            at,
            done: at,
            status: 0,
            error: None,
            served_by: None,
            tier: None,
            chosen: None,
            predicted: (None, None),
        };
        match sent {
            Ok(r) => {
                let h = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
                outcome.status = r.status().as_u16();
                (outcome.served_by, outcome.tier) = (h(names::SERVED_BY), h(names::DEBUG_TIER));
                outcome.chosen = h(names::DEBUG_ENDPOINT);
                outcome.predicted = (h(names::DEBUG_PREDICTED_TTFT), h(names::DEBUG_PREDICTED_TPOT));
                match r.text() {
                    // A stream that ended without `[DONE]` was cut off.
                    Ok(text) if stream && outcome.status == 200 && !text.contains("[DONE]") => {
                        outcome.error = Some("stream ended without [DONE]".into());
                    }
                    Ok(_) => {}
                    Err(e) => outcome.error = Some(format!("body: {e}")),
                }
            }
            Err(e) => outcome.error = Some(e.to_string()),
        }
        outcome.done = Instant::now();
        out.push(outcome);
        std::thread::sleep(pause);
    }
    out
}
