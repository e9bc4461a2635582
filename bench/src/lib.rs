//! `make bench`: every router on the identical request sequences, swept over offered
//! load, with the 90%-attainment capacity, a markdown report and SVG charts.
//!
//! For each workload and router one stack is started (8 simulated servers and the real
//! Envoy); headroom gets a warm-up on another seed so its models are trained; then the
//! rate ladder is climbed until the router's attainment falls below [`STOP_BELOW`].
//! Requests of one rate are the same for every router (same seed).
//!
//! Time: the simulated servers of a workload can run `time_scale` times real time (0.5: half
//! speed; [`default_time_scale`] per workload unless `--time-scale` sets one for all), so a
//! slow host streams fewer tokens per second of wall time and stays out of the way. Every
//! measurement records how busy the host's CPUs were ([`host`]) and whether Envoy's circuit
//! breakers held a request back, and the report names the points where either happened.
//! Rates, SLOs and latencies in the report are in simulated (engine) time: requests are sent
//! at `rate * time_scale` per wall second with SLOs divided by `time_scale`, and measured
//! latencies are multiplied by it.

pub mod agreement;
pub mod analyze;
pub mod callouts;
pub mod capacities;
pub mod claims;
pub mod contenders;
pub mod engines;
pub mod gateway;
pub mod host;
pub mod progress;
pub mod report;
pub mod results;
pub mod scrapes;
pub mod sim;
pub mod soak;
pub mod summary;
pub mod wire;
pub mod workloads;

use std::path::{Path, PathBuf};

use headroom_loadgen::{runner, workload};
use headroom_stack::{Engine, Router, Stack, StackOptions};
use serde_json::Map;

use progress::Progress;
use summary::Summary;

pub use contenders::*;
pub use results::*;
pub use summary::{STOP_BELOW, TARGET};
pub use workloads::*;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// What serves the model: simulated GPUs, or the local real vLLM servers (real time, a
    /// fresh pair of servers per router and per repeat, so no router finds another's prompts
    /// in vLLM's prefix cache).
    pub engine: Engine,
    pub workloads: Vec<String>,
    /// Rate ladder for every workload (`None`: [`default_rates`]).
    pub rates: Option<Vec<f64>>,
    /// How many of the trace's requests `azure` replays at every rate (`None`: [`trace_window`]
    /// of the ladder). Set to another run's window to add rungs to its ladder on the same
    /// traffic: `--rates 160` alone would replay the first 2,400 requests, not its 1,200.
    pub trace_window: Option<usize>,
    /// Seconds of measured traffic per rate.
    pub step_s: f64,
    /// Seconds of the same rate's traffic sent before each measured step and not counted,
    /// for every workload (`None`: each workload's [`default_lead_in`]).
    pub lead_in_s: Option<f64>,
    /// Seconds of warm-up traffic (another seed, lowest rate) before headroom is measured.
    pub warmup_s: f64,
    /// Hardware profile per simulated server, for every workload (`None`: [`default_fleet`]).
    pub profiles: Option<Vec<String>>,
    /// Simulator speed for every workload (1: real time; `None`: each workload's
    /// [`default_time_scale`]); see the module docs.
    pub time_scale: Option<f64>,
    /// Routers to run (names from [`CONTENDERS`]; empty: all).
    pub routers: Vec<String>,
    /// Measurements of each rate near the cliff ([`cliff_rates`]), each with its own
    /// seed (1: the ladder's only).
    pub seeds: u32,
    /// The CSV the `trace` workload replays (`--trace FILE`, the bundled trace's format).
    pub trace: Option<std::sync::Arc<str>>,
    pub run_dir: PathBuf,
    pub out: PathBuf,
}

fn contenders(opts: &BenchOptions) -> anyhow::Result<Vec<Contender>> {
    if opts.routers.is_empty() {
        return Ok(CONTENDERS.to_vec());
    }
    opts.routers
        .iter()
        .map(|r| CONTENDERS.iter().find(|c| c.name == r.as_str()).copied().ok_or_else(|| unknown_router(r)))
        .collect()
}

/// One router's fleet on one workload, started and warmed up, as a ladder measures it: the
/// real stack ([`StackLab`]) or the one composed in simulated time (`sim`).
pub trait Measure {
    /// One measured step: `rate` with traffic from `seed`, prompts of `run`; prints a line
    /// and keeps what the lab keeps of it (every request's outcome under `requests/`).
    fn measure(&mut self, rate: f64, seed: u64, run: u32) -> anyhow::Result<Summary>;
}

/// Where a benchmark's ladders run: what starts a router's fleet for a workload. The ladder,
/// its repeats, the cliffs and the report are the same code for every lab ([`run_on`]).
pub trait Lab: Sync {
    /// A fresh fleet for `c` on `workload` (a fresh predictor: no model from another
    /// router's run), warmed up at the ladder's lowest rate when it is headroom.
    fn start<'a>(
        &'a self,
        c: &'a Contender,
        workload: &'a str,
        ladder: &'a Ladder,
        progress: &'a Progress,
    ) -> anyhow::Result<Box<dyn Measure + 'a>>;

    /// Ladders measured side by side (each router's on its own thread): 1 where they share
    /// the host's CPU with what they measure.
    fn workers(&self) -> usize {
        1
    }

    /// What the results file records as the workload's engine (`None`: the simulator's servers).
    fn engine(&self) -> Option<String> {
        None
    }
}

/// The real stack: Envoy with the built filter, the predictor, simulated or real vLLM servers.
pub struct StackLab<'a> {
    pub opts: &'a BenchOptions,
}

impl Lab for StackLab<'_> {
    fn start<'a>(
        &'a self,
        c: &'a Contender,
        workload: &'a str,
        ladder: &'a Ladder,
        progress: &'a Progress,
    ) -> anyhow::Result<Box<dyn Measure + 'a>> {
        Ok(Box::new(Bench::start(self.opts, c, workload, ladder, progress)?))
    }

    fn engine(&self) -> Option<String> {
        (self.opts.engine == Engine::Vllm).then(|| "vllm".to_string())
    }
}

/// One router's stack on one workload, warmed up, and its clients.
struct Bench<'a> {
    opts: &'a BenchOptions,
    contender: &'a Contender,
    workload: &'a str,
    ladder: &'a Ladder,
    target: runner::Target,
    runtime: tokio::runtime::Runtime,
    stack: Stack,
    progress: &'a Progress,
}

impl<'a> Bench<'a> {
    /// Starts `contender`'s stack on the ladder's fleet (a fresh predictor: no model from
    /// another router's run), warmed up when it is headroom ([`warm_up`]).
    fn start(
        opts: &'a BenchOptions,
        contender: &'a Contender,
        workload: &'a str,
        ladder: &'a Ladder,
        progress: &'a Progress,
    ) -> anyhow::Result<Bench<'a>> {
        let time_scale = ladder.time_scale;
        let _ = std::fs::remove_dir_all(opts.run_dir.join("predictor-data"));
        let plugin = if contender.router == Router::Headroom { plugin(contender, time_scale) } else { Map::new() };
        let stack = Stack::start(StackOptions {
            run_dir: opts.run_dir.clone(),
            engine: opts.engine,
            profiles: ladder.fleet.clone(),
            // Real servers start from their measured profile, as `make up` does; the
            // simulated reference keeps the analytic prior it was measured on.
            profile: opts.engine == Engine::Vllm && contender.router == Router::Headroom,
            time_scale,
            router: contender.router,
            objective: contender.objective.to_string(),
            predictor_tweak: if contender.train { |_| {} } else { |c| c.model.train = false },
            plugin,
            ..Default::default()
        })?;
        let target = runner::Target {
            url: format!("http://{}", stack.state.gateway),
            model: stack.state.model.clone(),
            slo_headers: true,
            prediction_based: contender.prediction_based,
            timeout: std::time::Duration::from_secs_f64(LONGEST_REQUEST_S / time_scale),
        };
        let runtime = tokio::runtime::Runtime::new()?;
        let bench = Bench { opts, contender, workload, ladder, target, runtime, stack, progress };
        if let Some(warm) = warm_up(opts, contender, workload, ladder)? {
            bench.runtime.block_on(runner::run(&bench.target, &warm))?;
        }
        Ok(bench)
    }
}

/// The warm-up traffic a headroom router gets before its ladder (none for the others, or
/// with `--warmup 0`): another seed's traffic at the ladder's lowest rate, as sent (wall time).
pub fn warm_up(
    opts: &BenchOptions,
    contender: &Contender,
    workload: &str,
    ladder: &Ladder,
) -> anyhow::Result<Option<Vec<workload::RequestSpec>>> {
    if contender.router != Router::Headroom || opts.warmup_s <= 0.0 {
        return Ok(None);
    }
    let lowest = ladder.steps.first().map_or(1.0, |s| s.1);
    let warm = requests(workload, WARMUP_SEED, lowest, opts.warmup_s, ladder.window, opts.trace.as_deref())?;
    Ok(Some(to_wall(workload::as_run(warm, 0), ladder.time_scale)))
}

/// A measured step's traffic as the clients send it (wall time, prompts of `run`), and how
/// many of its requests are measured (the rest only hold the load: `run_with_trailing`).
pub fn step_work(
    workload: &str,
    seed: u64,
    rate: f64,
    run: u32,
    step_s: f64,
    ladder: &Ladder,
) -> anyhow::Result<(Vec<workload::RequestSpec>, usize)> {
    let trace = ladder.trace.as_deref();
    let (sent, measured) = step_traffic(workload, seed, rate, (ladder.lead_in_s, step_s), ladder.window, trace)?;
    Ok((to_wall(workload::as_run(sent, run), ladder.time_scale), measured))
}

/// The clients' outcomes of a step (wall time) as measured: in engine time, the lead-in
/// left out, and their summary.
pub fn measured_step(outcomes: Vec<runner::Outcome>, ladder: &Ladder, step_s: f64) -> (Vec<runner::Outcome>, Summary) {
    let outcomes = after_lead_in(to_engine(outcomes, ladder.time_scale), ladder.lead_in_s);
    let summary = Summary::of(&outcomes, step_s);
    (outcomes, summary)
}

/// Prints a measurement's line, with where the run stands.
/// Prints a measurement's line: the workload leads, since a run with more than one worker
/// measures workloads side by side.
pub fn print_step(workload: &str, name: &str, rate: f64, seed: u64, s: &Summary, progress: &Progress) {
    let seed_note = if seed == LADDER_SEED { String::new() } else { format!(" (seed {seed})") };
    let capped = match s.gateway_overflow {
        Some(n) if n > 0 => format!(", GATEWAY CAPPED ({n} circuit-breaker overflows)"),
        _ => String::new(),
    };
    let cpu = s.host_cpu_busy.map_or(String::new(), |b| format!(", host CPU {:.0}%", 100.0 * b));
    let late = match s.fallback {
        Some(f) if f > report::FALLBACK => format!(", PREDICTOR LATE ({:.1}% by the fallback)", 100.0 * f),
        _ => String::new(),
    };
    println!(
        "  {workload:<13} {name:<31} {rate:>6.1} req/s: attainment {:5.1}%, goodput {:6.2} req/s, shed {:4.1}%{cpu}{seed_note}{capped}{late} {}",
        100.0 * s.attainment,
        s.goodput_rps,
        100.0 * s.shed,
        progress.step()
    );
}

/// Writes a measurement's per-request outcomes as JSON lines under `out/requests/`.
pub fn write_requests(out: &Path, file: &str, outcomes: &[runner::Outcome]) -> anyhow::Result<()> {
    let lines: Vec<String> = outcomes.iter().filter_map(|o| serde_json::to_string(o).ok()).collect();
    std::fs::write(out.join("requests").join(file), lines.join("\n") + "\n")?;
    Ok(())
}

impl Measure for Bench<'_> {
    fn measure(&mut self, rate: f64, seed: u64, run: u32) -> anyhow::Result<Summary> {
        let (work, measured) = step_work(self.workload, seed, rate, run, self.opts.step_s, self.ladder)?;
        let (overflow_before, cpu_before) = (self.stack.gateway_overflow(), host::CpuTimes::now());
        let procs_before = host::ProcessTimes::now(&self.stack.state.procs);
        let observed_before = self.observations_since(0, 1).map(|(total, _)| total);
        let engines = engines::Sampler::start(self.stack.state.servers.clone());
        let outcomes = self.runtime.block_on(runner::run_with_trailing(&self.target, &work, measured));
        let engine_queue = engines.stop();
        let (outcomes, mut s) = measured_step(outcomes?, self.ladder, self.opts.step_s);
        s.gateway_overflow = overflow_before.zip(self.stack.gateway_overflow()).map(|(a, b)| b.saturating_sub(a));
        s.host_cpu_busy = cpu_before.zip(host::CpuTimes::now()).and_then(|(a, b)| b.busy_since(&a));
        s.cpu_by_part = procs_before
            .zip(host::ProcessTimes::now(&self.stack.state.procs))
            .map(|(a, b)| b.shares_since(&a, s.host_cpu_busy));
        s.engine_queue = engine_queue;
        let file = requests_file(self.workload, self.contender.name, rate, seed);
        print_step(self.workload, self.contender.name, rate, seed, &s, self.progress);
        write_requests(&self.opts.out, &file, &outcomes)?;
        // The step's observations (its lead-in's too): those reported since it began.
        if let Some((_, log)) = observed_before.and_then(|before| self.observations_since(before, OBSERVATIONS_MAX)) {
            let lines: Vec<String> = log.iter().map(|o| o.to_string()).collect();
            std::fs::write(self.opts.out.join("observations").join(&file), lines.join("\n") + "\n")?;
        }
        Ok(s)
    }
}

impl Bench<'_> {
    /// The predictor's observations since it had taken `seen` (headroom only; it keeps
    /// `observations_kept`, 10,000 by default): each request's state at dispatch, what was
    /// predicted and what happened, as the predictor saw them (docs/predictor.md, "Decodes
    /// share the engine with prefills").
    fn observations_since(&self, seen: u64, limit: usize) -> Option<(u64, Vec<serde_json::Value>)> {
        (self.contender.router == Router::Headroom).then(|| self.stack.observations_since(seen, limit))?
    }
}

/// The most observations a predictor keeps (`observations_kept` is at most this).
const OBSERVATIONS_MAX: usize = 100_000;

/// One workload's rate ladder as every router runs it: each rate with its step number
/// (1.., which picks the traffic's prompt text, so no rate finds another's prompts cached),
/// the trace window every rate replays, the fleet, the simulator's speed and the lead-in.
#[derive(Debug, Clone)]
pub struct Ladder {
    pub steps: Vec<(u32, f64)>,
    pub window: usize,
    pub fleet: Vec<String>,
    pub time_scale: f64,
    pub lead_in_s: f64,
    /// The CSV the `trace` workload replays ([`USER_TRACE`]).
    pub trace: Option<std::sync::Arc<str>>,
}

impl Ladder {
    fn new(opts: &BenchOptions, rates: &[f64], fleet: Vec<String>, time_scale: f64, lead_in_s: f64) -> Ladder {
        let steps = (1..).zip(rates.iter().copied()).collect();
        let window = opts.trace_window.unwrap_or_else(|| trace_window(rates, opts.step_s));
        Ladder { steps, window, fleet, time_scale, lead_in_s, trace: opts.trace.clone() }
    }
}

/// Whether a ladder stops after this measurement: both capacities are behind it. A router
/// that sheds meets under [`STOP_BELOW`] of all requests well before its critical classes
/// fall (flow control p90 on azure held: 78% of all requests, 91% of the non-sheddable
/// at 140 req/s); stopping on the first alone would leave its critical
/// capacity open-ended at that rate.
pub fn ladder_done(s: &Summary) -> bool {
    s.attainment < STOP_BELOW && s.critical_attainment.is_none_or(|c| c < STOP_BELOW)
}

/// Runs one router's rate ladder on one workload, until it falls under [`STOP_BELOW`]; the
/// rungs it stops before leave `progress`'s plan.
fn sweep(lab: &dyn Lab, c: &Contender, name: &str, ladder: &Ladder, progress: &Progress) -> anyhow::Result<RouterRun> {
    let mut fleet = lab.start(c, name, ladder, progress)?;
    let mut run =
        RouterRun { router: c.name.to_string(), baseline: c.baseline, points: Vec::new(), repeats: Vec::new() };
    // Every router gets the same requests at a rate, and new prompts at each rate.
    for &(step, rate) in &ladder.steps {
        let s = fleet.measure(rate, LADDER_SEED, step)?;
        let stop = ladder_done(&s);
        run.points.push((rate, s));
        if stop {
            break;
        }
    }
    progress.replan(run.points.len() as isize - ladder.steps.len() as isize);
    Ok(run)
}

/// The rates near the cliff, where routers are compared and noise decides: for each
/// router and each of its two capacities (all requests, and the non-sheddable classes'
/// critical capacity), the last rate it kept [`TARGET`] at and the next one it ran (the
/// first rate when it never kept it, the last when it never lost it). Both, because a router
/// that sheds crosses them apart: flow control p90 on the prior, azure held, lost 90% of all
/// requests near 141 req/s and of the critical classes near 152, and a band taken from repeats
/// at the first cliff alone says little of the second (its far rung would be one seed's).
pub fn cliff_rates(w: &WorkloadRun) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    for r in &w.runs {
        out.extend(crossing_rungs(&r.points, capacities::overall));
        out.extend(crossing_rungs(&r.points, capacities::critical));
    }
    out.sort_by(f64::total_cmp);
    out.dedup();
    out
}

/// The rungs either side of where `pick` of a ladder's points crosses [`TARGET`]: the last
/// kept and the next, or the first rate when it never kept it. Empty when no point has the
/// value (older results, or a workload without non-sheddable requests).
fn crossing_rungs(points: &[(f64, Summary)], pick: capacities::Pick) -> Vec<f64> {
    let values: Vec<(f64, f64)> = points.iter().filter_map(|(rate, s)| Some((*rate, pick(s)?))).collect();
    match values.iter().rposition(|(_, v)| *v >= TARGET) {
        Some(i) => values[i..].iter().take(2).map(|p| p.0).collect(),
        None => values.first().map(|p| p.0).into_iter().collect(),
    }
}

/// The rungs of `cliff` that a router's ladder reached: those [`repeat`] runs again.
fn repeated_rungs(ladder: &Ladder, ran: &RouterRun, cliff: &[f64]) -> Vec<(u32, f64)> {
    ladder
        .steps
        .iter()
        .filter(|(_, rate)| cliff.contains(rate) && ran.points.iter().any(|p| p.0 == *rate))
        .copied()
        .collect()
}

/// Runs the rates of `cliff` that the router's ladder reached again, once per further
/// seed (`seeds - 1` times), on a fresh fleet; the same traffic for every router.
#[allow(clippy::too_many_arguments)]
fn repeat(
    lab: &dyn Lab,
    seeds: u32,
    c: &Contender,
    name: &str,
    ladder: &Ladder,
    ran: &RouterRun,
    cliff: &[f64],
    progress: &Progress,
) -> anyhow::Result<Vec<(f64, Summary)>> {
    let todo = repeated_rungs(ladder, ran, cliff);
    if todo.is_empty() || seeds < 2 {
        return Ok(Vec::new());
    }
    let mut fleet = lab.start(c, name, ladder, progress)?;
    let mut repeats = Vec::new();
    for k in 1..seeds {
        for &(step, rate) in &todo {
            repeats.push((rate, fleet.measure(rate, repeat_seed(k), 100 * k + step)?));
        }
    }
    Ok(repeats)
}

/// One workload of a run, as the workers fill it in: its routers' ladders, then (once every
/// ladder has ended and the cliffs are known) their repeats.
struct Part {
    ladder: Ladder,
    /// The workload's record without its runs.
    header: WorkloadRun,
    runs: Vec<Option<RouterRun>>,
    swept: usize,
    cliff: Option<Vec<f64>>,
    repeats: Vec<Option<Vec<(f64, Summary)>>>,
    repeated: usize,
    /// Jobs handed out: ladders, then repeats.
    started: (usize, usize),
}

impl Part {
    /// The workload with the runs ended so far, their repeats attached where they have ended.
    fn so_far(&self) -> WorkloadRun {
        let runs = self
            .runs
            .iter()
            .zip(&self.repeats)
            .filter_map(|(run, repeats)| {
                let mut run = run.clone()?;
                run.repeats = repeats.clone().unwrap_or_default();
                Some(run)
            })
            .collect();
        WorkloadRun { runs, ..self.header.clone() }
    }
}

/// A unit of work: contender `.1`'s ladder, or its repeats, on workload `.0`.
#[derive(Clone, Copy)]
enum Job {
    Sweep(usize, usize),
    Repeat(usize, usize),
}

/// What the workers share: the parts, the order they are taken in, and the first error.
struct Board {
    parts: Vec<Part>,
    order: Vec<usize>,
    failed: Option<anyhow::Error>,
}

impl Board {
    /// With one worker the workloads go in the order given, as a run made by hand would.
    /// With more, the slowest first (the most wall seconds of traffic: rungs, each its
    /// lead-in and step, at the simulator's speed), so that the last jobs, run with workers
    /// idle beside them, are short ones.
    fn new(parts: Vec<Part>, workers: usize) -> Board {
        let mut order: Vec<usize> = (0..parts.len()).collect();
        if workers > 1 {
            let cost =
                |p: &Part| p.ladder.steps.len() as f64 * (p.ladder.lead_in_s + p.header.step_s) / p.ladder.time_scale;
            order.sort_by(|&a, &b| cost(&parts[b]).total_cmp(&cost(&parts[a])));
        }
        Board { parts, order, failed: None }
    }

    /// The next job: the workloads in turn, each its ladders and then its repeats; a worker
    /// that would wait for a workload's last ladder takes the next workload's.
    fn next_job(&mut self, routers: usize) -> Option<Job> {
        for &i in &self.order {
            let p = &mut self.parts[i];
            if p.started.0 < routers {
                p.started.0 += 1;
                return Some(Job::Sweep(i, p.started.0 - 1));
            }
            if p.cliff.is_some() && p.started.1 < routers {
                p.started.1 += 1;
                return Some(Job::Repeat(i, p.started.1 - 1));
            }
        }
        None
    }

    fn done(&self, routers: usize) -> bool {
        self.parts.iter().all(|p| p.repeated == routers)
    }
}

/// Runs the whole benchmark and writes `report.md`, `RESULTS_FILE`, one SVG per workload
/// and the per-request JSON lines under `opts.out`.
pub fn run(opts: &BenchOptions, command: &str) -> anyhow::Result<BenchResults> {
    run_on(&StackLab { opts }, opts, command)
}

/// [`run`] in `lab`: every workload's ladders, their cliffs measured again with more seeds,
/// and the outputs written as the run goes.
pub fn run_on(lab: &dyn Lab, opts: &BenchOptions, command: &str) -> anyhow::Result<BenchResults> {
    anyhow::ensure!(opts.step_s > 0.0, "--step must be > 0");
    anyhow::ensure!(opts.lead_in_s.is_none_or(|l| l >= 0.0 && l.is_finite()), "--lead-in must be >= 0");
    anyhow::ensure!(opts.time_scale.is_none_or(|t| t > 0.0 && t <= 1.0), "--time-scale must be within (0, 1]");
    anyhow::ensure!(opts.trace_window != Some(0), "--trace-window: must be at least 1 request");
    // Real servers run in real time: a slowed run has no meaning for them.
    anyhow::ensure!(
        opts.engine == Engine::Simulator || opts.time_scale.is_none_or(|t| t == 1.0),
        "--time-scale slows the simulator; real vLLM servers run in real time"
    );
    // A window given where no workload replays the trace would be dropped without a word, and
    // the run would not be the one asked for.
    anyhow::ensure!(
        opts.trace_window.is_none() || opts.workloads.iter().any(|w| w == TRACE || w == USER_TRACE),
        "--trace-window: only the {TRACE} and {USER_TRACE} workloads replay a trace; --workloads names neither"
    );
    std::fs::create_dir_all(opts.out.join("requests"))?;
    std::fs::create_dir_all(opts.out.join("observations"))?;
    let contenders = contenders(opts)?;
    let mut results = BenchResults {
        command: command.to_string(),
        profiles: opts.profiles.clone().unwrap_or_else(|| default_fleet_on(opts.engine, "")),
        time_scale: opts.time_scale.unwrap_or(1.0),
        workloads: vec![],
    };
    let real = opts.engine == Engine::Vllm;
    let mut ladders = Vec::new();
    for name in &opts.workloads {
        let rates =
            opts.rates.clone().unwrap_or_else(|| if real { default_rates_vllm(name) } else { default_rates(name) });
        anyhow::ensure!(!rates.is_empty() && rates.iter().all(|r| *r > 0.0), "rates must be > 0");
        // An unknown workload (or a trace that does not parse) fails before any fleet starts.
        requests(name, 11, rates[0], 1.0, 1, opts.trace.as_deref())?;
        ladders.push((name, rates));
    }
    // Every rung of every ladder, and a guess at the repeats (about three rungs near the cliffs
    // per router), revised as the run learns them.
    let repeats_guess = |rates: &[f64]| (opts.seeds.max(1) as usize - 1) * rates.len().min(3);
    let planned = ladders.iter().map(|(_, rates)| contenders.len() * (rates.len() + repeats_guess(rates))).sum();
    let progress = Progress::new(planned);
    let mut parts = Vec::new();
    for (name, rates) in ladders {
        let time_scale = if real { 1.0 } else { opts.time_scale.unwrap_or_else(|| default_time_scale(name)) };
        let lead_in_s = opts.lead_in_s.unwrap_or_else(|| if real { VLLM_LEAD_IN_S } else { default_lead_in(name) });
        let lead = if lead_in_s > 0.0 { format!(" after {lead_in_s} s not counted") } else { String::new() };
        let speed = match lab.engine() {
            Some(engine) if real => engine,
            Some(engine) => format!("{engine}, simulator at {time_scale}x"),
            None => format!("simulator at {time_scale}x"),
        };
        println!("workload {name}: rates {rates:?} req/s, {} s per rate{lead}, {speed}", opts.step_s);
        let fleet = opts.profiles.clone().unwrap_or_else(|| default_fleet_on(opts.engine, name));
        let ladder = Ladder::new(opts, &rates, fleet.clone(), time_scale, lead_in_s);
        let replays = name == TRACE || name == USER_TRACE;
        let header = WorkloadRun {
            workload: name.clone(),
            step_s: opts.step_s,
            lead_in_s,
            load_held_after: lead_in_s > 0.0,
            servers: fleet.len(),
            engine: lab.engine(),
            profiles: fleet,
            trace_window: replays.then_some(ladder.window),
            time_scale: Some(time_scale),
            command: Some(command.to_string()),
            runs: Vec::new(),
            ratios: None,
        };
        parts.push(Part {
            ladder,
            header,
            runs: (0..contenders.len()).map(|_| None).collect(),
            swept: 0,
            cliff: None,
            repeats: (0..contenders.len()).map(|_| None).collect(),
            repeated: 0,
            started: (0, 0),
        });
    }
    let n = contenders.len();
    let board = std::sync::Mutex::new(Board::new(parts, lab.workers()));
    let changed = std::sync::Condvar::new();
    let lock = || board.lock().unwrap_or_else(|p| p.into_inner());
    std::thread::scope(|scope| {
        for _ in 0..lab.workers().max(1) {
            scope.spawn(|| loop {
                let job = {
                    let mut b = lock();
                    loop {
                        if b.failed.is_some() || b.done(n) {
                            return;
                        }
                        if let Some(job) = b.next_job(n) {
                            break job;
                        }
                        b = changed.wait(b).unwrap_or_else(|p| p.into_inner());
                    }
                };
                let (i, c) = match job {
                    Job::Sweep(i, c) | Job::Repeat(i, c) => (i, c),
                };
                // The part's ladder and (for a repeat) its router's run, read under the lock
                // and measured outside it.
                let (ladder, name, ran, cliff) = {
                    let b = lock();
                    let p = &b.parts[i];
                    (p.ladder.clone(), p.header.workload.clone(), p.runs[c].clone(), p.cliff.clone())
                };
                // A panic is an error like any other: a worker waiting for this job's ladder
                // would otherwise wait for ever.
                let measured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job {
                    Job::Sweep(..) => sweep(lab, &contenders[c], &name, &ladder, &progress).map(|r| (Some(r), None)),
                    Job::Repeat(..) => match (ran, cliff) {
                        (Some(ran), Some(cliff)) => {
                            repeat(lab, opts.seeds, &contenders[c], &name, &ladder, &ran, &cliff, &progress)
                                .map(|r| (None, Some(r)))
                        }
                        _ => Err(anyhow::anyhow!("{name}: a repeat was handed out before its ladder ended")),
                    },
                }));
                let outcome = measured
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("{name}: {}'s ladder panicked", contenders[c].name)));
                let mut b = lock();
                match outcome {
                    Err(e) => {
                        b.failed.get_or_insert(e);
                    }
                    Ok((run, repeats)) => {
                        let p = &mut b.parts[i];
                        if let Some(run) = run {
                            p.runs[c] = Some(run);
                            p.swept += 1;
                        }
                        if let Some(repeats) = repeats {
                            p.repeats[c] = Some(repeats);
                            p.repeated += 1;
                        }
                        if p.swept == n && p.cliff.is_none() {
                            let cliff = cliff_rates(&p.so_far());
                            let w = p.so_far();
                            let repeats: usize =
                                w.runs.iter().map(|r| repeated_rungs(&p.ladder, r, &cliff).len()).sum();
                            let rates: Vec<f64> = p.ladder.steps.iter().map(|s| s.1).collect();
                            progress.replan(
                                (repeats * (opts.seeds.max(1) as usize - 1)) as isize
                                    - (n * repeats_guess(&rates)) as isize,
                            );
                            if opts.seeds > 1 {
                                println!(
                                    "  {}: repeating {cliff:?} req/s with {} more seeds",
                                    w.workload,
                                    opts.seeds - 1
                                );
                            }
                            p.cliff = Some(cliff);
                        }
                        // A long run keeps what it has so far, and its report can be read
                        // while it goes on.
                        let so_far = BenchResults {
                            workloads: b
                                .parts
                                .iter()
                                .filter(|p| p.runs.iter().any(Option::is_some))
                                .map(Part::so_far)
                                .collect(),
                            ..results.clone()
                        };
                        if let Err(e) = write_outputs(&opts.out, &so_far) {
                            eprintln!("could not write the outputs so far: {e}");
                        }
                    }
                }
                changed.notify_all();
            });
        }
    });
    let b = board.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = b.failed {
        return Err(e);
    }
    anyhow::ensure!(b.done(n), "a ladder's thread panicked");
    results.workloads = b.parts.iter().map(Part::so_far).collect();
    write_outputs(&opts.out, &results)?;
    Ok(results)
}

/// Writes the report, the raw results (with each workload's ratios) and the charts.
pub fn write_outputs(out: &Path, results: &BenchResults) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    for (name, bytes) in render(results)? {
        std::fs::write(out.join(name), bytes)?;
    }
    Ok(())
}

/// Every file `write_outputs` writes for `results`, by name: `RESULTS_FILE` (with each
/// workload's ratios), `report.md` and one SVG per workload. The one place they are made, so a
/// committed reference can be checked against what its own results render.
pub fn render(results: &BenchResults) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut results = results.clone();
    for w in &mut results.workloads {
        w.ratios = capacities::ratios(w);
    }
    let mut files = vec![
        (RESULTS_FILE.to_string(), encode_results(&results)?),
        ("report.md".to_string(), report::markdown(&results).into_bytes()),
    ];
    files.extend(results.workloads.iter().map(|w| (format!("{}.svg", w.workload), report::chart(w).into_bytes())));
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workload of two routers: `rungs` rates at `time_scale`.
    fn part(name: &str, rungs: usize, time_scale: f64) -> Part {
        let steps = (1..).zip((1..=rungs).map(|r| r as f64 * 10.0)).collect();
        let ladder = Ladder { steps, window: 1, fleet: Vec::new(), time_scale, lead_in_s: 0.0, trace: None };
        let header = WorkloadRun {
            workload: name.into(),
            step_s: 15.0,
            lead_in_s: 0.0,
            load_held_after: false,
            servers: 0,
            engine: None,
            profiles: Vec::new(),
            trace_window: None,
            time_scale: Some(time_scale),
            command: None,
            runs: Vec::new(),
            ratios: None,
        };
        let (runs, repeats) = (vec![None, None], vec![None, None]);
        Part { ladder, header, runs, swept: 0, cliff: None, repeats, repeated: 0, started: (0, 0) }
    }

    fn job(b: &mut Board) -> Option<(&'static str, usize, usize)> {
        b.next_job(2).map(|j| match j {
            Job::Sweep(w, c) => ("sweep", w, c),
            Job::Repeat(w, c) => ("repeat", w, c),
        })
    }

    #[test]
    fn workers_take_a_workloads_ladders_then_its_repeats_and_with_company_the_slowest_first() {
        // One worker: the order given, as a run made by hand.
        let mut one = Board::new(vec![part("fast", 3, 1.0), part("slow", 3, 0.25)], 1);
        assert_eq!(job(&mut one), Some(("sweep", 0, 0)));
        assert_eq!(job(&mut one), Some(("sweep", 0, 1)));
        // The repeats wait for the cliffs, which wait for every ladder: the next workload's.
        assert_eq!(job(&mut one), Some(("sweep", 1, 0)));
        one.parts[0].cliff = Some(vec![10.0]);
        assert_eq!(job(&mut one), Some(("repeat", 0, 0)));

        // Two: the slowest workload (most wall seconds of traffic) first.
        let mut two = Board::new(vec![part("fast", 3, 1.0), part("slow", 3, 0.25), part("long", 8, 1.0)], 2);
        assert_eq!(two.order, vec![1, 2, 0]);
        assert_eq!(job(&mut two), Some(("sweep", 1, 0)));
        assert_eq!(job(&mut two), Some(("sweep", 1, 1)));
        assert_eq!(job(&mut two), Some(("sweep", 2, 0)));
        assert!(!two.done(2));
        for p in &mut two.parts {
            p.repeated = 2;
        }
        assert!(two.done(2));
    }

    /// The committed references (`docs/bench/`, and the real-engine one under `docs/bench/vllm/`)
    /// are what `headroom-bench report` renders from their own `results.json.gz`: nobody edits a
    /// report by hand, and a change to the rendering shows up here until they are regenerated.
    #[test]
    fn the_committed_references_are_what_their_results_render() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
        for dir in [docs.clone(), docs.join("vllm"), docs.join("sim")] {
            let Ok(results) = read_results(&dir) else {
                assert!(dir != docs, "docs/bench/{RESULTS_FILE} is missing");
                continue;
            };
            for (name, rendered) in render(&results).unwrap() {
                let committed = std::fs::read(dir.join(&name)).unwrap_or_default();
                // The results file is compared as the results it holds, not as compressed bytes.
                let same = match name == RESULTS_FILE {
                    true => decoded(&committed) == decoded(&rendered),
                    false => committed == rendered,
                };
                assert!(
                    same,
                    "{}/{name} is not what `headroom-bench report --out {}` renders from its {RESULTS_FILE}: \
                     regenerate it, never edit it",
                    dir.display(),
                    dir.display()
                );
            }
        }
        // And the simulated bench's agreement with the real one, from both results.
        let agreement =
            crate::agreement::table(&read_results(&docs).unwrap(), &read_results(&docs.join("sim")).unwrap());
        assert!(
            std::fs::read_to_string(docs.join("sim/agreement.md")).unwrap_or_default() == agreement,
            "docs/bench/sim/agreement.md is not what `headroom-bench agreement --real docs/bench \
             --sim docs/bench/sim` prints: regenerate it, never edit it"
        );
    }

    /// The JSON a gzipped results file holds.
    fn decoded(gz: &[u8]) -> serde_json::Value {
        serde_json::from_reader(flate2::read::GzDecoder::new(gz)).unwrap_or_default()
    }

    #[test]
    fn results_read_back_gzipped_or_plain_and_name_the_file_they_cannot_read() {
        let dir = std::env::temp_dir().join(format!("headroom-results-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let results = BenchResults { command: "c".into(), profiles: vec![], time_scale: 1.0, workloads: vec![] };
        write_outputs(&dir, &results).unwrap();
        let gz = std::fs::read(dir.join(RESULTS_FILE)).unwrap();
        assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzipped");
        assert_eq!(gz, encode_results(&results).unwrap(), "the same results make the same bytes");
        assert_eq!(read_results(&dir).unwrap().workloads.len(), 0);
        std::fs::write(dir.join("plain.json"), serde_json::to_string(&results).unwrap()).unwrap();
        assert!(read_results(&dir.join("plain.json")).is_ok());
        std::fs::write(dir.join("bad.json"), "{").unwrap();
        let err = read_results(&dir.join("bad.json")).unwrap_err().to_string();
        assert!(err.contains("bad.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn after_a_lead_in_the_traffic_goes_on_past_the_step_and_the_step_is_unchanged() {
        let step = |lead_in: f64| step_traffic("short-long", 1, 100.0, (lead_in, 15.0), 1, None).unwrap();
        let (held, measured) = step(20.0);
        let plain = requests("short-long", 1, 100.0, 35.0, 1, None).unwrap();
        assert_eq!(held[..measured], plain[..], "the lead-in's and the step's requests, as without the tail");
        assert!(held[measured..].iter().all(|s| s.at_s >= 35.0), "the rest come after the step");
        let after = held.last().map_or(0.0, |s| s.at_s) - 35.0;
        assert!(after > LONGEST_REQUEST_S - 1.0, "as long as a request may last: {after:.1} s");
        let (alone, measured) = step(0.0);
        assert_eq!(
            (alone.len(), measured),
            (requests("short-long", 1, 100.0, 15.0, 1, None).unwrap().len(), alone.len())
        );
    }

    #[test]
    fn a_trace_window_is_refused_where_it_would_not_apply_before_anything_starts() {
        let dir = std::env::temp_dir().join(format!("headroom-bench-window-{}", std::process::id()));
        let opts = |workloads: &[&str], trace_window| BenchOptions {
            engine: Engine::Simulator,
            workloads: workloads.iter().map(|w| w.to_string()).collect(),
            rates: None,
            trace_window,
            step_s: 15.0,
            lead_in_s: None,
            warmup_s: 0.0,
            profiles: None,
            time_scale: None,
            routers: Vec::new(),
            seeds: 1,
            trace: None,
            run_dir: dir.join("run"),
            out: dir.join("out"),
        };
        let refused = |o: BenchOptions| run(&o, "test").unwrap_err().to_string();
        assert!(refused(opts(&["mixed"], Some(1200))).contains("only the azure and trace workloads"));
        assert!(refused(opts(&["mixed", TRACE], Some(0))).contains("at least 1 request"));
        let slowed_vllm = BenchOptions { engine: Engine::Vllm, time_scale: Some(0.5), ..opts(&["mixed-small"], None) };
        assert!(refused(slowed_vllm).contains("real vLLM servers run in real time"));
        assert!(!dir.exists(), "refused before any directory or stack");
    }

    #[test]
    fn routers_are_read_by_name_even_where_a_name_holds_a_comma() {
        let names = parse_routers("headroom predicted, least,envoy round robin , headroom predicted").unwrap();
        assert_eq!(names, ["headroom predicted, least", "envoy round robin", "headroom predicted"]);
        assert_eq!(parse_routers(" ").unwrap(), Vec::<String>::new());
        let unknown = parse_routers("envoy round robin,least").unwrap_err().to_string();
        assert!(unknown.contains("unknown router \"least\""), "{unknown}");
        assert!(parse_routers("headroom predictedx").is_err(), "a name is matched whole");
    }

    #[test]
    fn a_slowed_run_gives_the_filter_its_durations_in_wall_time() {
        let predicted = CONTENDERS.iter().find(|c| c.name == "headroom predicted").unwrap();
        let real = plugin(predicted, 1.0);
        let durations = |p: &Map<String, serde_json::Value>| {
            ["predictor_timeout_ms", "flow_dispatch_horizon_ms", "flow_max_wait_ms"].map(|k| p[k].as_u64())
        };
        assert_eq!(durations(&real), [Some(50), Some(150), Some(10_000)]);
        // At 0.15x an engine millisecond lasts 6.7 wall milliseconds, for the callout too.
        let slowed = plugin(predicted, 0.15);
        assert_eq!(durations(&slowed), [Some(333), Some(1000), Some(60_000)], "the wait capped at the predictor's");
        assert_eq!(durations(&plugin(predicted, 0.25))[2], Some(40_000));
    }

    #[test]
    fn engine_time_scales_every_latency_back_including_the_predictions() {
        let spec = workload::RequestSpec {
            at_s: 1.0,
            prompt_tokens: 10,
            max_tokens: 10,
            stream: true,
            class: workload::SloClass::interactive(),
            shared_prefix: None,
            conversation: None,
            run: 0,
        };
        let wall = to_wall(vec![spec], 0.25);
        assert_eq!((wall[0].at_s, wall[0].class.ttft_ms, wall[0].class.tpot_ms), (4.0, Some(1600.0), Some(160.0)));
        let outcome = runner::Outcome {
            index: 0,
            class: "interactive".into(),
            at_s: 4.0,
            stream: true,
            prompt_tokens: 10,
            max_tokens: 10,
            slo_ttft_ms: Some(1600.0),
            slo_tpot_ms: Some(160.0),
            priority: 0,
            status: 200,
            ttft_ms: Some(800.0),
            tpot_ms: Some(100.0),
            e2e_ms: 2000.0,
            output_tokens: Some(10),
            served_by: None,
            chosen: None,
            tier: Some("positive".into()),
            predicted_ttft_ms: Some(400.0),
            predicted_tpot_ms: Some(120.0),
            flow: Some("released".into()),
            queued_ms: Some(80.0),
            error: None,
            ..Default::default()
        };
        let o = &to_engine(vec![outcome], 0.25)[0];
        assert_eq!((o.at_s, o.e2e_ms, o.ttft_ms, o.tpot_ms), (1.0, 500.0, Some(200.0), Some(25.0)));
        assert_eq!(o.queued_ms, Some(20.0), "a wait at the gateway is engine time too");
        assert_eq!((o.slo_ttft_ms, o.slo_tpot_ms), (Some(400.0), Some(40.0)));
        assert_eq!(
            (o.predicted_ttft_ms, o.predicted_tpot_ms),
            (Some(100.0), Some(30.0)),
            "predictions are wall time too"
        );
        // A lead-in of 0.5 s (engine time): the request sent at 1.0 s is measured, at 0.5 s
        // into the step; one sent during the lead-in is not.
        let early = runner::Outcome { at_s: 0.2, index: 1, ..o.clone() };
        let measured = after_lead_in(vec![early, o.clone()], 0.5);
        assert_eq!(measured.iter().map(|o| (o.index, o.at_s)).collect::<Vec<_>>(), [(0, 0.5)]);
        assert_eq!(after_lead_in(vec![o.clone()], 0.0)[0].at_s, 1.0, "no lead-in: untouched");
    }
}
