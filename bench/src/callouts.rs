//! `headroom-bench callouts`: what crosses the wire between the gateway and the predictor
//! per routed request, measured on the real stack. Envoy counts every byte it writes to and
//! reads from the predictor's cluster (`upstream_cx_tx_bytes_total`, `..._rx_...`: HTTP
//! framing, headers and bodies of predict calls, dispatches, reports and first-token
//! events); dividing by the requests routed gives the contract's cost per request. The
//! prompts are long enough to fill every prefix block the filter hashes (256 blocks of 16
//! tokens), the case where echoing the features costs most. Run it against older binaries
//! with `HEADROOM_BIN_DIR` and `HEADROOM_WASM` for a before/after in one sitting.

use std::time::{Duration, Instant};

use headroom_stack::{http, Stack, StackOptions};

use crate::wire::{request_bytes, Conn};

#[derive(Debug, Clone, clap::Args)]
pub struct CalloutOptions {
    /// Requests routed, one after another on one connection.
    #[arg(long, default_value_t = 300)]
    pub requests: usize,
    /// Prompt length in tokens (4,100: the filter hashes its 256-block cap).
    #[arg(long, default_value_t = 4100)]
    pub prompt_tokens: usize,
    /// Filter configuration fields over the defaults (a JSON object).
    #[arg(long, default_value = "{}")]
    pub plugin: String,
}

/// Bytes each way on the predictor's cluster, summed over its clusters (shards, the stream's):
/// every cluster name starting `headroom_predictor`.
fn cluster_bytes(stats: &str) -> (f64, f64) {
    let cluster = "envoy_cluster_name=\"headroom_predictor";
    (
        http::metric_with(stats, "envoy_cluster_upstream_cx_tx_bytes_total", cluster),
        http::metric_with(stats, "envoy_cluster_upstream_cx_rx_bytes_total", cluster),
    )
}

/// Starts a stack of three simulated servers, routes `requests` SLO-routed streamed
/// completions through it, waits for their reports, and prints the bytes per request.
pub fn run(opts: &CalloutOptions) -> anyhow::Result<()> {
    let plugin = headroom_stack::plugin_fields(&opts.plugin)?;
    let run_dir = std::env::temp_dir().join(format!("headroom-callouts-{}", std::process::id()));
    let stack = Stack::start(StackOptions { plugin, time_scale: 50.0, run_dir, ..Default::default() })?;
    let reports = || {
        http::get(stack.state.predictor, "/metrics")
            .map(|(_, body)| http::metric_with(&body, "headroom_reports_total", "result=\"accepted\""))
            .unwrap_or(0.0)
    };
    let before = cluster_bytes(&stack.envoy_stats());
    let mut conn = Conn::new(stack.state.gateway);
    let headers = [
        ("content-type", "application/json"),
        ("x-slo-ttft-ms", "60000"),
        ("x-slo-tpot-ms", "1000"),
        ("x-prediction-based-scheduling", "true"),
    ];
    let mut ok = 0;
    for i in 0..opts.requests {
        // A different first block per request: nothing is found cached, every block is hashed.
        let prompt = format!("request {i:>08}. {}", "word ".repeat(opts.prompt_tokens * 4 / 5));
        let body = serde_json::json!({"model": "sim-llama-8b", "prompt": prompt, "max_tokens": 8, "stream": true});
        if conn.send(&request_bytes("/v1/completions", &headers, &body.to_string()))? == 200 {
            ok += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while reports() < opts.requests as f64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = cluster_bytes(&stack.envoy_stats());
    let (tx, rx) = (after.0 - before.0, after.1 - before.1);
    let n = opts.requests as f64;
    println!("# Gateway <-> predictor bytes per routed request\n");
    println!("`headroom-bench callouts {}`\n", std::env::args().skip(2).collect::<Vec<_>>().join(" "));
    println!("{ok} of {} requests answered 200, {} reports accepted.\n", opts.requests, reports());
    println!("| direction | bytes | per request |\n| --- | ---: | ---: |");
    println!("| gateway -> predictor | {tx:.0} | {:.0} |", tx / n);
    println!("| predictor -> gateway | {rx:.0} | {:.0} |", rx / n);
    println!("| both | {:.0} | {:.0} |", tx + rx, (tx + rx) / n);
    Ok(())
}
