//! `headroom-stack accuracy`: how well the predictor predicts, through the real
//! stack (2 simulated H100 + 1 A100, the real Envoy and filter), on mixed
//! traffic and then after a shift to long prompts (docs/predictor.md).
//!
//! It polls the predictor every [`POLL`] and prints a table. With `--json` it
//! makes a second pass with the p90 objective (for coverage) and writes the
//! figures issue #11 judges by, each a number (`null` when the run could not
//! measure it, e.g. no model was trained):
//!
//! - `holdout_mape_ttft`/`_tpot`: the active model's held-out error at the end of
//!   the mixed phase; `live_mape_ttft`/`_tpot`: the predictor's live error (last
//!   500 observations) then; `tier_precision`: the share of positive-tier
//!   placements that met their SLOs (last 500), then.
//! - `shift_recovery_s`: seconds after the shift until both targets' recent error
//!   (the observations of the last [`RECENT`]) is back within 1.5x its value over
//!   the mixed phase's last [`BEFORE`], and stays there; the shifted phase's length
//!   when it never is. The predictor's 500-observation window is too slow for this
//!   (at 7.5 req/s it takes over a minute just to turn over), so the run computes
//!   this one itself from `/v1/observations`.
//! - `p90_live_coverage_ttft`/`_tpot`: live coverage at the end of the p90 pass.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use headroom_loadgen::runner;
use headroom_loadgen::workload::{self, RequestSpec};
use headroom_protocol::stats;
use headroom_sim::floor::{self, Arrival, Floor, FloorOptions};
use headroom_sim::profile::Profile;
use headroom_sim::virtual_time::Shape;
use serde::Serialize;
use serde_json::Value;

use crate::{host, http, Engine, Stack, StackOptions};

/// How often the predictor is polled.
pub const POLL: Duration = Duration::from_secs(5);
/// The window of recent observations the shift recovery is judged on.
pub const RECENT: Duration = Duration::from_secs(15);
/// The stretch of the mixed phase the pre-shift error is taken over.
pub const BEFORE: Duration = Duration::from_secs(30);
/// Recovered: recent error within this factor of the pre-shift error.
pub const RECOVERED_WITHIN: f64 = 1.5;
/// The run's fleet: one pool of two H100 and an A100.
pub const FLEET: [&str; 3] = ["h100", "h100", "a100"];

/// A workload's generator: `(seed, rate, seconds)`.
type Generate = fn(u64, f64, f64) -> Vec<RequestSpec>;

/// One phase of the run's traffic.
struct Phase {
    name: &'static str,
    generate: Generate,
    seed: u64,
    rate: f64,
    seconds: f64,
    /// Which sending of its workload ([`workload::as_run`]).
    run: u32,
}

impl Phase {
    fn traffic(&self) -> Vec<RequestSpec> {
        workload::as_run((self.generate)(self.seed, self.rate, self.seconds), self.run)
    }
}

/// Mixed traffic, then the prefill-heavy shift at half the rate (sized for the small model
/// on real vLLM).
fn phases(opts: &AccuracyOptions) -> [Phase; 2] {
    let (mixed, long): (Generate, Generate) = match opts.engine {
        Engine::Simulator => (workload::mixed, workload::long_prompts),
        Engine::Vllm => (workload::mixed_small, workload::long_prompts_small),
    };
    [
        Phase { name: "mixed", generate: mixed, seed: 7, rate: opts.rate, seconds: opts.warmup_s, run: 0 },
        // New prompt text: the shift's first requests find nothing of the warm-up's cached.
        Phase { name: "shifted", generate: long, seed: 8, rate: opts.rate / 2.0, seconds: opts.shift_s, run: 1 },
    ]
}

/// What to run.
#[derive(Debug, Clone)]
pub struct AccuracyOptions {
    pub run_dir: PathBuf,
    /// The simulated fleet (2 H100 + 1 A100) or two real vLLM servers.
    pub engine: Engine,
    /// Give the predictor each class's measured profile as its prior (vLLM's default).
    pub profile: bool,
    /// Seconds of mixed traffic before the shift.
    pub warmup_s: f64,
    /// Seconds of prefill-heavy traffic after it.
    pub shift_s: f64,
    pub rate: f64,
    /// Training objective of the first pass (`mean` or `p90`).
    pub objective: String,
    /// Where the figures go (and a p90 pass runs); `None`: the table only.
    pub json: Option<PathBuf>,
    /// Filter configuration fields over the stack's defaults (to measure another setting).
    pub plugin: serde_json::Map<String, Value>,
    /// Simulator time scale (1: real time; below 1 slows the servers, so the host's own
    /// timing jitter weighs less against the engine's latencies).
    pub time_scale: f64,
    /// Where every observation of the first pass goes, one JSON object a line with its
    /// phase (`{"phase": .., "observation": ..}`): for analysis offline.
    pub observations: Option<PathBuf>,
}

/// The figures of a run (`--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AccuracyFigures {
    pub holdout_mape_ttft: Option<f64>,
    pub holdout_mape_tpot: Option<f64>,
    pub live_mape_ttft: Option<f64>,
    pub live_mape_tpot: Option<f64>,
    pub shift_recovery_s: Option<f64>,
    pub p90_live_coverage_ttft: Option<f64>,
    pub p90_live_coverage_tpot: Option<f64>,
    pub tier_precision: Option<f64>,
    /// The error of the prediction each request was placed by, against what its client
    /// measured (streamed 200s routed by a prediction), per window of [`WINDOW_S`] seconds
    /// from the start of traffic: `[TTFT, TPOT]` MAPE. The first is the prior's (or the
    /// profile's) alone; the fourth ends at 120 s.
    pub window_mape: Vec<[Option<f64>; 2]>,
    /// `[TTFT, TPOT]` of [`hindsight_mape`] over the mixed phase: the reference the windows
    /// are read against.
    pub hindsight_mape: [Option<f64>; 2],
    /// The host's CPU busy share over the mixed phase (%).
    pub host_busy_percent: Option<f64>,
}

/// Seconds per window of [`AccuracyFigures::window_mape`].
pub const WINDOW_S: f64 = 30.0;

/// `[TTFT, TPOT]` MAPE of the predictions at placement against the client's measurements,
/// per [`WINDOW_S`] window of arrival time (`None` where a window has none).
pub fn window_mape(outcomes: &[runner::Outcome]) -> Vec<[Option<f64>; 2]> {
    let end = outcomes.iter().map(|o| o.at_s).fold(0.0, f64::max);
    let windows = (end / WINDOW_S).floor() as usize + 1;
    let mut errors = vec![[Vec::new(), Vec::new()]; windows];
    for o in outcomes.iter().filter(|o| o.status == 200 && o.stream) {
        let w = ((o.at_s / WINDOW_S).floor() as usize).min(windows - 1);
        for (k, (predicted, measured)) in
            [(o.predicted_ttft_ms, o.ttft_ms), (o.predicted_tpot_ms, o.tpot_ms)].into_iter().enumerate()
        {
            if let (Some(p), Some(m)) = (predicted, measured.filter(|m| *m > 0.0)) {
                errors[w][k].push((p - m).abs() / m);
            }
        }
    }
    let mean = |v: &Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    errors.iter().map(|[t, d]| [mean(t), mean(d)]).collect()
}

/// Prompt tokens per bucket of [`hindsight_mape`].
pub const HINDSIGHT_BUCKET_TOKENS: u32 = 256;

/// `[TTFT, TPOT]` MAPE of a predictor that knew the answer for each prompt length in
/// hindsight: the median measured latency of the scored requests (as [`window_mape`]
/// scores them) in each [`HINDSIGHT_BUCKET_TOKENS`] bucket of prompt length, as the
/// prediction of each of them. It reads no engine state, so a predictor that does can go
/// under it; it is the reference a live error is read against where no replayed floor
/// exists (real engines: the simulator's floor replays each request's futures, `--floor`).
/// On a host busy enough that identical requests spread widely, no dispatch-time
/// predictor goes far under it.
pub fn hindsight_mape(outcomes: &[runner::Outcome]) -> [Option<f64>; 2] {
    let scored = || outcomes.iter().filter(|o| o.status == 200 && o.stream);
    [0, 1].map(|k| {
        let mut buckets: std::collections::BTreeMap<u32, Vec<f64>> = Default::default();
        for o in scored() {
            if let Some(m) = [o.ttft_ms, o.tpot_ms][k].filter(|m| *m > 0.0 && m.is_finite()) {
                buckets.entry(o.prompt_tokens / HINDSIGHT_BUCKET_TOKENS).or_default().push(m);
            }
        }
        let medians = buckets.values().map(|v| (stats::quantile(v, 0.5).unwrap_or(f64::NAN), &v[..]));
        stats::spread_around(medians)
    })
}

/// What one pass measured.
#[derive(Debug, Clone, Default)]
struct Pass {
    window_mape: Vec<[Option<f64>; 2]>,
    hindsight_mape: [Option<f64>; 2],
    host_busy_percent: Option<f64>,
    holdout_mape: [Option<f64>; 2],
    live_mape: [Option<f64>; 2],
    tier_precision: Option<f64>,
    shift_recovery_s: Option<f64>,
    end_coverage: [Option<f64>; 2],
}

/// Runs the measurement; prints tables, writes `--json` if asked.
pub fn run(opts: &AccuracyOptions) -> anyhow::Result<AccuracyFigures> {
    let first = pass(opts, &opts.objective, opts.observations.as_deref())?;
    let mut figures = AccuracyFigures {
        holdout_mape_ttft: first.holdout_mape[0],
        holdout_mape_tpot: first.holdout_mape[1],
        live_mape_ttft: first.live_mape[0],
        live_mape_tpot: first.live_mape[1],
        shift_recovery_s: first.shift_recovery_s,
        tier_precision: first.tier_precision,
        window_mape: first.window_mape.clone(),
        hindsight_mape: first.hindsight_mape,
        host_busy_percent: first.host_busy_percent,
        ..AccuracyFigures::default()
    };
    if let Some(path) = &opts.json {
        let p90 = if opts.objective == "p90" { first } else { pass(opts, "p90", None)? };
        figures.p90_live_coverage_ttft = p90.end_coverage[0];
        figures.p90_live_coverage_tpot = p90.end_coverage[1];
        std::fs::write(path, serde_json::to_vec_pretty(&figures)?)
            .map_err(|e| anyhow::anyhow!("--json {}: {e}", path.display()))?;
        println!("\nfigures: {}", path.display());
    }
    Ok(figures)
}

/// One stack, mixed then shifted traffic, polled throughout; every observation is written
/// to `observations` when given.
fn pass(opts: &AccuracyOptions, objective: &str, observations: Option<&std::path::Path>) -> anyhow::Result<Pass> {
    let _ = std::fs::remove_dir_all(opts.run_dir.join("predictor-data"));
    let profiles = match opts.engine {
        Engine::Simulator => FLEET.map(String::from).to_vec(),
        Engine::Vllm => opts.engine.default_profiles(),
    };
    // Requests placed when they arrive, unless `--plugin` says otherwise: the run measures
    // predictions against the load they were made for, and flow control's waits (on by
    // default) would reshape that load between one pass and the next.
    let mut plugin = opts.plugin.clone();
    plugin.entry("flow_control").or_insert(Value::Bool(false));
    let stack = Stack::start(StackOptions {
        run_dir: opts.run_dir.clone(),
        engine: opts.engine,
        profile: opts.profile,
        profiles,
        objective: objective.to_string(),
        plugin,
        time_scale: opts.time_scale,
        ..Default::default()
    })?;
    let fleet = match opts.engine {
        Engine::Simulator => "2 simulated H100 + 1 A100",
        Engine::Vllm => "2 real vLLM servers (a core each)",
    };
    let prior = if opts.profile { "profiled prior" } else { "analytic prior" };
    println!("\nstack up: {fleet}, {prior}, objective {objective}, {} req/s\n", opts.rate);
    if opts.profile {
        print_idle_spread(&opts.run_dir.join("profiles"));
    }
    println!(
        "| time | phase | model | serving TTFT / TPOT | train samples | live MAPE TTFT | live MAPE TPOT | coverage TTFT | coverage TPOT | recent MAPE TTFT | recent MAPE TPOT | tier precision |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let target = runner::Target {
        model: stack.state.model.clone(),
        ..runner::Target::slo_routed(format!("http://{}", stack.state.gateway))
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let started = Instant::now();
    let mut probe = Probe::new(&stack);
    if let Some(path) = observations {
        let file =
            std::fs::File::create(path).map_err(|e| anyhow::anyhow!("--observations {}: {e}", path.display()))?;
        probe.dump = Some(std::io::BufWriter::new(file));
    }
    let mut result = Pass::default();
    let mut before = [None, None];
    let mut shifted: Vec<(f64, [Option<f64>; 2])> = Vec::new();
    for p in phases(opts) {
        let (phase, work) = (p.name, p.traffic());
        probe.phase = phase;
        let t = target.clone();
        let traffic = runtime.spawn(async move { runner::run(&t, &work).await });
        let phase_started = Instant::now();
        let busy = host::Busy::start();
        while !traffic.is_finished() {
            std::thread::sleep(POLL);
            let sample = probe.sample();
            println!("{}", sample.row(started, phase));
            if phase == "shifted" {
                shifted.push((phase_started.elapsed().as_secs_f64(), sample.recent));
            }
        }
        let outcomes = runtime.block_on(traffic)??;
        if phase == "mixed" {
            result.host_busy_percent = Some(busy.percent()).filter(|b| b.is_finite());
            result.window_mape = window_mape(&outcomes);
            result.hindsight_mape = hindsight_mape(&outcomes);
            print_windows(&result.window_mape, result.hindsight_mape, result.host_busy_percent);
            let sample = probe.sample();
            result.holdout_mape = sample.holdout_mape;
            result.live_mape = sample.live_mape;
            result.tier_precision = sample.tier_precision;
            before = probe.recent_mape(BEFORE);
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    let end = probe.sample();
    println!("{}", end.row(started, "end"));
    result.end_coverage = end.live_coverage;
    result.shift_recovery_s = recovery(before, &shifted, opts.shift_s);
    print_versions(&end.models);
    Ok(result)
}

/// A share as a table cell: `12.3%`, or `-` when there is none.
fn pct(share: Option<f64>) -> String {
    share.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x))
}

/// Prints, per profiled class in `dir`, how far identical requests spread on its idle
/// server (`profile::spread`): the floor the windows' errors are read against.
fn print_idle_spread(dir: &std::path::Path) {
    use headroom_predictor_config::profile::{TpotFile, TtftFile};
    let read = |path: PathBuf| std::fs::read(path).ok();
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut names: Vec<String> =
        entries.filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix("-ttft.json").map(String::from)).collect();
    names.sort();
    for name in names {
        let ttft =
            read(dir.join(format!("{name}-ttft.json"))).and_then(|b| serde_json::from_slice::<TtftFile>(&b).ok());
        let tpot =
            read(dir.join(format!("{name}-tpot.json"))).and_then(|b| serde_json::from_slice::<TpotFile>(&b).ok());
        println!(
            "profile {name}: identical requests on the idle server spread {} (TTFT), {} (TPOT) around each point's p50\n",
            pct(ttft.and_then(|f| f.spread())),
            pct(tpot.and_then(|f| f.spread()))
        );
    }
}

/// Prints the mixed phase's per-window error of the predictions requests were placed by.
fn print_windows(windows: &[[Option<f64>; 2]], hindsight: [Option<f64>; 2], busy: Option<f64>) {
    println!("\n| seconds | TTFT MAPE at placement | TPOT MAPE at placement |");
    println!("| --- | ---: | ---: |");
    for (i, [ttft, tpot]) in windows.iter().enumerate() {
        let from = i as f64 * WINDOW_S;
        println!("| {from:.0}-{:.0} | {} | {} |", from + WINDOW_S, pct(*ttft), pct(*tpot));
    }
    println!(
        "| hindsight median per {HINDSIGHT_BUCKET_TOKENS}-token prompt bucket | {} | {} |",
        pct(hindsight[0]),
        pct(hindsight[1])
    );
    println!("host CPU busy over the phase: {}\n", busy.map_or("-".to_string(), |b| format!("{b:.0}%")));
}

/// Requests of a phase that arrive before its fleet is filled are not scored by the floor.
const FLOOR_WARMUP_S: f64 = 10.0;

/// The error floor of each phase (`headroom-sim`'s [`floor`]): the same arrivals on the
/// same fleet in simulated time, each request's latency replayed under `futures` fresh
/// futures drawn from the phase's own workload (another seed). Runs the phases on two
/// threads; seconds, not minutes.
pub fn floors(
    opts: &AccuracyOptions,
    futures: usize,
    report_lag_ms: f64,
) -> anyhow::Result<Vec<(&'static str, Floor)>> {
    let profiles = FLEET
        .iter()
        .map(|name| Profile::by_name(name).ok_or_else(|| anyhow::anyhow!("no simulator profile {name}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let shape = |r: &RequestSpec| Shape { prompt_tokens: r.prompt_tokens, output_tokens: r.max_tokens };
    let all = phases(opts);
    let floors = std::thread::scope(|scope| {
        let handles: Vec<_> = all
            .iter()
            .map(|p| {
                let profiles = &profiles;
                scope.spawn(move || {
                    let arrivals: Vec<Arrival> =
                        p.traffic().iter().map(|r| Arrival { at_ms: r.at_s * 1000.0, shape: shape(r) }).collect();
                    let future_shapes = (p.generate)(p.seed + 1000, p.rate, 600.0).iter().map(shape).collect();
                    let options = FloorOptions {
                        futures,
                        warmup_ms: FLOOR_WARMUP_S * 1000.0,
                        rate_per_ms: p.rate / 1000.0,
                        future_shapes,
                        seed: p.seed,
                        report_lag_ms,
                    };
                    (p.name, floor::floor(profiles, &arrivals, &options))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect::<Result<Vec<_>, _>>()
    });
    floors.map_err(|_| anyhow::anyhow!("a floor thread panicked"))
}

/// Writes each phase's scored requests as `<dir>/<phase>.csv`: the server's state when
/// the request arrived (exact, and as a predictor a report tick late sees it) and what
/// the request took, for analysis offline (docs/notebook/predictor.md, "What the state knows").
pub fn write_floor_records(dir: &std::path::Path, floors: &[(&str, Floor)]) -> anyhow::Result<()> {
    use std::fmt::Write;
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("--floor-dump {}: {e}", dir.display()))?;
    for (phase, f) in floors {
        let mut csv = String::from(
            "server,prompt_tokens,output_tokens,running,waiting,in_flight,prefill_tokens,tokens,\
             lagged_in_flight,lagged_prefill_tokens,lagged_tokens,step_left_ms,ttft_ms,tpot_ms\n",
        );
        let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
        for r in &f.records {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},{},{},{},{},{},{:.3},{},{}",
                r.server,
                r.shape.prompt_tokens,
                r.shape.output_tokens,
                r.running,
                r.waiting,
                r.fresh.in_flight,
                r.fresh.prefill_tokens,
                r.fresh.tokens,
                r.lagged.in_flight,
                r.lagged.prefill_tokens,
                r.lagged.tokens,
                r.step_left_ms,
                opt(r.ttft_ms),
                opt(r.tpot_ms)
            );
        }
        let path = dir.join(format!("{phase}.csv"));
        std::fs::write(&path, csv).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Prints [`floors`] as a table.
pub fn print_floors(floors: &[(&str, Floor)]) {
    println!("| phase | target | requests | future unknown | + step clock unknown | + step clock, median predicted |");
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    for (phase, f) in floors {
        for (target, t) in [("TTFT", f.ttft), ("TPOT", f.tpot)] {
            println!(
                "| {phase} | {target} | {} | {} | {} | {} |",
                t.requests,
                pct(t.future),
                pct(t.future_and_step),
                pct(t.future_and_step_median)
            );
        }
    }
}

/// Seconds until the recent error stayed within [`RECOVERED_WITHIN`] of `before` on
/// both targets; `length` when the last sample is still out; `None` without a
/// pre-shift figure.
fn recovery(before: [Option<f64>; 2], shifted: &[(f64, [Option<f64>; 2])], length: f64) -> Option<f64> {
    let bound = [before[0]? * RECOVERED_WITHIN, before[1]? * RECOVERED_WITHIN];
    // A target with no recent figure (no observation in the window) is not judged out.
    let out = |e: &[Option<f64>; 2]| (0..2).any(|k| e[k].is_some_and(|v| v > bound[k]));
    match shifted.iter().rposition(|(_, e)| out(e)) {
        None => Some(0.0),
        Some(last_out) => Some(shifted.get(last_out + 1).map_or(length, |(t, _)| *t)),
    }
}

/// One look at the predictor.
struct Sample {
    models: Value,
    live_mape: [Option<f64>; 2],
    live_coverage: [Option<f64>; 2],
    holdout_mape: [Option<f64>; 2],
    recent: [Option<f64>; 2],
    tier_precision: Option<f64>,
}

impl Sample {
    fn row(&self, started: Instant, phase: &str) -> String {
        format!(
            "| {:>4.0} s | {phase} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            started.elapsed().as_secs_f64(),
            self.models["active"].as_str().unwrap_or("?"),
            // Which side of the contest serves each target (`/v1/models`' `serving`): the
            // active model, the prior, or each on the hardware classes it won.
            self.models["serving"]["ttft"].as_str().unwrap_or("-"),
            self.models["serving"]["tpot"].as_str().unwrap_or("-"),
            self.models["samples"]["train"],
            pct(self.live_mape[0]),
            pct(self.live_mape[1]),
            pct(self.live_coverage[0]),
            pct(self.live_coverage[1]),
            pct(self.recent[0]),
            pct(self.recent[1]),
            pct(self.tier_precision),
        )
    }
}

/// Reads the predictor, and keeps each poll's new observations' errors.
struct Probe<'a> {
    stack: &'a Stack,
    seen: u64,
    /// (when polled, absolute percentage errors of the observations new since the last poll).
    polls: VecDeque<(Instant, [Vec<f64>; 2])>,
    /// The phase under way, and where its observations are written (`--observations`).
    phase: &'static str,
    dump: Option<std::io::BufWriter<std::fs::File>>,
}

impl<'a> Probe<'a> {
    fn new(stack: &'a Stack) -> Self {
        Probe { stack, seen: 0, polls: VecDeque::new(), phase: "", dump: None }
    }

    fn get(&self, path: &str) -> Value {
        let token = self.stack.state.token.as_deref();
        http::get_with_token(self.stack.state.predictor, path, token)
            .ok()
            .and_then(|(_, body)| serde_json::from_str(&body).ok())
            .unwrap_or_default()
    }

    fn sample(&mut self) -> Sample {
        self.poll_observations();
        let metrics = http::get(self.stack.state.predictor, "/metrics").map(|r| r.1).unwrap_or_default();
        let value = |name: &str| {
            metrics.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.trim().parse().ok())
        };
        let models = self.get("/v1/models");
        let active = models["active"].as_str().unwrap_or_default().to_string();
        let version = models["versions"]
            .as_array()
            .and_then(|v| v.iter().find(|m| m["version"].as_u64().is_some_and(|n| format!("v{n}") == active)).cloned());
        let holdout = |key: &str| version.as_ref().and_then(|v| v[key].as_f64());
        Sample {
            live_mape: ["ttft", "tpot"].map(|t| value(&format!("headroom_live_mape{{target=\"{t}\"}}"))),
            live_coverage: ["ttft", "tpot"].map(|t| value(&format!("headroom_live_coverage{{target=\"{t}\"}}"))),
            holdout_mape: [holdout("holdout_mape_ttft"), holdout("holdout_mape_tpot")],
            recent: self.recent_mape(RECENT),
            tier_precision: value("headroom_tier_precision"),
            models,
        }
    }

    /// Takes the observations reported since the last poll.
    fn poll_observations(&mut self) {
        let (total, list) = self.stack.observations_since(self.seen, 5000).unwrap_or((self.seen, Vec::new()));
        self.seen = total;
        let mut errors = [Vec::new(), Vec::new()];
        for o in &list {
            if let Some(dump) = self.dump.as_mut() {
                use std::io::Write;
                let line = serde_json::json!({ "phase": self.phase, "observation": o });
                let _ = writeln!(dump, "{line}");
            }
            if o["status"].as_u64() != Some(200) || o["request"]["streaming"].as_bool() != Some(true) {
                continue;
            }
            for (k, (actual, predicted)) in
                [("ttft_ms", "predicted_ttft_ms"), ("tpot_ms", "predicted_tpot_ms")].into_iter().enumerate()
            {
                if let (Some(a), Some(p)) = (o[actual].as_f64(), o[predicted].as_f64()) {
                    if a > 0.0 {
                        errors[k].push((p - a).abs() / a);
                    }
                }
            }
        }
        self.polls.push_back((Instant::now(), errors));
        while self.polls.front().is_some_and(|(t, _)| t.elapsed() > BEFORE.max(RECENT) + POLL) {
            self.polls.pop_front();
        }
    }

    /// MAPE per target of the observations polled within `window`.
    fn recent_mape(&self, window: Duration) -> [Option<f64>; 2] {
        [0, 1].map(|k| {
            let errors: Vec<f64> = self
                .polls
                .iter()
                .filter(|(t, _)| t.elapsed() <= window)
                .flat_map(|(_, e)| e[k].iter().copied())
                .collect();
            (!errors.is_empty()).then(|| errors.iter().sum::<f64>() / errors.len() as f64)
        })
    }
}

fn print_versions(models: &Value) {
    println!("\nmodel versions (held-out error at training time):\n");
    println!("| version | train samples TTFT/TPOT | holdout | holdout MAPE TTFT | holdout MAPE TPOT | coverage TTFT | coverage TPOT | train ms |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let cell = |v: &Value| pct(v.as_f64());
    for v in models["versions"].as_array().cloned().unwrap_or_default() {
        println!(
            "| v{} | {}/{} | {} | {} | {} | {} | {} | {} |",
            v["version"],
            v["train_samples_ttft"],
            v["train_samples_tpot"],
            v["holdout_samples"],
            cell(&v["holdout_mape_ttft"]),
            cell(&v["holdout_mape_tpot"]),
            cell(&v["holdout_coverage_ttft"]),
            cell(&v["holdout_coverage_tpot"]),
            v["train_ms"]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shifted_regimes_tpot_floor_is_where_recovery_is_judged() {
        // The run's own traffic, shortened: the long prompts' TPOT cannot be predicted
        // within 1.5x of what the mixed phase allows (docs/notebook/predictor.md, "What the state knows").
        let opts = AccuracyOptions {
            run_dir: PathBuf::new(),
            engine: Engine::Simulator,
            profile: false,
            warmup_s: 40.0,
            shift_s: 40.0,
            rate: 15.0,
            objective: "mean".into(),
            json: None,
            plugin: serde_json::Map::new(),
            time_scale: 1.0,
            observations: None,
        };
        let floors = floors(&opts, 4, 20.0).unwrap();
        let [(mixed, m), (shifted, s)] = [&floors[0], &floors[1]];
        assert_eq!((*mixed, *shifted), ("mixed", "shifted"));
        assert!(m.ttft.requests > 300 && s.tpot.requests > 100, "{m:?} {s:?}");
        assert!(s.tpot.future_and_step > RECOVERED_WITHIN * m.tpot.future_and_step, "{m:?} {s:?}");
        assert!(m.ttft.future_and_step > 0.03 && m.ttft.future_and_step < 0.2, "{m:?}");
        let lagged = m.records.iter().filter(|r| r.lagged.in_flight < r.fresh.in_flight).count();
        assert!(lagged > 0 && lagged < m.records.len() / 2, "a 20 ms tick hides a few dispatches: {lagged}");
    }

    #[test]
    fn the_hindsight_reference_is_each_prompt_buckets_median_as_the_prediction() {
        let o = |prompt_tokens: u32, ttft: f64, stream: bool| runner::Outcome {
            prompt_tokens,
            stream,
            status: 200,
            ttft_ms: Some(ttft),
            ..Default::default()
        };
        // Bucket 0: 8, 10, 12.5 around their median 10 (0.25, 0, 0.2); bucket 1: 100 alone (0);
        // a request that did not stream is not scored.
        let outcomes = [o(10, 8.0, true), o(20, 10.0, true), o(30, 12.5, true), o(300, 100.0, true), o(40, 1e6, false)];
        let [ttft, tpot] = hindsight_mape(&outcomes);
        assert!((ttft.unwrap() - 0.45 / 4.0).abs() < 1e-12, "{ttft:?}");
        assert_eq!(tpot, None, "nothing measured");
    }

    #[test]
    fn recovery_is_when_the_error_last_came_back_within_bounds() {
        let before = [Some(0.2), Some(0.1)];
        let s = |t: f64, a: f64, b: f64| (t, [Some(a), Some(b)]);
        // Never out: recovered at once.
        assert_eq!(recovery(before, &[s(5.0, 0.25, 0.12)], 90.0), Some(0.0));
        // Out until 20 s, then within: the first sample after the last one out.
        let series = [s(5.0, 0.5, 0.1), s(10.0, 0.2, 0.4), s(15.0, 0.31, 0.1), s(20.0, 0.25, 0.14)];
        assert_eq!(recovery(before, &series, 90.0), Some(20.0));
        // Still out at the end: the phase's length.
        assert_eq!(recovery(before, &series[..3], 90.0), Some(90.0));
        // Out, back, out again: judged from the last time out.
        let bounce = [s(5.0, 0.5, 0.1), s(10.0, 0.2, 0.1), s(15.0, 0.2, 0.5), s(20.0, 0.2, 0.1)];
        assert_eq!(recovery(before, &bounce, 90.0), Some(20.0));
        assert_eq!(recovery([None, Some(0.1)], &bounce, 90.0), None);
    }
}
