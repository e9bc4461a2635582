//! Driving an engine in simulated time, with no clock and no sockets.
//!
//! A closed loop keeps `concurrency` requests in the engine: when one finishes
//! the next is submitted at that moment. Results are engine-side latencies
//! (the API overhead of the HTTP front is not included). Deterministic, so the
//! calibration and load sweep in `docs/simulator.md` are reproducible exactly.

use std::collections::HashMap;

use crate::engine::{Engine, NewRequest, RequestId};
use crate::profile::Profile;

/// Latencies of one request, in simulated milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub ttft_ms: f64,
    /// `None` for single-token outputs.
    pub tpot_ms: Option<f64>,
}

/// A request shape: prompt and output tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// Result of a closed-loop run.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub latencies: Vec<Latency>,
    pub preemptions: u64,
    /// Simulated duration of the run (ms).
    pub elapsed_ms: f64,
}

struct Live {
    submitted: f64,
    first: Option<f64>,
    tokens: u32,
}

/// Runs `total` requests with `concurrency` in flight; request `i` has shape
/// `shapes[i % shapes.len()]`. The first `warmup` finished requests are not recorded.
pub fn closed_loop(profile: Profile, concurrency: usize, total: usize, warmup: usize, shapes: &[Shape]) -> RunResult {
    let mut engine = Engine::new(profile);
    let mut now = 0.0;
    let mut live: HashMap<RequestId, Live> = HashMap::new();
    let mut next: usize = 0;
    let mut finished = 0usize;
    let mut latencies = Vec::new();
    let submit = |engine: &mut Engine, live: &mut HashMap<RequestId, Live>, next: &mut usize, now: f64| {
        if *next >= total || shapes.is_empty() {
            return;
        }
        let shape = shapes[*next % shapes.len()];
        let id = *next as RequestId;
        engine.submit(NewRequest {
            id,
            prompt_tokens: shape.prompt_tokens,
            max_tokens: shape.output_tokens,
            block_hashes: vec![],
        });
        live.insert(id, Live { submitted: now, first: None, tokens: 0 });
        *next += 1;
    };
    for _ in 0..concurrency {
        submit(&mut engine, &mut live, &mut next, now);
    }
    while let Some(step) = engine.step() {
        now += step.duration_ms;
        for token in step.tokens {
            let Some(l) = live.get_mut(&token.id) else { continue };
            l.tokens = token.index;
            let first = *l.first.get_or_insert(now);
            if token.last {
                let l = live.remove(&token.id).unwrap_or(Live { submitted: now, first: None, tokens: 0 });
                finished += 1;
                if finished > warmup {
                    let tpot = (l.tokens >= 2).then(|| (now - first) / f64::from(l.tokens - 1));
                    latencies.push(Latency { ttft_ms: first - l.submitted, tpot_ms: tpot });
                }
                submit(&mut engine, &mut live, &mut next, now);
            }
        }
    }
    RunResult { latencies, preemptions: engine.counters.preemptions, elapsed_ms: now }
}

pub use headroom_protocol::stats::quantile_in_place as quantile;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_rises_with_concurrency() {
        let shapes = [Shape { prompt_tokens: 1000, output_tokens: 100 }];
        let low = closed_loop(Profile::h100(), 1, 20, 2, &shapes);
        let high = closed_loop(Profile::h100(), 64, 400, 64, &shapes);
        let p50 = |r: &RunResult, f: fn(&Latency) -> Option<f64>| {
            let mut v: Vec<f64> = r.latencies.iter().filter_map(f).collect();
            quantile(&mut v, 0.5)
        };
        assert!(p50(&high, |l| Some(l.ttft_ms)) > p50(&low, |l| Some(l.ttft_ms)));
        assert!(p50(&high, |l| l.tpot_ms) > 1.5 * p50(&low, |l| l.tpot_ms));
        assert_eq!(low.latencies.len(), 18);
    }

    #[test]
    fn a100_is_slower_than_h100() {
        let shapes = [Shape { prompt_tokens: 2000, output_tokens: 50 }];
        let h = closed_loop(Profile::h100(), 8, 40, 8, &shapes);
        let a = closed_loop(Profile::a100(), 8, 40, 8, &shapes);
        assert!(a.elapsed_ms > 1.5 * h.elapsed_ms);
    }
}
