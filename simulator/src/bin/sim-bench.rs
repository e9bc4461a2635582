//! `cargo run --release -p headroom-sim --bin sim-bench`
//!
//! Prints the calibration checks and the load sweep of `docs/simulator.md`
//! as markdown tables. Runs the engine in simulated time: deterministic, and
//! independent of how busy this machine is.

use headroom_protocol::tokens::{estimate_tokens, prefix_block_hashes};
use headroom_sim::engine::{Engine, NewRequest};
use headroom_sim::profile::Profile;
use headroom_sim::virtual_time::{closed_loop, quantile, Shape};

/// Engine-side (TTFT, TPOT) of one request alone.
fn alone(profile: Profile, prompt: u32, output: u32) -> (f64, f64) {
    let r = closed_loop(profile, 1, 1, 0, &[Shape { prompt_tokens: prompt, output_tokens: output }]);
    let l = r.latencies[0];
    (l.ttft_ms, l.tpot_ms.unwrap_or(0.0))
}

/// Duration of one decode step with `n` requests of `context` tokens, optionally joined by a prefill of `chunk`.
fn decode_step(profile: Profile, n: u64, context: u32, chunk: Option<u32>) -> f64 {
    let mut e = Engine::new(profile);
    for id in 0..n {
        e.submit(NewRequest { id, prompt_tokens: context, max_tokens: 1000, block_hashes: vec![] });
    }
    let mut decoding = 0;
    while decoding < n as usize {
        decoding = e.step().map(|s| s.tokens.len()).unwrap_or(n as usize);
    }
    if let Some(c) = chunk {
        e.submit(NewRequest { id: n, prompt_tokens: c, max_tokens: 2, block_hashes: vec![] });
    }
    e.step().map(|s| s.duration_ms).unwrap_or(0.0)
}

/// TTFT of a prompt sharing its first `shared` tokens with an earlier request, cold vs warm.
fn prefix_ttft(profile: Profile, shared_tokens: usize) -> (f64, f64, u32) {
    let system = "x".repeat(shared_tokens * 4);
    let mk = |id, q: &str| {
        let text = format!("{system}{q}");
        NewRequest {
            id,
            prompt_tokens: estimate_tokens(&text),
            max_tokens: 2,
            block_hashes: prefix_block_hashes(&text, usize::MAX),
        }
    };
    let mut e = Engine::new(profile);
    let ttft = |e: &mut Engine, req: NewRequest| {
        let id = req.id;
        e.submit(req);
        let (mut t, mut first, mut cached) = (0.0, 0.0, 0);
        while let Some(s) = e.step() {
            t += s.duration_ms;
            if let Some(tok) = s.tokens.iter().find(|tok| tok.id == id && tok.index == 1) {
                first = t;
                cached = tok.cached_tokens;
            }
        }
        (first, cached)
    };
    let (cold, _) = ttft(&mut e, mk(1, &"a question about one thing ".repeat(8)));
    let (warm, cached) = ttft(&mut e, mk(2, &"a different question here ".repeat(8)));
    (cold, warm, cached)
}

fn main() {
    println!("## Calibration (engine time, ms; API overhead not included)\n");
    println!("| check | H100 model | H100 target | A100 model | A100 target |");
    println!("| --- | --- | --- | --- | --- |");
    let (h2k, ht) = alone(Profile::h100(), 2048, 64);
    let (a2k, at) = alone(Profile::a100(), 2048, 64);
    let (h8k, _) = alone(Profile::h100(), 8192, 2);
    let (a8k, _) = alone(Profile::a100(), 8192, 2);
    println!("| TTFT, 2k prompt alone | {h2k:.1} | 53 | {a2k:.1} | |");
    println!("| TTFT, 8k prompt alone | {h8k:.1} | 241 | {a8k:.1} | |");
    println!("| TPOT alone | {ht:.2} | 6.8 | {at:.2} | 11.4 |");
    let (h64, a64) = (decode_step(Profile::h100(), 64, 2048, None), decode_step(Profile::a100(), 64, 2048, None));
    println!("| TPOT, 64 requests of 2k context | {h64:.2} | 15.6 | {a64:.2} | |");
    let (hp, ap) =
        (decode_step(Profile::h100(), 64, 2048, Some(2048)), decode_step(Profile::a100(), 64, 2048, Some(2048)));
    println!("| decode step when a 2k prefill joins those 64 | {hp:.1} | 63 | {ap:.1} | |");
    let (cold, warm, cached) = prefix_ttft(Profile::h100(), 2000);
    println!("\nPrefix cache (H100): a 2,000-token shared prefix, second request: TTFT {cold:.1} ms cold -> {warm:.1} ms warm, {cached} tokens reported cached.");

    let mut small = Profile::h100();
    small.kv_capacity_tokens = 60_000;
    let r = closed_loop(small, 64, 300, 0, &[Shape { prompt_tokens: 1000, output_tokens: 600 }]);
    println!(
        "Preemption: H100 with KV shrunk to 60k tokens, 64 concurrent requests of 1000 + 600 tokens: {} preemptions.",
        r.preemptions
    );

    println!("\n## Load sweep (closed loop, engine time, ms)\n");
    println!("Request shapes cycle through prompt/output (200/400), (1000/200), (3000/50), (600/150).\n");
    println!("| concurrency | H100 TTFT p50 | H100 TTFT p90 | H100 TPOT p50 | H100 TPOT p90 | A100 TTFT p50 | A100 TTFT p90 | A100 TPOT p50 | A100 TPOT p90 |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let shapes = [
        Shape { prompt_tokens: 200, output_tokens: 400 },
        Shape { prompt_tokens: 1000, output_tokens: 200 },
        Shape { prompt_tokens: 3000, output_tokens: 50 },
        Shape { prompt_tokens: 600, output_tokens: 150 },
    ];
    for c in [1usize, 4, 16, 32, 64, 128, 256] {
        let mut row = format!("| {c} |");
        for profile in [Profile::h100(), Profile::a100()] {
            let r = closed_loop(profile, c, 400 + 4 * c, c, &shapes);
            let mut ttft: Vec<f64> = r.latencies.iter().map(|l| l.ttft_ms).collect();
            let mut tpot: Vec<f64> = r.latencies.iter().filter_map(|l| l.tpot_ms).collect();
            row.push_str(&format!(
                " {:.0} | {:.0} | {:.1} | {:.1} |",
                quantile(&mut ttft, 0.5),
                quantile(&mut ttft, 0.9),
                quantile(&mut tpot, 0.5),
                quantile(&mut tpot, 0.9)
            ));
        }
        println!("{row}");
    }
}
