//! `headroom-bench scrapes`: how long the predictor takes to answer predict calls while
//! clients scrape its `/metrics` as fast as they can, against the same calls with nobody
//! scraping, in one sitting (docs/reliability.md), optionally on a larger simulated fleet
//! under gateway traffic (a longer page, a busier predictor: the probe's conditions). Scrapes are unauthenticated, so any
//! client that reaches the predictor can send them; the filter gives up on a predict call
//! after `predictor_timeout_ms` (50 ms). Run it against older binaries with
//! `HEADROOM_BIN_DIR` for a before/after.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_stack::{Stack, StackOptions};

use crate::wire::{request_bytes, Conn};

#[derive(Debug, Clone, clap::Args)]
pub struct ScrapeOptions {
    /// Clients scraping `/metrics` back to back in the loaded phase.
    #[arg(long, default_value_t = 16)]
    pub scrapers: usize,
    /// Seconds of predict calls in each phase.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// Pause between one client's predict calls (ms).
    #[arg(long, default_value_t = 10)]
    pub pause_ms: u64,
    /// Simulated servers, H100 and A100 alternating (each adds its series to the page).
    #[arg(long, default_value_t = 3)]
    pub servers: usize,
    /// Completions a second sent through the gateway meanwhile, routed by their SLOs.
    #[arg(long, default_value_t = 0.0)]
    pub traffic: f64,
}

/// Threads that send the gateway traffic, each its share of the rate.
const SENDERS: usize = 8;

/// One phase's predict latencies (ms, sorted) and the scrapes answered per second.
struct Phase {
    scrapers: usize,
    latencies: Vec<f64>,
    failed: usize,
    scrapes_per_s: f64,
}

impl Phase {
    fn quantile(&self, q: f64) -> f64 {
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies.get(i).copied().unwrap_or(f64::NAN)
    }
}

/// Starts a stack of three simulated servers, then times predict calls with nobody
/// scraping and with `scrapers` clients scraping; prints the table.
pub fn run(opts: &ScrapeOptions) -> anyhow::Result<()> {
    let run_dir = std::env::temp_dir().join(format!("headroom-scrapes-{}", std::process::id()));
    let profiles = (0..opts.servers.max(1)).map(|i| if i % 2 == 0 { "h100" } else { "a100" }.to_string()).collect();
    let stack = Stack::start(StackOptions { run_dir, profiles, ..Default::default() })?;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let senders: Vec<_> = (0..if opts.traffic > 0.0 { SENDERS } else { 0 })
        .map(|k| traffic(stack.state.gateway, opts.traffic / SENDERS as f64, k, stop.clone(), sent.clone()))
        .collect();
    let started = Instant::now();
    let phases: anyhow::Result<Vec<Phase>> = [0, opts.scrapers].iter().map(|&n| phase(&stack, n, opts)).collect();
    let served = sent.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in senders {
        let _ = t.join();
    }
    let phases = phases?;
    let page = headroom_stack::http::get(stack.state.predictor, "/metrics").map(|(_, body)| body.len()).unwrap_or(0);
    println!("# Predict calls while clients scrape the predictor's /metrics\n");
    println!("`headroom-bench scrapes {}`\n", std::env::args().skip(2).collect::<Vec<_>>().join(" "));
    println!(
        "One client predicting every {} ms for {} s per row; {} simulated servers; gateway traffic {:.1} \
         completions/s answered 200 (asked {}); a `/metrics` page of {:.0} KB.\n",
        opts.pause_ms,
        opts.seconds,
        opts.servers.max(1),
        served,
        opts.traffic,
        page as f64 / 1000.0
    );
    println!("| scrapers | predicts | failed | p50 (ms) | p99 (ms) | max (ms) | over 50 ms | scrapes/s |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for p in &phases {
        let over = p.latencies.iter().filter(|&&l| l > 50.0).count();
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.1} | {over} | {:.0} |",
            p.scrapers,
            p.latencies.len(),
            p.failed,
            p.quantile(0.5),
            p.quantile(0.99),
            p.latencies.last().copied().unwrap_or(f64::NAN),
            p.scrapes_per_s
        );
    }
    Ok(())
}

/// A sender of `rate` streamed completions a second through `gateway`, each with SLO
/// headers (so each is predicted, dispatched and reported), counting those answered 200.
fn traffic(
    gateway: std::net::SocketAddr,
    rate: f64,
    k: usize,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut conn = Conn::new(gateway);
        let headers = [("x-slo-ttft-ms", "500"), ("x-slo-tpot-ms", "50"), ("x-prediction-based-scheduling", "true")];
        let pause = Duration::from_secs_f64(1.0 / rate.max(0.01));
        let mut next = Instant::now();
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let body = serde_json::json!({"model": "sim-llama-8b", "prompt": format!("sender {k} request {i} ").repeat(40),
                "max_tokens": 16, "stream": true});
            if conn.send(&request_bytes("/v1/completions", &headers, &body.to_string())).is_ok_and(|s| s == 200) {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            next += pause;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    })
}

fn phase(stack: &Stack, scrapers: usize, opts: &ScrapeOptions) -> anyhow::Result<Phase> {
    let predictor = stack.state.predictor;
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..scrapers)
        .map(|_| {
            let (stop, scrapes) = (stop.clone(), scrapes.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::new(predictor);
                let get = b"GET /metrics HTTP/1.1\r\nhost: predictor\r\n\r\n";
                while !stop.load(Ordering::Relaxed) {
                    if conn.send(get).is_ok_and(|s| s == 200) {
                        scrapes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let bearer = format!("Bearer {}", stack.state.token.as_deref().unwrap_or_default());
    let headers = [("authorization", bearer.as_str())];
    let mut conn = Conn::new(predictor);
    let (mut latencies, mut failed) = (Vec::new(), 0);
    let started = Instant::now();
    let mut i = 0u64;
    while started.elapsed().as_secs_f64() < opts.seconds {
        i += 1;
        let body = serde_json::json!({"pool": "default", "request_id": format!("scrape-probe-{scrapers}-{i}"),
            "request": {"model": "sim-llama-8b", "input_tokens": 500, "streaming": true,
                "slo": {"ttft_ms": 500.0, "tpot_ms": 50.0}, "prediction_based": true}});
        let at = Instant::now();
        match conn.send(&request_bytes("/v1/predict", &headers, &body.to_string())) {
            Ok(200) => latencies.push(at.elapsed().as_secs_f64() * 1000.0),
            _ => failed += 1,
        }
        std::thread::sleep(Duration::from_millis(opts.pause_ms));
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    latencies.sort_by(f64::total_cmp);
    Ok(Phase { scrapers, latencies, failed, scrapes_per_s: scrapes.load(Ordering::Relaxed) as f64 / elapsed })
}
