//! What the model servers' own metrics said during a measurement: whether the engines, not
//! the host or the gateway, were the limit.
//!
//! A router can only matter where requests wait for an engine. On a CPU host the host's busy
//! share cannot say so (an engine that queues keeps its core busy either way), so each
//! measurement samples every server's `vllm:num_requests_waiting` and `_running` (the
//! simulator serves the same names) once a second while it runs, and the report prints
//! them per rung.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use headroom_predictor_core::engine_metrics::parse_engine_metrics;
use serde::{Deserialize, Serialize};

/// Requests waiting and running in the engines over a measurement, per server and sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EngineQueue {
    /// Mean requests waiting in one engine's queue.
    pub waiting_mean: f64,
    /// The most waiting in any engine at any sample.
    pub waiting_max: f64,
    /// Mean requests running in one engine's batch.
    pub running_mean: f64,
    /// Share of the samples in which an engine had requests waiting.
    pub queued_share: f64,
    /// Server samples read.
    pub samples: usize,
}

/// How often the servers are read.
const EVERY: Duration = Duration::from_secs(1);

/// Reads every server's queue once a [`EVERY`] on a thread of its own until [`Sampler::stop`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(f64, f64)>>,
}

impl Sampler {
    pub fn start(servers: Vec<SocketAddr>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                for &server in &servers {
                    let read = headroom_stack::http::get(server, "/metrics");
                    if let Some(sample) = read.ok().filter(|(c, _)| *c == 200).and_then(|(_, body)| queue(&body)) {
                        samples.push(sample);
                    }
                }
                std::thread::sleep(EVERY);
            }
            samples
        });
        Sampler { stop, thread }
    }

    /// Stops sampling: what was read (`None`: nothing, a server that serves no such metric).
    pub fn stop(self) -> Option<EngineQueue> {
        self.stop.store(true, Ordering::Relaxed);
        summarize(&self.thread.join().ok()?)
    }
}

/// `(waiting, running)` of one `/metrics` page, as the predictor reads it (each gauge summed
/// over its series, one per engine of a data-parallel server); `None` when neither is there.
fn queue(page: &str) -> Option<(f64, f64)> {
    parse_engine_metrics(page).filter(|m| m.queue_read).map(|m| (f64::from(m.waiting), f64::from(m.running)))
}

fn summarize(samples: &[(f64, f64)]) -> Option<EngineQueue> {
    if samples.is_empty() {
        return None;
    }
    let n = samples.len() as f64;
    Some(EngineQueue {
        waiting_mean: samples.iter().map(|s| s.0).sum::<f64>() / n,
        waiting_max: samples.iter().map(|s| s.0).fold(0.0, f64::max),
        running_mean: samples.iter().map(|s| s.1).sum::<f64>() / n,
        queued_share: samples.iter().filter(|s| s.0 > 0.0).count() as f64 / n,
        samples: samples.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_gives_its_engines_waiting_and_running_summed() {
        let page = "# HELP vllm:num_requests_waiting w\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 1.0\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 7.0\n\
            vllm:num_requests_waiting_by_reason{reason=\"x\"} 9\n";
        assert_eq!(queue(page), Some((4.0, 7.0)));
        assert_eq!(queue("other_metric 1\n"), None);
    }

    #[test]
    fn samples_summarize_to_means_the_peak_and_the_share_queued() {
        let q = summarize(&[(0.0, 2.0), (4.0, 8.0), (2.0, 8.0), (0.0, 6.0)]).unwrap();
        assert_eq!((q.waiting_mean, q.waiting_max, q.running_mean, q.queued_share, q.samples), (1.5, 4.0, 6.0, 0.5, 4));
        assert_eq!(summarize(&[]), None);
    }
}
