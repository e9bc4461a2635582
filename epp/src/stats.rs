//! The picker's stats: the filter core's table (`headroom_filter_core::stats`) as
//! Prometheus metrics on `/metrics`, named as Envoy names the Wasm filter's
//! (`headroom_<name>`, dots as underscores), so one dashboard reads either mode.
//! Histograms keep Envoy's default buckets.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use headroom_filter_core::host::Event;
use headroom_filter_core::stats::{self, Kind};
use headroom_protocol::build;

/// Envoy's default histogram bucket bounds (milliseconds here).
const BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0, 300000.0,
    600000.0, 1800000.0, 3600000.0,
];

#[derive(Debug, Default)]
struct Histogram {
    /// Counts per bucket of [`BUCKETS`] (not cumulative), then one past the last.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum: AtomicU64,
    count: AtomicU64,
}

#[derive(Debug)]
enum Metric {
    Counter(AtomicU64),
    Histogram(Box<Histogram>),
}

/// Every stat of every worker (they share it).
#[derive(Debug)]
pub struct Stats {
    metrics: HashMap<&'static str, Metric>,
    /// ext_proc streams open now.
    open_streams: AtomicU64,
    /// Workers restarted after a panic.
    worker_restarts: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        let metrics = stats::all()
            .map(|(name, kind)| {
                let metric = match kind {
                    Kind::Counter => Metric::Counter(AtomicU64::new(0)),
                    Kind::Histogram => Metric::Histogram(Box::default()),
                };
                (name, metric)
            })
            .collect();
        Stats { metrics, open_streams: AtomicU64::new(0), worker_restarts: AtomicU64::new(0) }
    }
}

impl Stats {
    pub fn record(&self, event: Event) {
        stats::record(event, |name, amount| match self.metrics.get(name) {
            Some(Metric::Counter(c)) => {
                c.fetch_add(amount, Ordering::Relaxed);
            }
            Some(Metric::Histogram(h)) => {
                let i = BUCKETS.iter().position(|&b| amount as f64 <= b).unwrap_or(BUCKETS.len());
                h.buckets[i].fetch_add(1, Ordering::Relaxed);
                h.sum.fetch_add(amount, Ordering::Relaxed);
                h.count.fetch_add(1, Ordering::Relaxed);
            }
            None => {}
        });
    }

    /// A stream opened (`true`) or ended.
    pub fn stream(&self, open: bool) {
        if open {
            self.open_streams.fetch_add(1, Ordering::Relaxed);
        } else {
            self.open_streams.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A worker's step panicked; it restarted with a fresh VM.
    pub fn worker_restarted(&self) {
        self.worker_restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every stat.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut names: Vec<&&str> = self.metrics.keys().collect();
        names.sort();
        for name in names {
            let prom = format!("headroom_{}", name.replace('.', "_"));
            match &self.metrics[*name] {
                Metric::Counter(c) => {
                    let _ = writeln!(out, "# TYPE {prom} counter\n{prom} {}", c.load(Ordering::Relaxed));
                }
                Metric::Histogram(h) => {
                    let _ = writeln!(out, "# TYPE {prom} histogram");
                    let mut cumulative = 0;
                    for (i, bound) in BUCKETS.iter().enumerate() {
                        cumulative += h.buckets[i].load(Ordering::Relaxed);
                        let _ = writeln!(out, "{prom}_bucket{{le=\"{bound}\"}} {cumulative}");
                    }
                    cumulative += h.buckets[BUCKETS.len()].load(Ordering::Relaxed);
                    let _ = writeln!(out, "{prom}_bucket{{le=\"+Inf\"}} {cumulative}");
                    let _ = writeln!(out, "{prom}_sum {}", h.sum.load(Ordering::Relaxed));
                    let _ = writeln!(out, "{prom}_count {}", h.count.load(Ordering::Relaxed));
                }
            }
        }
        let streams = stats::PICKER_OPEN_STREAMS;
        let _ = writeln!(out, "# TYPE {streams} gauge\n{streams} {}", self.open_streams.load(Ordering::Relaxed));
        let restarts = stats::PICKER_WORKER_RESTARTS;
        let _ = writeln!(out, "# TYPE {restarts} counter\n{restarts} {}", self.worker_restarts.load(Ordering::Relaxed));
        let (info, help) = (build::BUILD_INFO, build::BUILD_INFO_HELP);
        let labels: Vec<String> = build::build_labels("picker").iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        let _ = writeln!(out, "# HELP {info} {help}\n# TYPE {info} gauge\n{info}{{{}}} 1", labels.join(","));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scrape says which build answers it, under the predictor's series name.
    #[test]
    fn the_build_is_a_series() {
        let text = Stats::default().render();
        let line = format!(r#"{}{{component="picker",version="{}"}} 1"#, build::BUILD_INFO, build::VERSION);
        assert!(text.lines().any(|l| l == line), "{text}");
    }
}
