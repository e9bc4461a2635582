//! Each workload's defaults (rates, fleet, speed, lead-in) and its traffic: the requests of
//! a step, and the conversion between wall time and engine time.

use headroom_loadgen::{runner, workload};

use headroom_stack::Engine;

/// The default rate ladder (requests/s) of a workload on 6 H100 + 2 A100: from where
/// every router meets its SLOs to past where the best baseline falls under 90%.
pub fn default_rates(workload: &str) -> Vec<f64> {
    match workload {
        // 2-6k-token prompts: an A100 alone takes ~0.5 s for 6k tokens, beyond the 400 ms
        // interactive TTFT, so routers that ignore hardware miss SLOs even at light load.
        // Every router crosses 90% between 35 and 50: a rung at 42.5 keeps a capacity from
        // being a line drawn across that span (docs/benchmark.md, "long-short, every router").
        "long-short" => vec![20.0, 35.0, 42.5, 50.0, 65.0, 80.0],
        // Sustained, after the lead-in (`default_lead_in`), every router's crossing falls in
        // 200-280 req/s (measured from empty, the cliff looked near 320-400), so the rungs are
        // 20 apart there.
        "short-long" => vec![120.0, 160.0, 200.0, 220.0, 240.0, 260.0, 280.0, 320.0],
        // At a sustained load (the lead-in, `default_lead_in`), 0.25x: least request falls
        // under 90% near 120 req/s, llm-d's default near 116, flow control p90 on the prior's
        // critical classes between 150 and 160 (94% and 63%; docs/benchmark.md, "azure held,
        // the reference run's way"), so the ladder goes to 160. Measured from empty the cliffs
        // looked near 130-170.
        "azure" => vec![80.0, 100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0],
        // Cached system prompts make these cheap: at 0.25x least request falls under 90% near
        // 352 req/s, llm-d's default near 220-240 (its affinity hot-spots the 8 prompts), and flow
        // control p90 kept its critical classes at 425, the old ladder's top (docs/benchmark.md,
        // "The shared-prefix workload with the current method"): 500 bounds it. Least request
        // fell from 95% at 350 to 40% at 425 and flow control's critical classes from 100% at
        // 425 to 57% at 500, two lines across 75 req/s; rungs 25 apart from 350 to 500 place both
        // crossings (docs/notebook/benchmark.md, "shared-prefix on the current code").
        "shared-prefix" => vec![125.0, 200.0, 275.0, 350.0, 375.0, 400.0, 425.0, 450.0, 475.0, 500.0],
        // On two engine-bound servers (`default_fleet`), held 60 s, 600 s steps: least request
        // crosses 90% near 0.8, sticky sessions and llm-d's default near 1.1, flow control
        // p90 near 1.5 (docs/real-engine.md, "The engine-bound fleet in simulated time").
        "multi-turn" => vec![0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8],
        // The same fleet: least request and sticky sessions near 1.1, llm-d's default past 1.4,
        // headroom near 1.5.
        "rag" => vec![0.6, 1.0, 1.4, 1.8, 2.2],
        // On 4 H100 + 4 A100 (`default_fleet`). Least request crosses 90% between 90 and 115,
        // flow control's critical classes between 140 and 165 (96% and 58%): rungs at 102.5 and
        // 152.5 moved those crossings 103.7 -> 107.1 and 143.8 -> 151.2 (docs/benchmark.md,
        // "hetero held on the current code").
        "hetero" => vec![40.0, 65.0, 90.0, 102.5, 115.0, 140.0, 152.5, 165.0],
        // mixed, held at half speed: the baselines fall under 90% between 125 and 140 req/s,
        // flow control p90 on the prior between 140 and 155, its critical classes between 170
        // and 185. Rungs 15 apart from 110, and 7.5 at those three cliffs: each fell over
        // 15 req/s (least request's non-sheddable classes 88% at 140 and 45% at 155; flow
        // control's 94% at 170 and 48% at 185), and the rungs at 132.5, 147.5 and 177.5 moved
        // the verdict's critical capacities from 133.8 / 170.8 to 134.9 / 173.4 (docs/benchmark.md,
        // "mixed held, the reference run's way"). Since the late rule flow control's
        // critical classes keep 96% at 162.5 and 88% at 170, so its crossing falls across 155-170:
        // a rung at 162.5. The low rungs stay for the routers that fall early (round robin,
        // composite: 61-71).
        _ => vec![50.0, 80.0, 110.0, 125.0, 132.5, 140.0, 147.5, 155.0, 162.5, 170.0, 177.5, 185.0, 200.0],
    }
}

/// How fast the simulated servers of a workload run unless `--time-scale` says otherwise.
/// This 2-core host (Envoy, the predictor, 8 simulated engines and the clients share it)
/// saturates near 300 requests or about 80,000 streamed tokens per wall second, and then its
/// CPU, not the routing, sets the latencies (each measurement records the host's CPU, and the
/// report names points over [`host::BUSY`]). `shared-prefix`, whose ladder reaches 500 req/s,
/// runs at 0.25x (the host at most 64% busy to 425); `short-long` streams 300-800 tokens per
/// request to thousands of open streams and runs at 0.15x (over its ladder of 120-320 req/s the
/// host was 43-81% busy, Envoy using about one of its cores to meter the streams). `azure`'s
/// answers stream many tokens too, which Envoy meters one by one: at half speed 2-9% of the
/// predictor's callouts still timed out, at 0.25x under 1% (the host at most 51% busy). `mixed`
/// held at its cliff (170 req/s, [`default_lead_in`]) kept the host 95-97% busy in real time
/// and 52-79% at half speed.
pub fn default_time_scale(workload: &str) -> f64 {
    match workload {
        "mixed" => 0.5,
        "short-long" => 0.15,
        "azure" | "shared-prefix" => 0.25,
        _ => 1.0,
    }
}

/// Seconds of each rate's traffic a workload sends before its measured step, not counted,
/// unless `--lead-in` says otherwise. Every step starts on an empty fleet, so a step shorter
/// than the requests it sends measures the fleet filling up, not the load it can hold. After
/// a lead-in the traffic also goes on past the step until its last request has ended
/// (`step_traffic`): without that, the answers sent in its last seconds decoded in a fleet
/// draining once the traffic stopped (short-long at 240 req/s: 22 ms per token against 31).
/// `short-long`'s answers (300-800 tokens) decode for 8-20 s near its cliff, longer than
/// most of a 15 s step: measured from empty, 320 req/s looked held (95-99%) while held for
/// 45 s every router fell to 41-45%. `azure`'s answers (the trace's, up to 1,000 tokens)
/// decode for 8 s and more near its cliff: measured from empty, llm-d's default held 90% to
/// 132 req/s; held, it met 47% at 140 and 89% at 120. `hetero`'s answers (up to 500 tokens)
/// and `mixed`'s long ones do the same at their cliffs: from empty, least request kept 79% of
/// hetero at 140 req/s, held 51%, and llm-d's default kept 90% of mixed to about 141 req/s
/// from empty in real time, 132 held at half speed (docs/notebook/benchmark.md, "Hetero held").
/// `long-short` (answers of a few dozen tokens) and `shared-prefix` (30-200) end within a few
/// seconds below their cliffs and keep their time.
pub fn default_lead_in(workload: &str) -> f64 {
    match workload {
        "short-long" | "azure" | "hetero" | "mixed" => 20.0,
        // A session lasts 25 s, and a burst of them is what tips the engine-bound fleet over.
        "multi-turn" | "rag" => 60.0,
        _ => 0.0,
    }
}

/// The fleet a workload runs on unless `--servers` says otherwise: 6 H100 + 2 A100, and for
/// `hetero` half A100 (where the GPU classes differ most, prediction should matter most). The
/// conversational workloads, sized for an engine that queues, run on two simulated
/// engine-bound servers, the real bed's (`headroom_sim::profile::Profile::engine_bound`).
pub fn default_fleet(workload: &str) -> Vec<String> {
    if matches!(workload, "multi-turn" | "rag") {
        return vec!["engine-bound".to_string(); 2];
    }
    let a100 = if workload == "hetero" { 4 } else { 2 };
    let mut fleet = vec!["h100".to_string(); 8 - a100];
    fleet.extend(std::iter::repeat_n("a100".to_string(), a100));
    fleet
}

/// The default rate ladder of a workload on the local real vLLM servers (two, a core each, the
/// 2-core reference host): from 1 req/s, the host about half busy, to 5, where it ran 99% busy
/// and every router still met 96-100% of `mixed-small`'s SLOs (docs/real-engine.md,
/// "Routing"): past that the host, not the routing, sets the latencies. Each point records how
/// busy the host was.
pub fn default_rates_vllm(_workload: &str) -> Vec<f64> {
    vec![1.0, 2.0, 3.0, 4.0, 5.0]
}

/// The fleet a workload runs on unless `--servers` says otherwise: the simulator's
/// [`default_fleet`], or the local vLLM servers.
pub(crate) fn default_fleet_on(engine: Engine, workload: &str) -> Vec<String> {
    match engine {
        Engine::Simulator => default_fleet(workload),
        Engine::Vllm => Engine::Vllm.default_profiles(),
    }
}

/// The workloads a real-engine run measures unless `--workloads` says otherwise: the ones
/// sized for a small model on CPU (`workload::mixed_small`).
pub const VLLM_WORKLOADS: [&str; 1] = ["mixed-small"];

/// Seconds of measured traffic per rate on real vLLM: at its rates (1-4 req/s) a 15 s step
/// would judge a router on a few dozen requests.
pub const VLLM_STEP_S: f64 = 40.0;

/// Seconds of each rate's traffic before a real-engine step: `mixed-small`'s answers (up to 200
/// tokens at 3-40 ms each) end within a few seconds, so 10 s puts the fleet at the load.
pub const VLLM_LEAD_IN_S: f64 = 10.0;

/// How many of the trace's requests the `azure` workload replays at every rate: as many as
/// the ladder's lowest rate sends in one step, so that rate plays the window once and
/// each higher rate plays it compressed, looping (`workload::trace_window`).
pub fn trace_window(rates: &[f64], step_s: f64) -> usize {
    let lowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    (lowest * step_s).round().max(1.0) as usize
}

/// The one workload that replays a trace (its first `window` requests at every rate) instead
/// of generating its requests from a seed; the only one `--trace-window` applies to.
pub(crate) const TRACE: &str = "azure";

/// The workload that replays a user's own trace (`--trace FILE`, the format of the bundled
/// one), its first `window` requests at every rate like [`TRACE`].
pub const USER_TRACE: &str = "trace";

/// The requests of `workload` at `rate`, in engine time. Synthetic workloads keep their
/// seed at every rate; a trace plays its first `window` requests at every rate (`trace`: the
/// CSV of [`USER_TRACE`]).
pub(crate) fn requests(
    name: &str,
    seed: u64,
    rate: f64,
    duration: f64,
    window: usize,
    trace: Option<&str>,
) -> anyhow::Result<Vec<workload::RequestSpec>> {
    let generated = match (name, trace) {
        (USER_TRACE, Some(csv)) => workload::trace_window(csv, seed, window, rate, duration),
        (USER_TRACE, None) => Err("the trace workload replays --trace FILE, and none was given".to_string()),
        (TRACE, _) => workload::azure_window(seed, window, rate, duration),
        _ => workload::by_name(name, seed, rate, duration, 1.0),
    };
    generated.map_err(anyhow::Error::msg)
}

/// Engine seconds a request may last (the clients' timeout) and so the traffic kept on
/// after a step: the runner stops sending it once the step's last request has ended.
pub(crate) const LONGEST_REQUEST_S: f64 = 120.0;

/// A step's traffic at `rate` from `seed`, `(lead_in_s, step_s)` long, and how many of its
/// requests are the lead-in's and the step's. After a lead-in the same traffic goes on past
/// the step, as long as a request may last, for the runner to send until the step's last
/// request has ended (`runner::run_with_trailing`): a sustained load holds on both sides.
pub(crate) fn step_traffic(
    workload: &str,
    seed: u64,
    rate: f64,
    (lead_in_s, step_s): (f64, f64),
    window: usize,
    trace: Option<&str>,
) -> anyhow::Result<(Vec<workload::RequestSpec>, usize)> {
    let end = lead_in_s + step_s;
    let after = if lead_in_s > 0.0 { LONGEST_REQUEST_S } else { 0.0 };
    let mut sent = requests(workload, seed, rate, end + after, window, trace)?;
    sent.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let measured = sent.partition_point(|s| s.at_s < end);
    Ok((sent, measured))
}

/// Engine-time requests as sent on a simulator running `scale` times real time.
pub fn to_wall(mut specs: Vec<workload::RequestSpec>, scale: f64) -> Vec<workload::RequestSpec> {
    if scale == 1.0 {
        return specs;
    }
    for s in &mut specs {
        s.at_s /= scale;
        s.class.ttft_ms = s.class.ttft_ms.map(|x| x / scale);
        s.class.tpot_ms = s.class.tpot_ms.map(|x| x / scale);
    }
    specs
}

/// The outcomes of the requests sent after the first `lead_in_s` seconds, their times
/// counted from the end of the lead-in: the measured step.
pub fn after_lead_in(outcomes: Vec<runner::Outcome>, lead_in_s: f64) -> Vec<runner::Outcome> {
    if lead_in_s <= 0.0 {
        return outcomes;
    }
    outcomes
        .into_iter()
        .filter(|o| o.at_s >= lead_in_s)
        .map(|mut o| {
            o.at_s -= lead_in_s;
            o
        })
        .collect()
}

/// Wall-time outcomes back in engine time (SLO checks are unchanged: both sides scale).
pub fn to_engine(mut outcomes: Vec<runner::Outcome>, scale: f64) -> Vec<runner::Outcome> {
    if scale == 1.0 {
        return outcomes;
    }
    for o in &mut outcomes {
        o.at_s *= scale;
        o.e2e_ms *= scale;
        for v in [
            &mut o.ttft_ms,
            &mut o.tpot_ms,
            &mut o.slo_ttft_ms,
            &mut o.slo_tpot_ms,
            &mut o.predicted_ttft_ms,
            &mut o.predicted_tpot_ms,
            &mut o.queued_ms,
        ] {
            *v = v.map(|x| x * scale);
        }
    }
    outcomes
}

/// The seed of the ladder's traffic; repeats use [`repeat_seed`].
pub(crate) const LADDER_SEED: u64 = 11;

/// The seed of the warm-up traffic.
pub(crate) const WARMUP_SEED: u64 = 12;

/// The seed of the `k`-th repeat (1..) of a point.
pub(crate) fn repeat_seed(k: u32) -> u64 {
    LADDER_SEED + 100 * u64::from(k)
}
