//! `headroom-bench soak` (`make soak SOAK_S=...`): steady mixed traffic for a long time,
//! watching for what only time shows.
//!
//! One stack (2 H100 + 1 A100 simulated, predictor-svc, Envoy with the filter) takes the
//! mixed workload open-loop at a rate about 70% of that fleet's capacity. Every
//! `sample_s` seconds the predictor's and Envoy's resident memory and the filter's Wasm
//! memory (the `headroom.vm_memory_bytes` gauge, all workers' VMs together) are sampled.
//! The run fails when
//! - memory at the end is more than [`MAX_GROWTH`] above memory just after the warm-up,
//!   for any of the three;
//! - any request failed because of headroom (no answer, or a 5xx: the simulated servers
//!   themselves do not fail);
//! - the predictor's books do not balance once traffic stopped: every dispatch it accepted
//!   was reported, is still in flight, or expired (`in_flight_ttl_s`). Nothing else may
//!   become of a request.
//!
//! It prints a line per sample as it goes, one summary line at the end, and writes
//! `samples.csv`, `memory.svg` and `soak.json`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use headroom_loadgen::{chart, runner, workload};
use headroom_predictor_config::Config as PredictorConfig;
use headroom_stack::http::{metric_sum, metric_with};
use headroom_stack::{process, Stack, StackOptions};

/// Largest memory growth after warm-up that passes.
pub const MAX_GROWTH: f64 = 0.10;

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// Seconds of traffic, warm-up included.
    pub seconds: f64,
    /// Seconds before the memory baseline is taken (buffers, reservoirs and pools fill).
    pub warmup_s: f64,
    /// Offered load, requests/s (the default is about 70% of the fleet's capacity).
    pub rate: f64,
    /// Seconds between memory samples.
    pub sample_s: f64,
    pub profiles: Vec<String>,
    pub seed: u64,
    /// Shrink the predictor's bounded stores (prefix blocks per endpoint, observation log,
    /// sample reservoir) so they fill within a short warm-up: the 2-minute soak of `make test` then sees any growth
    /// beyond its bounds, where with the defaults it would still see them filling.
    pub small_caps: bool,
    pub run_dir: PathBuf,
    pub out: PathBuf,
}

/// The warm-up of a run of `seconds`: a third of it, at most 10 minutes (at the default
/// rate the predictor's bounded stores take about 9 minutes to fill).
pub fn default_warmup(seconds: f64) -> f64 {
    (seconds / 3.0).min(600.0)
}

impl Default for SoakOptions {
    fn default() -> Self {
        SoakOptions {
            seconds: 1800.0,
            warmup_s: default_warmup(1800.0),
            rate: 35.0,
            sample_s: 10.0,
            profiles: vec!["h100".into(), "h100".into(), "a100".into()],
            seed: 7,
            small_caps: false,
            run_dir: PathBuf::from(".run"),
            out: PathBuf::from("results/soak"),
        }
    }
}

/// One memory sample.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Sample {
    pub t_s: f64,
    pub predictor_rss: u64,
    pub envoy_rss: u64,
    pub wasm_memory: u64,
}

impl Sample {
    /// What `make soak` prints as it takes the sample: where the run is and each memory.
    pub fn line(&self, seconds: f64, warmup_s: f64) -> String {
        let mib = |v: u64| v as f64 / (1 << 20) as f64;
        let phase = if self.t_s < warmup_s { " (warming up)" } else { "" };
        format!(
            "  {:>5.0} s of {seconds:.0}: predictor {:.1} MiB, Envoy {:.1} MiB, Wasm VMs {:.1} MiB{phase}",
            self.t_s,
            mib(self.predictor_rss),
            mib(self.envoy_rss),
            mib(self.wasm_memory)
        )
    }
}

/// Growth of one process's memory after warm-up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Growth {
    pub what: String,
    /// Median of the three samples just after warm-up, bytes.
    pub baseline: f64,
    /// Median of the last three samples, bytes.
    pub end: f64,
    pub growth: f64,
}

/// The predictor's books once traffic stopped.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Books {
    pub dispatched: f64,
    pub reported: f64,
    pub in_flight: f64,
    pub expired: f64,
    /// Items the filter dropped from its full queues (`headroom.reports.dropped`).
    pub filter_dropped: f64,
}

impl Books {
    /// The books from the predictor's `/metrics` and Envoy's stats.
    pub fn read(predictor_metrics: &str, envoy_stats: &str) -> Books {
        Books {
            dispatched: metric_with(predictor_metrics, "headroom_dispatches_total", "result=\"accepted\""),
            reported: metric_with(predictor_metrics, "headroom_reports_total", "result=\"tracked\""),
            in_flight: metric_sum(predictor_metrics, "headroom_in_flight_requests"),
            expired: metric_sum(predictor_metrics, "headroom_in_flight_expired_total"),
            filter_dropped: metric_sum(envoy_stats, "headroom_reports_dropped"),
        }
    }

    pub fn balanced(&self) -> bool {
        self.dispatched == self.reported + self.in_flight + self.expired && self.filter_dropped == 0.0
    }
}

/// Everything a soak measured and its verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakSummary {
    pub command: String,
    pub seconds: f64,
    pub rate: f64,
    pub requests: usize,
    pub ok: usize,
    pub shed: usize,
    /// No answer or a 5xx.
    pub failed: usize,
    pub first_failures: Vec<String>,
    pub growth: Vec<Growth>,
    pub books: Books,
    pub passed: bool,
}

impl SoakSummary {
    /// The one line `make soak` prints.
    pub fn line(&self) -> String {
        let growth: Vec<String> = self.growth.iter().map(|g| format!("{} {:+.1}%", g.what, 100.0 * g.growth)).collect();
        let b = &self.books;
        format!(
            "soak {}: {:.0} s at {} req/s, {} requests ({} ok, {} shed, {} failed); memory after warm-up: {}; \
             dispatched {} = reported {} + in flight {} + expired {}, filter dropped {}",
            if self.passed { "PASSED" } else { "FAILED" },
            self.seconds,
            self.rate,
            self.requests,
            self.ok,
            self.shed,
            self.failed,
            growth.join(", "),
            b.dispatched,
            b.reported,
            b.in_flight,
            b.expired,
            b.filter_dropped
        )
    }
}

/// Runs the soak and writes its outputs; the summary says whether it passed.
pub fn run(opts: &SoakOptions, command: &str) -> anyhow::Result<SoakSummary> {
    anyhow::ensure!(opts.seconds > 0.0 && opts.rate > 0.0, "--seconds and --rate must be > 0");
    anyhow::ensure!(
        opts.warmup_s >= 0.0 && opts.warmup_s + 3.0 * opts.sample_s < opts.seconds,
        "--warmup must leave at least three samples before the end"
    );
    std::fs::create_dir_all(&opts.out)?;
    // Each store the soak showed filling: prefix blocks remembered per endpoint (every
    // prompt adds its blocks), the observation log, the sample reservoir.
    let small_caps: fn(&mut PredictorConfig) = |c| {
        c.prefix_blocks_per_endpoint = 2000;
        c.observations_kept = 300;
        c.model.bucket_cap = 20;
    };
    let stack = Stack::start(StackOptions {
        profiles: opts.profiles.clone(),
        predictor_tweak: if opts.small_caps { small_caps } else { |_| {} },
        run_dir: opts.run_dir.clone(),
        attached: true,
        ..Default::default()
    })?;
    let (predictor, envoy) = (
        stack.pid("predictor").ok_or_else(|| anyhow::anyhow!("no predictor"))?,
        stack.pid("envoy").ok_or_else(|| anyhow::anyhow!("no envoy"))?,
    );

    let specs = workload::mixed(opts.seed, opts.rate, opts.seconds);
    let requests = specs.len();
    let target = runner::Target::slo_routed(format!("http://{}", stack.state.gateway));
    let load = std::thread::spawn(move || -> anyhow::Result<Vec<runner::Outcome>> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        rt.block_on(runner::run(&target, &specs))
    });

    let started = Instant::now();
    let mut samples = Vec::new();
    let mut next = started;
    while !load.is_finished() {
        if Instant::now() >= next {
            let wasm = metric_sum(&stack.envoy_stats(), "headroom_vm_memory_bytes");
            let sample = Sample {
                t_s: started.elapsed().as_secs_f64(),
                predictor_rss: process::rss_bytes(predictor).unwrap_or(0),
                envoy_rss: process::rss_bytes(envoy).unwrap_or(0),
                wasm_memory: wasm as u64,
            };
            println!("{}", sample.line(opts.seconds, opts.warmup_s));
            samples.push(sample);
            next += Duration::from_secs_f64(opts.sample_s);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let outcomes = load.join().map_err(|_| anyhow::anyhow!("the load thread panicked"))??;

    // Traffic stopped: the last reports reach the predictor on the filter's next ticks.
    let read_books = || {
        let predictor = headroom_stack::http::get(stack.state.predictor, "/metrics").map(|(_, b)| b);
        Books::read(&predictor.unwrap_or_default(), &stack.envoy_stats())
    };
    headroom_stack::wait_until(Duration::from_secs(15), || read_books().in_flight == 0.0);
    let books = read_books();
    drop(stack);

    let failures: Vec<&runner::Outcome> =
        outcomes.iter().filter(|o| o.status == 0 || o.status >= 500 || o.error.is_some()).collect();
    let first_failures = failures
        .iter()
        .take(5)
        .map(|o| {
            format!("#{} at {:.1} s: status {} {}", o.index, o.at_s, o.status, o.error.clone().unwrap_or_default())
        })
        .collect();
    let growth = vec![
        growth_of("predictor RSS", &samples, opts, |s| s.predictor_rss),
        growth_of("Envoy RSS", &samples, opts, |s| s.envoy_rss),
        growth_of("Wasm VMs", &samples, opts, |s| s.wasm_memory),
    ];
    let passed = failures.is_empty() && books.balanced() && growth.iter().all(|g| g.growth <= MAX_GROWTH);
    let summary = SoakSummary {
        command: command.to_string(),
        seconds: opts.seconds,
        rate: opts.rate,
        requests,
        ok: outcomes.iter().filter(|o| o.status == 200 && o.error.is_none()).count(),
        shed: outcomes.iter().filter(|o| o.status == 429).count(),
        failed: failures.len(),
        first_failures,
        growth,
        books,
        passed,
    };
    write_outputs(opts, &samples, &summary)?;
    Ok(summary)
}

/// Growth of one series: the median of the last three samples over the median of the
/// three samples after warm-up (medians, so one sample taken mid-allocation, such as a
/// training round's, does not decide).
fn growth_of(what: &str, samples: &[Sample], opts: &SoakOptions, value: impl Fn(&Sample) -> u64) -> Growth {
    let median = |s: &[&Sample]| {
        let mut v: Vec<f64> = s.iter().map(|x| value(x) as f64).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let after: Vec<&Sample> = samples.iter().filter(|s| s.t_s >= opts.warmup_s).collect();
    let baseline = median(&after[..after.len().min(3)]);
    let end = median(&after[after.len().saturating_sub(3)..]);
    let growth = if baseline > 0.0 { end / baseline - 1.0 } else { f64::INFINITY };
    Growth { what: what.to_string(), baseline, end, growth }
}

fn write_outputs(opts: &SoakOptions, samples: &[Sample], summary: &SoakSummary) -> anyhow::Result<()> {
    let mut csv = String::from("t_s,predictor_rss_bytes,envoy_rss_bytes,wasm_vm_bytes\n");
    for s in samples {
        csv.push_str(&format!("{:.1},{},{},{}\n", s.t_s, s.predictor_rss, s.envoy_rss, s.wasm_memory));
    }
    std::fs::write(opts.out.join("samples.csv"), csv)?;
    let mib = |v: u64| v as f64 / (1 << 20) as f64;
    let series = vec![
        chart::Series {
            name: "predictor RSS",
            points: samples.iter().map(|s| (s.t_s, mib(s.predictor_rss))).collect(),
            ..Default::default()
        },
        chart::Series {
            name: "Envoy RSS",
            points: samples.iter().map(|s| (s.t_s, mib(s.envoy_rss))).collect(),
            ..Default::default()
        },
        chart::Series {
            name: "Wasm VMs",
            points: samples.iter().map(|s| (s.t_s, mib(s.wasm_memory))).collect(),
            ..Default::default()
        },
    ];
    let top = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(1.0f64, f64::max);
    let step = (top / 5.0).ceil().max(1.0);
    let text = |y: f64| format!("{y:.0}");
    let axes = chart::Axes {
        x_label: "seconds",
        y_label: "MiB",
        y_min: 0.0,
        y_max: step * 5.0,
        y_step: step,
        y_text: &text,
        threshold: None,
        dots: false,
    };
    let title = format!("soak: memory at {} req/s ({})", opts.rate, if summary.passed { "passed" } else { "failed" });
    std::fs::write(opts.out.join("memory.svg"), chart::line_svg(&title, &axes, series))?;
    std::fs::write(opts.out.join("soak.json"), serde_json::to_string_pretty(summary)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_prints_where_the_run_is_and_each_memory() {
        let s = Sample { t_s: 30.2, predictor_rss: 3 << 20, envoy_rss: 50 << 20, wasm_memory: 1 << 19 };
        assert_eq!(
            s.line(120.0, 40.0),
            "     30 s of 120: predictor 3.0 MiB, Envoy 50.0 MiB, Wasm VMs 0.5 MiB (warming up)"
        );
        assert!(!s.line(120.0, 20.0).contains("warming"));
    }

    fn samples(values: &[u64]) -> Vec<Sample> {
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| Sample { t_s: i as f64 * 10.0, predictor_rss: v, envoy_rss: v, wasm_memory: v })
            .collect()
    }

    #[test]
    fn growth_compares_the_end_with_just_after_warm_up() {
        let opts = SoakOptions { warmup_s: 20.0, ..Default::default() };
        // Warm-up climbs from 50 to 100; after it: flat at 100 (one spike), then 112 at the end.
        let s = samples(&[50, 80, 100, 130, 100, 100, 112, 112, 112]);
        let g = growth_of("x", &s, &opts, |s| s.predictor_rss);
        assert_eq!(g.baseline, 100.0);
        assert!((g.growth - 0.12).abs() < 1e-9, "{}", g.growth);
        let flat = growth_of("x", &samples(&[50, 100, 100, 100, 101, 100]), &opts, |s| s.envoy_rss);
        assert!(flat.growth < MAX_GROWTH);
    }

    #[test]
    fn books_balance_only_when_every_dispatch_is_accounted_for() {
        let b = Books { dispatched: 10.0, reported: 7.0, in_flight: 2.0, expired: 1.0, filter_dropped: 0.0 };
        assert!(b.balanced());
        assert!(!Books { reported: 6.0, ..b }.balanced());
        assert!(!Books { filter_dropped: 1.0, ..b }.balanced());
    }
}
