//! `headroom-bench claims`: what one tenant's tight TPOT goals cost everyone else
//! (docs/reliability.md). A stack of two simulated H100s and an A100 takes the same open-loop
//! stream of other clients' requests twice, in one sitting: once alone, once while a greedy
//! tenant keeps long streams running that ask a TPOT goal just inside what its endpoints
//! can keep (the claim floor). A running goal holds later requests of its own tenant at its
//! priority, never its peers', so the others' attainment should differ by the noise. A third
//! phase sends the same streams naming no tenant, the others' own: what every goal did to
//! its whole band before tenants were peers, and what it still may within a tenant.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use headroom_loadgen::runner::{self, Outcome, Target};
use headroom_loadgen::workload::{self, RequestSpec, SloClass};
use headroom_stack::{Stack, StackOptions};

use crate::wire::{request_bytes, Conn};

#[derive(Debug, Clone, clap::Args)]
pub struct ClaimOptions {
    /// Long streams the greedy tenant keeps running.
    #[arg(long, default_value_t = 6)]
    pub greedy: usize,
    /// The TPOT goal they ask (ms): twice an idle simulated H100's step is the floor a goal
    /// must reach to hold anyone.
    #[arg(long, default_value_t = 14.0)]
    pub greedy_tpot_ms: f64,
    /// The other clients' requests a second.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Seconds of the other clients' requests per phase.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
}

/// One phase's outcome for the other clients.
struct Phase {
    greedy: usize,
    tenant: &'static str,
    outcomes: Vec<Outcome>,
    a100: String,
}

/// Runs the phase without greedy streams, then with them; prints the table.
pub fn run(opts: &ClaimOptions) -> anyhow::Result<()> {
    let phases: Vec<Phase> = [(0, ""), (opts.greedy, "greedy"), (opts.greedy, "")]
        .iter()
        .map(|&(g, tenant)| phase(g, tenant, opts))
        .collect::<anyhow::Result<_>>()?;
    println!("# Other clients' requests while one tenant's streams ask a tight TPOT goal\n");
    println!("`headroom-bench claims {}`\n", std::env::args().skip(2).collect::<Vec<_>>().join(" "));
    println!(
        "Two simulated H100s and an A100; {:.0} s of streamed requests at {} a second (200 prompt tokens, 32 \
         out; TTFT goal 400 ms, TPOT 50 ms; no tenant named), the greedy tenant's streams asking TPOT {} ms with \
         SLO routing.\n",
        opts.seconds, opts.rate, opts.greedy_tpot_ms
    );
    println!(
        "| greedy streams | their tenant | requests | SLO attainment | on the A100 | TTFT p50 (ms) | TTFT p90 (ms) | \
         TPOT p50 (ms) |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for p in &phases {
        let n = p.outcomes.len().max(1) as f64;
        let met = p.outcomes.iter().filter(|o| o.met_slo()).count() as f64;
        let on_a100 = p.outcomes.iter().filter(|o| o.served_by.as_deref() == Some(p.a100.as_str())).count();
        let ttft: Vec<f64> = p.outcomes.iter().filter_map(|o| o.ttft_ms).collect();
        let tpot: Vec<f64> = p.outcomes.iter().filter_map(|o| o.tpot_ms).collect();
        let q = |v: &[f64], q: f64| headroom_protocol::stats::quantile(v, q).unwrap_or(f64::NAN);
        println!(
            "| {} | {} | {} | {:.1}% | {on_a100} | {:.0} | {:.0} | {:.1} |",
            p.greedy,
            if p.greedy == 0 {
                ""
            } else if p.tenant.is_empty() {
                "none (the others' own)"
            } else {
                p.tenant
            },
            p.outcomes.len(),
            100.0 * met / n,
            q(&ttft, 0.5),
            q(&ttft, 0.9),
            q(&tpot, 0.5)
        );
    }
    Ok(())
}

/// A fresh stack; `greedy` long streams started and running; the other clients' requests.
fn phase(greedy: usize, tenant: &'static str, opts: &ClaimOptions) -> anyhow::Result<Phase> {
    let run_dir = std::env::temp_dir().join(format!("headroom-claims-{}-{greedy}-{tenant}", std::process::id()));
    let profiles = ["h100", "h100", "a100"].map(String::from).to_vec();
    let stack = Stack::start(StackOptions { run_dir, profiles, ..Default::default() })?;
    let a100 = stack.state.servers[2].to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let streams: Vec<_> =
        (0..greedy).map(|k| greedy_stream(&stack, k, tenant, opts.greedy_tpot_ms, stop.clone())).collect();
    // Their goals are booked once their dispatches are: a moment before the others come.
    std::thread::sleep(Duration::from_millis(500));
    let class = SloClass { name: "others".into(), ttft_ms: Some(400.0), tpot_ms: Some(50.0), priority: 0 };
    let count = (opts.rate * opts.seconds).round() as usize;
    let work: Vec<RequestSpec> = (0..count)
        .map(|i| RequestSpec {
            run: 1 + i as u32,
            ..workload::spec(i as f64 / opts.rate, 200, 32, true, class.clone())
        })
        .collect();
    let target = Target {
        url: format!("http://{}", stack.state.gateway),
        model: "sim-llama-8b".into(),
        slo_headers: true,
        prediction_based: Some(true),
        timeout: Duration::from_secs(30),
    };
    let outcomes = tokio::runtime::Runtime::new()?.block_on(runner::run(&target, &work));
    stop.store(true, Ordering::Relaxed);
    drop(stack);
    for s in streams {
        let _ = s.join();
    }
    Ok(Phase { greedy, tenant, outcomes: outcomes?, a100 })
}

/// One of the greedy streams of `tenant` (none: empty), asked again whenever it ends, until `stop`.
fn greedy_stream(
    stack: &Stack,
    k: usize,
    tenant: &'static str,
    tpot_ms: f64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let gateway = stack.state.gateway;
    std::thread::spawn(move || {
        let tpot = format!("{tpot_ms}");
        let mut headers = vec![
            ("x-slo-ttft-ms", "2000"),
            ("x-slo-tpot-ms", tpot.as_str()),
            ("x-prediction-based-scheduling", "true"),
        ];
        if !tenant.is_empty() {
            headers.push(("x-llm-d-inference-fairness-id", tenant));
        }
        let mut conn = Conn::new(gateway);
        while !stop.load(Ordering::Relaxed) {
            let body = serde_json::json!({"model": "sim-llama-8b", "prompt": format!("greedy {k} ").repeat(20),
                "max_tokens": 2000, "stream": true});
            if conn.send(&request_bytes("/v1/completions", &headers, &body.to_string())).is_err() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    })
}
