//! `headroom-bench gateway` (`make bench-gateway`): what the gateway itself costs.
//!
//! One stack (2 simulated servers so fast they answer in microseconds, predictor-svc, Envoy
//! with the filter) and a plain Envoy beside it in front of the same servers, measured in
//! one run so the noisy host affects every path alike:
//!
//! - **Added latency at low load**: sequential `max_tokens: 1` completions on one keep-alive
//!   connection, in interleaved rounds over the four paths (the server directly, plain
//!   Envoy, Envoy + headroom without SLO headers, Envoy + headroom with SLO routing). The
//!   filter's cost is a headroom path's percentile minus plain Envoy's.
//! - **Throughput**: a closed loop of N connections for S seconds on each Envoy path, in
//!   alternating rounds, with the CPU each process used; at each N asked (8, 32 and 128 by
//!   default: an LLM gateway holds hundreds of streams open). A path's rate is the highest it
//!   sustains at any N: a worker with more requests open coalesces more of their predict
//!   calls (`filter/core/src/coalesce.rs`), which plain Envoy has no counterpart of.
//! - **Streaming**: a second stack whose servers run slowly enough that each token leaves as
//!   its own chunk, as a real server's decode steps send them; a closed loop of streamed
//!   completions on plain Envoy and on headroom, and Envoy's CPU per streamed token. The
//!   filter meters every chunk of a routed response (TTFT, TPOT), which plain Envoy does not:
//!   on decode-heavy traffic that, not the callout, is most of the gateway's work.
//!
//! The client is [`crate::wire`]: one thread per connection, no runtime, so it stays out of
//! the figures as far as a client on the same two cores can.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use headroom_stack::{process, EnvoyLaunch, Router, Stack, StackOptions};

use crate::wire::{request_bytes, Conn};

/// What to run: `headroom-bench gateway`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayOptions {
    /// Sequential requests per path per round.
    #[arg(long, default_value_t = 250)]
    pub requests: usize,
    /// Interleaved latency rounds.
    #[arg(long, default_value_t = 8)]
    pub rounds: usize,
    /// Closed-loop connections, a comma-separated list: each count is measured.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 32, 128])]
    pub connections: Vec<usize>,
    /// Seconds per closed-loop run.
    #[arg(long, default_value_t = 8.0)]
    pub seconds: f64,
    /// Closed-loop rounds (each runs every Envoy path once), and streaming rounds.
    #[arg(long, default_value_t = 2)]
    pub throughput_rounds: usize,
    /// Filter configuration fields (a JSON object) over the benchmark's (`debug_headers: false`),
    /// to measure another setup.
    #[arg(long, default_value = "{}", value_parser = plugin_fields)]
    pub plugin: serde_json::Map<String, serde_json::Value>,
    /// Simulator speed: large so the servers answer in microseconds (1: real time, as a
    /// calibrated server would answer).
    #[arg(long, default_value_t = 1000.0)]
    pub time_scale: f64,
    /// Tokens per streamed completion in the streaming phase (0 skips it).
    #[arg(long, default_value_t = 64)]
    pub stream_tokens: u32,
    /// Closed-loop connections of the streaming phase.
    #[arg(long, default_value_t = 32)]
    pub stream_connections: usize,
    /// Simulator speed of the streaming phase: slow enough that each token leaves the server as
    /// its own chunk, as a real server's decode steps send them.
    #[arg(long, default_value_t = 10.0)]
    pub stream_time_scale: f64,
    /// Where the stacks' configs, logs and pid records go (the global `--run-dir`).
    #[arg(skip)]
    pub run_dir: PathBuf,
    /// Where gateway.md and gateway.json go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// `--plugin`'s JSON object, checked as the stack checks it.
fn plugin_fields(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    headroom_stack::plugin_fields(text).map_err(|e| format!("{e:#}"))
}

/// The headers of a request routed by its SLOs (loose ones: every endpoint meets them).
const SLO: [(&str, &str); 3] =
    [("x-slo-ttft-ms", "5000"), ("x-slo-tpot-ms", "200"), ("x-prediction-based-scheduling", "true")];

/// The ways a request reaches a model server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Direct,
    PlainEnvoy,
    Headroom,
    HeadroomSlo,
    /// Envoy's ext_proc filter and headroom-epp, the endpoint-picker mode (latency only).
    EppSlo,
}

impl Way {
    const ALL: [Way; 5] = [Way::Direct, Way::PlainEnvoy, Way::Headroom, Way::HeadroomSlo, Way::EppSlo];

    fn name(self) -> &'static str {
        match self {
            Way::Direct => "model server directly",
            Way::PlainEnvoy => "plain Envoy",
            Way::Headroom => "Envoy + headroom, no SLO headers",
            Way::HeadroomSlo => "Envoy + headroom, SLO routing",
            Way::EppSlo => "Envoy ext_proc + headroom-epp, SLO routing",
        }
    }
}

/// Latency of one path at low load, in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyRow {
    pub path: String,
    pub requests: usize,
    pub errors: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
}

/// One closed-loop run of one path.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThroughputRow {
    pub path: String,
    /// Closed-loop connections.
    #[serde(default)]
    pub connections: usize,
    pub round: usize,
    pub requests_per_s: f64,
    pub errors: usize,
    /// CPU cores used on average during the run, per process.
    pub envoy_cores: f64,
    pub predictor_cores: f64,
    pub simulator_cores: f64,
    /// Headroom's paths: coalesced predict calls per routed request during the run (the
    /// filter's stats), and the share of those calls sent on the predict stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_per_request: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_on_stream: Option<f64>,
}

/// One closed-loop run of streamed completions on one path.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamRow {
    pub path: String,
    pub round: usize,
    pub requests_per_s: f64,
    /// Streamed tokens per second (each its own SSE event).
    pub tokens_per_s: f64,
    pub errors: usize,
    pub envoy_cores: f64,
    pub predictor_cores: f64,
    /// Envoy's CPU time per streamed token, in microseconds.
    pub envoy_us_per_token: f64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GatewayResults {
    pub command: String,
    pub connections: Vec<usize>,
    pub seconds: f64,
    pub latency: Vec<LatencyRow>,
    pub throughput: Vec<ThroughputRow>,
    /// Mean time predictor-svc spent answering one `/v1/predict` during the latency phase.
    pub predict_handler_us: f64,
    /// The filter's added latency (headroom with SLO routing minus plain Envoy).
    pub filter_added_p50_ms: f64,
    pub filter_added_p99_ms: f64,
    /// The endpoint-picker mode's added latency (Envoy's ext_proc filter and headroom-epp,
    /// SLO routing, minus plain Envoy).
    #[serde(default)]
    pub epp_added_p50_ms: f64,
    #[serde(default)]
    pub epp_added_p99_ms: f64,
    /// Headroom with SLO routing's throughput as a share of plain Envoy's: each path's highest
    /// rate at any connection count (means over rounds).
    pub throughput_share: f64,
    /// The same share at each connection count.
    #[serde(default)]
    pub throughput_share_by_connections: Vec<(usize, f64)>,
    /// Tokens per streamed completion in the streaming phase (0: not run).
    #[serde(default)]
    pub stream_tokens: u32,
    #[serde(default)]
    pub stream: Vec<StreamRow>,
    /// Envoy CPU per streamed token with headroom minus plain Envoy's (means over rounds), us.
    #[serde(default)]
    pub stream_added_us_per_token: f64,
}

/// Runs the measurement, prints the tables and writes `gateway.md` and `gateway.json` under `out`.
pub fn run(opts: &GatewayOptions, command: &str) -> anyhow::Result<GatewayResults> {
    anyhow::ensure!(opts.requests > 0 && opts.rounds > 0, "--requests and --rounds must be > 0");
    anyhow::ensure!(
        !opts.connections.is_empty() && opts.connections.iter().all(|&n| n > 0) && opts.seconds > 0.0,
        "--connections and --seconds must be > 0"
    );
    anyhow::ensure!(
        opts.stream_tokens == 0 || (opts.stream_connections > 0 && opts.stream_time_scale > 0.0),
        "--stream-connections and --stream-time-scale must be > 0 (or --stream-tokens 0 to skip streaming)"
    );
    let (mut stack, plain) = start(opts, 2, opts.time_scale)?;
    // The endpoint-picker mode beside them: headroom-epp and an Envoy with ext_proc in front of it.
    stack.start_epp()?;
    let ports = headroom_stack::free_ports(2)?;
    let epp = SocketAddr::from(([127, 0, 0, 1], ports[0]));
    let epp_admin = SocketAddr::from(([127, 0, 0, 1], ports[1]));
    stack.start_envoy(&EnvoyLaunch::new("envoy-epp", Router::Epp, epp, epp_admin))?;

    let body =
        json!({"model": "sim-llama-8b", "prompt": "Say hello to the gateway benchmark.", "max_tokens": 1}).to_string();
    let target = |way: Way| -> (SocketAddr, Vec<u8>) {
        match way {
            Way::Direct => (stack.state.servers[0], request_bytes("/v1/completions", &[], &body)),
            Way::PlainEnvoy => (plain, request_bytes("/v1/completions", &[], &body)),
            Way::Headroom => (stack.state.gateway, request_bytes("/v1/completions", &[], &body)),
            Way::HeadroomSlo => (stack.state.gateway, request_bytes("/v1/completions", &SLO, &body)),
            Way::EppSlo => (epp, request_bytes("/v1/completions", &SLO, &body)),
        }
    };

    for way in Way::ALL {
        let (addr, req) = target(way);
        warm_up(addr, &req, 200);
    }

    println!("latency: {} rounds x {} sequential requests per path", opts.rounds, opts.requests);
    let predict_before = predict_handler_totals(&stack);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); Way::ALL.len()];
    let mut errors = vec![0usize; Way::ALL.len()];
    let mut conns: Vec<(Conn, Vec<u8>)> = Way::ALL
        .iter()
        .map(|&w| {
            let (addr, req) = target(w);
            (Conn::new(addr), req)
        })
        .collect();
    for _ in 0..opts.rounds {
        for (i, (conn, req)) in conns.iter_mut().enumerate() {
            for _ in 0..opts.requests {
                let start = Instant::now();
                let ok = matches!(conn.send(req), Ok(200));
                let us = start.elapsed().as_secs_f64() * 1e6;
                if ok {
                    samples[i].push(us);
                } else {
                    errors[i] += 1;
                }
            }
        }
    }
    let predict_after = predict_handler_totals(&stack);
    let predict_handler_us = match (predict_before, predict_after) {
        (Some((s0, c0)), Some((s1, c1))) if c1 > c0 => (s1 - s0) / (c1 - c0) * 1e6,
        _ => f64::NAN,
    };
    let latency: Vec<LatencyRow> = Way::ALL
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let s = &mut samples[i];
            s.sort_by(f64::total_cmp);
            LatencyRow {
                path: w.name().to_string(),
                requests: s.len() + errors[i],
                errors: errors[i],
                p50_us: percentile(s, 0.5),
                p99_us: percentile(s, 0.99),
                mean_us: s.iter().sum::<f64>() / s.len().max(1) as f64,
            }
        })
        .collect();

    println!(
        "throughput: {:?} connections, {} s per run, {} rounds",
        opts.connections, opts.seconds, opts.throughput_rounds
    );
    let mut throughput = Vec::new();
    for (&connections, round) in
        opts.connections.iter().flat_map(|n| std::iter::repeat(n).zip(0..opts.throughput_rounds))
    {
        for way in [Way::PlainEnvoy, Way::Headroom, Way::HeadroomSlo] {
            let (addr, req) = target(way);
            let l = measured_loop(&stack, way, addr, &req, connections, opts.seconds);
            let row = ThroughputRow {
                path: way.name().to_string(),
                connections,
                round,
                requests_per_s: l.ok as f64 / l.wall_s,
                errors: l.failed,
                envoy_cores: l.cores[0],
                predictor_cores: l.cores[1],
                simulator_cores: l.cores[2],
                calls_per_request: l.calls.map(|(calls, _)| calls / l.ok.max(1) as f64),
                calls_on_stream: l.calls.map(|(calls, on_stream)| on_stream / calls.max(1.0)),
            };
            println!("  {:<34} {:>3} connections {:>8.0} req/s", row.path, connections, row.requests_per_s);
            throughput.push(row);
        }
    }
    stack.stop();
    let stream = if opts.stream_tokens > 0 { streaming(opts)? } else { Vec::new() };
    let per_token = |way: Way| mean(stream.iter().filter(|t| t.path == way.name()).map(|t| t.envoy_us_per_token));

    let row = |way: Way| latency.iter().find(|r| r.path == way.name());
    let (Some(plain_row), Some(slo_row), Some(epp_row)) =
        (row(Way::PlainEnvoy), row(Way::HeadroomSlo), row(Way::EppSlo))
    else {
        anyhow::bail!("a latency row is missing");
    };
    let mean_rate = |way: Way, n: usize| {
        mean(throughput.iter().filter(|t| t.path == way.name() && t.connections == n).map(|t| t.requests_per_s))
    };
    let highest = |way: Way| opts.connections.iter().map(|&n| mean_rate(way, n)).fold(0.0, f64::max);
    let throughput_share_by_connections =
        opts.connections.iter().map(|&n| (n, mean_rate(Way::HeadroomSlo, n) / mean_rate(Way::PlainEnvoy, n))).collect();
    let results = GatewayResults {
        command: command.to_string(),
        connections: opts.connections.clone(),
        seconds: opts.seconds,
        filter_added_p50_ms: (slo_row.p50_us - plain_row.p50_us) / 1000.0,
        filter_added_p99_ms: (slo_row.p99_us - plain_row.p99_us) / 1000.0,
        epp_added_p50_ms: (epp_row.p50_us - plain_row.p50_us) / 1000.0,
        epp_added_p99_ms: (epp_row.p99_us - plain_row.p99_us) / 1000.0,
        throughput_share: highest(Way::HeadroomSlo) / highest(Way::PlainEnvoy),
        throughput_share_by_connections,
        latency,
        throughput,
        predict_handler_us,
        stream_tokens: opts.stream_tokens,
        stream_added_us_per_token: per_token(Way::HeadroomSlo) - per_token(Way::PlainEnvoy),
        stream,
    };
    let text = report(&results);
    println!("\n{text}");
    std::fs::create_dir_all(&opts.out)?;
    std::fs::write(opts.out.join("gateway.md"), &text)?;
    std::fs::write(opts.out.join("gateway.json"), serde_json::to_string_pretty(&results)?)?;
    Ok(results)
}

/// The headroom stack (`servers` H100s at `time_scale`) and a plain Envoy beside it;
/// returns the stack and the plain Envoy's listener.
fn start(opts: &GatewayOptions, servers: usize, time_scale: f64) -> anyhow::Result<(Stack, SocketAddr)> {
    let mut plugin = serde_json::Map::new();
    plugin.insert("debug_headers".into(), json!(false));
    plugin.extend(opts.plugin.clone());
    let mut stack = Stack::start(StackOptions {
        profiles: vec!["h100".into(); servers],
        time_scale,
        plugin,
        run_dir: opts.run_dir.clone(),
        attached: true,
        ..Default::default()
    })?;
    let ports = headroom_stack::free_ports(2)?;
    let plain = SocketAddr::from(([127, 0, 0, 1], ports[0]));
    let plain_admin = SocketAddr::from(([127, 0, 0, 1], ports[1]));
    stack.start_envoy(&EnvoyLaunch::new("envoy-plain", Router::LeastRequest, plain, plain_admin))?;
    Ok((stack, plain))
}

/// What one closed-loop run on one path measured.
struct Loop {
    ok: usize,
    failed: usize,
    wall_s: f64,
    /// Cores used on average by Envoy (the one serving the path), the predictor, the simulator.
    cores: [f64; 3],
    /// On headroom's paths, the filter's coalesced predict calls made during the run, and of
    /// them those sent on the predict stream.
    calls: Option<(f64, f64)>,
}

/// The filter's coalesced predict calls so far, and of them those on the predict stream.
fn predict_calls(stack: &Stack) -> (f64, f64) {
    let text = stack.envoy_stats();
    let value = |name: &str| headroom_stack::http::metric_sum(&text, name);
    (value("headroom_predict_calls_coalesced"), value("headroom_predict_calls_on_stream"))
}

/// A closed loop on one path of `stack`, with the CPU each process used.
fn measured_loop(stack: &Stack, way: Way, addr: SocketAddr, request: &[u8], connections: usize, seconds: f64) -> Loop {
    let envoy_pid = stack.pid(if way == Way::PlainEnvoy { "envoy-plain" } else { "envoy" });
    let pids = [envoy_pid, stack.pid("predictor"), stack.pid("simulator")];
    let headroom = way != Way::PlainEnvoy;
    let calls0 = headroom.then(|| predict_calls(stack));
    let cpu0 = pids.map(|p| p.and_then(process::cpu_seconds));
    let started = Instant::now();
    let (ok, failed) = closed_loop(addr, request, connections, Duration::from_secs_f64(seconds));
    let wall_s = started.elapsed().as_secs_f64();
    let cpu1 = pids.map(|p| p.and_then(process::cpu_seconds));
    let cores = std::array::from_fn(|i| match (cpu0[i], cpu1[i]) {
        (Some(a), Some(b)) => (b - a) / wall_s,
        _ => f64::NAN,
    });
    let calls = calls0.map(|(c0, s0)| {
        let (c1, s1) = predict_calls(stack);
        (c1 - c0, s1 - s0)
    });
    Loop { ok, failed, wall_s, cores, calls }
}

/// The streaming phase: its own stack at `stream_time_scale`, closed loops of streamed
/// completions on plain Envoy and headroom with SLO routing, alternating. One server, so
/// every path places every request alike and the token stream's timing (how many chunks
/// Envoy reads at once) is the same: a routing policy that batched requests differently
/// would change Envoy's cost per chunk, which is not the filter's.
fn streaming(opts: &GatewayOptions) -> anyhow::Result<Vec<StreamRow>> {
    let (mut stack, plain) = start(opts, 1, opts.stream_time_scale)?;
    let body = json!({"model": "sim-llama-8b", "prompt": "Stream through the gateway benchmark.",
        "max_tokens": opts.stream_tokens, "stream": true, "stream_options": {"include_usage": true}})
    .to_string();
    let target = |way: Way| match way {
        Way::PlainEnvoy => (plain, request_bytes("/v1/completions", &[], &body)),
        _ => (stack.state.gateway, request_bytes("/v1/completions", &SLO, &body)),
    };
    for way in [Way::PlainEnvoy, Way::HeadroomSlo] {
        let (addr, req) = target(way);
        warm_up(addr, &req, 20);
    }
    println!(
        "streaming: {} connections, {} tokens per completion, servers at {}x, {} s per run",
        opts.stream_connections, opts.stream_tokens, opts.stream_time_scale, opts.seconds
    );
    let mut rows = Vec::new();
    for round in 0..opts.throughput_rounds {
        for way in [Way::PlainEnvoy, Way::HeadroomSlo] {
            let (addr, req) = target(way);
            let l = measured_loop(&stack, way, addr, &req, opts.stream_connections, opts.seconds);
            let tokens = l.ok as f64 * f64::from(opts.stream_tokens);
            let row = StreamRow {
                path: way.name().to_string(),
                round,
                requests_per_s: l.ok as f64 / l.wall_s,
                tokens_per_s: tokens / l.wall_s,
                errors: l.failed,
                envoy_cores: l.cores[0],
                predictor_cores: l.cores[1],
                envoy_us_per_token: l.cores[0] * l.wall_s / tokens.max(1.0) * 1e6,
            };
            println!(
                "  {:<34} {:>8.0} tokens/s {:>6.1} us Envoy CPU per token",
                row.path, row.tokens_per_s, row.envoy_us_per_token
            );
            rows.push(row);
        }
    }
    stack.stop();
    Ok(rows)
}

/// Connections, Envoy's pools and the predictor's first model inputs: `n` requests before measuring.
fn warm_up(addr: SocketAddr, request: &[u8], n: usize) {
    let mut conn = Conn::new(addr);
    for _ in 0..n {
        let _ = conn.send(request);
    }
}

/// The mean of `values` (0 when there are none).
fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    sum / n.max(1) as f64
}

/// `connections` threads sending `request` back to back for `length`: (answered 200, failed).
fn closed_loop(addr: SocketAddr, request: &[u8], connections: usize, length: Duration) -> (usize, usize) {
    let deadline = Instant::now() + length;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..connections)
            .map(|_| {
                scope.spawn(move || {
                    let mut conn = Conn::new(addr);
                    let (mut ok, mut failed) = (0usize, 0usize);
                    while Instant::now() < deadline {
                        match conn.send(request) {
                            Ok(200) => ok += 1,
                            _ => failed += 1,
                        }
                    }
                    (ok, failed)
                })
            })
            .collect();
        workers.into_iter().filter_map(|w| w.join().ok()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    })
}

/// (sum in seconds, count) of the predictor's `headroom_predict_duration_seconds`.
fn predict_handler_totals(stack: &Stack) -> Option<(f64, f64)> {
    let (_, text) = headroom_stack::http::get(stack.state.predictor, "/metrics").ok()?;
    let value = |name: &str| headroom_stack::http::metric_sum(&text, name);
    Some((value("headroom_predict_duration_seconds_sum"), value("headroom_predict_duration_seconds_count")))
}

/// The `q` quantile of sorted `values` (nearest rank); NaN when empty.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The markdown report: the three tables and the figures the targets are about.
pub fn report(r: &GatewayResults) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let direct = r.latency.first().map(|d| (d.p50_us, d.p99_us)).unwrap_or((f64::NAN, f64::NAN));
    let _ = writeln!(s, "# Gateway cost\n\n`{}`\n", r.command);
    let _ = writeln!(s, "## Added latency at low load (sequential `max_tokens: 1` completions, one connection)\n");
    let ms = |us: f64| format!("{:.3}", us / 1000.0);
    let added = |us: f64| format!("{:+.3}", us / 1000.0);
    table(
        &mut s,
        &["path", "requests", "errors", "p50 ms", "p99 ms", "mean ms", "added p50 ms", "added p99 ms"],
        r.latency.iter().map(|l| {
            let (requests, errors) = (l.requests.to_string(), l.errors.to_string());
            let (p50, p99, mean) = (ms(l.p50_us), ms(l.p99_us), ms(l.mean_us));
            vec![
                l.path.clone(),
                requests,
                errors,
                p50,
                p99,
                mean,
                added(l.p50_us - direct.0),
                added(l.p99_us - direct.1),
            ]
        }),
    );
    let _ = writeln!(
        s,
        "\nThe filter's cost (headroom with SLO routing minus plain Envoy): **{:.3} ms p50, {:.3} ms p99** \
         (targets <= 0.5 and <= 2). predictor-svc's own time per predict call: {:.0} us.\n",
        r.filter_added_p50_ms, r.filter_added_p99_ms, r.predict_handler_us
    );
    let _ = writeln!(
        s,
        "The endpoint-picker mode's cost (Envoy's ext_proc filter and headroom-epp, SLO routing, minus plain \
         Envoy): **{:.3} ms p50, {:.3} ms p99**.\n",
        r.epp_added_p50_ms, r.epp_added_p99_ms
    );
    let _ = writeln!(s, "## Throughput (closed loop, {} s per run)\n", r.seconds);
    let cores = |c: f64| format!("{c:.2}");
    table(
        &mut s,
        &[
            "path",
            "connections",
            "round",
            "req/s",
            "errors",
            "Envoy cores",
            "predictor cores",
            "simulator cores",
            "predict calls per request",
            "on the stream",
        ],
        r.throughput.iter().map(|t| {
            let (round, rate, errors) = (t.round.to_string(), format!("{:.0}", t.requests_per_s), t.errors.to_string());
            vec![
                t.path.clone(),
                t.connections.to_string(),
                round,
                rate,
                errors,
                cores(t.envoy_cores),
                cores(t.predictor_cores),
                cores(t.simulator_cores),
                t.calls_per_request.map_or(String::new(), |c| format!("{c:.2}")),
                t.calls_on_stream.map_or(String::new(), |c| format!("{:.0}%", c * 100.0)),
            ]
        }),
    );
    let by_connections: Vec<String> =
        r.throughput_share_by_connections.iter().map(|(n, share)| format!("{:.0}% at {n}", share * 100.0)).collect();
    let _ = writeln!(
        s,
        "\nHeadroom with SLO routing sustains **{:.0}%** of plain Envoy's request rate, each path's highest at any \
         connection count (target >= 50%; {} connections).",
        r.throughput_share * 100.0,
        by_connections.join(", ")
    );
    if !r.stream.is_empty() {
        let _ = writeln!(
            s,
            "\n## Streaming (closed loop of streamed completions, {} tokens each, one SSE event per token)\n",
            r.stream_tokens
        );
        table(
            &mut s,
            &[
                "path",
                "round",
                "req/s",
                "tokens/s",
                "errors",
                "Envoy cores",
                "predictor cores",
                "Envoy CPU per token, us",
            ],
            r.stream.iter().map(|t| {
                let (round, errors) = (t.round.to_string(), t.errors.to_string());
                let (rate, tokens) = (format!("{:.0}", t.requests_per_s), format!("{:.0}", t.tokens_per_s));
                let per_token = format!("{:.1}", t.envoy_us_per_token);
                vec![
                    t.path.clone(),
                    round,
                    rate,
                    tokens,
                    errors,
                    cores(t.envoy_cores),
                    cores(t.predictor_cores),
                    per_token,
                ]
            }),
        );
        let _ = writeln!(
            s,
            "\nMetering a streamed response costs Envoy **{:.1} us per token** over plain Envoy's (means over rounds).",
            r.stream_added_us_per_token
        );
    }
    s
}

/// A markdown table: a text first column, the others right-aligned.
fn table(s: &mut String, columns: &[&str], rows: impl Iterator<Item = Vec<String>>) {
    s.push_str(&format!("| {} |\n|", columns.join(" | ")));
    for i in 0..columns.len() {
        s.push_str(if i == 0 { " --- |" } else { " ---: |" });
    }
    s.push('\n');
    for row in rows {
        s.push_str(&format!("| {} |\n", row.join(" | ")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_has_a_row_per_measurement_and_the_headline_figures() {
        let latency = |path: &str, p50_us| LatencyRow {
            path: path.into(),
            requests: 10,
            errors: 0,
            p50_us,
            p99_us: 900.0,
            mean_us: 300.0,
        };
        let r = GatewayResults {
            command: "headroom-bench gateway".into(),
            connections: vec![8],
            seconds: 8.0,
            latency: vec![latency("model server directly", 80.0), latency("plain Envoy", 320.0)],
            throughput: vec![ThroughputRow {
                path: "plain Envoy".into(),
                connections: 8,
                round: 0,
                requests_per_s: 6979.4,
                errors: 0,
                envoy_cores: 1.19,
                predictor_cores: 0.01,
                simulator_cores: 0.45,
                calls_per_request: None,
                calls_on_stream: None,
            }],
            predict_handler_us: 99.0,
            filter_added_p50_ms: 0.687,
            filter_added_p99_ms: 3.911,
            epp_added_p50_ms: 0.9,
            epp_added_p99_ms: 2.5,
            throughput_share: 0.29,
            throughput_share_by_connections: vec![(8, 0.29)],
            stream_tokens: 64,
            stream: vec![StreamRow {
                path: "plain Envoy".into(),
                round: 1,
                requests_per_s: 314.0,
                tokens_per_s: 20114.0,
                errors: 0,
                envoy_cores: 0.24,
                predictor_cores: 0.01,
                envoy_us_per_token: 12.04,
            }],
            stream_added_us_per_token: 15.9,
        };
        let md = report(&r);
        for line in [
            "| path | requests | errors | p50 ms | p99 ms | mean ms | added p50 ms | added p99 ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            "| plain Envoy | 10 | 0 | 0.320 | 0.900 | 0.300 | +0.240 | +0.000 |",
            "| plain Envoy | 8 | 0 | 6979 | 0 | 1.19 | 0.01 | 0.45 |  |  |",
            "| plain Envoy | 1 | 314 | 20114 | 0 | 0.24 | 0.01 | 12.0 |",
            "**0.687 ms p50, 3.911 ms p99**",
            "headroom-epp, SLO routing, minus plain Envoy): **0.900 ms p50, 2.500 ms p99**",
            "sustains **29%**",
            "29% at 8 connections",
            "**15.9 us per token**",
        ] {
            assert!(md.contains(line), "{line:?} missing:\n{md}");
        }
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
