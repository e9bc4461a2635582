//! What a benchmark run records, how runs merge, and the results file they are read from
//! and written to.

use std::path::Path;

use headroom_loadgen::runner;
use serde::{Deserialize, Serialize};

use crate::contenders::CONTENDERS;
use crate::summary::Summary;
use crate::workloads::{repeat_seed, LADDER_SEED};

/// All measured points of one router on one workload, in increasing rate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouterRun {
    pub router: String,
    pub baseline: bool,
    /// `(requested rate, summary)`.
    pub points: Vec<(f64, Summary)>,
    /// Further measurements of some of those rates, each with another seed's traffic
    /// (`cliff_rates`): how much a point moves with the traffic and the host's noise.
    #[serde(default)]
    pub repeats: Vec<(f64, Summary)>,
}

/// One workload's sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkloadRun {
    pub workload: String,
    pub step_s: f64,
    /// The lead-in this workload was measured with: [`BenchOptions::lead_in_s`], else its
    /// [`default_lead_in`] (0 in results written before it existed).
    #[serde(default)]
    pub lead_in_s: f64,
    /// Whether the same traffic went on past each step until the step's requests had all
    /// ended (`runner::run_with_trailing`): with every lead-in; false in results written
    /// before the trailing traffic, whose last requests decoded in a draining fleet.
    #[serde(default)]
    pub load_held_after: bool,
    pub servers: usize,
    /// `vllm` when real vLLM servers were measured (absent: the simulator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Hardware profile per server (empty in results written before it was recorded:
    /// the run's `profiles`).
    #[serde(default)]
    pub profiles: Vec<String>,
    /// `azure`: how many of the trace's requests every rate replays ([`trace_window`]).
    #[serde(default)]
    pub trace_window: Option<usize>,
    /// The simulator speed and the command this workload was measured with (absent in
    /// results written before it was recorded: the run's). A report merged from several
    /// runs (`headroom-bench report --merge`) names each workload's own.
    #[serde(default)]
    pub time_scale: Option<f64>,
    #[serde(default)]
    pub command: Option<String>,
    pub runs: Vec<RouterRun>,
    /// The best headroom router against the best baseline, by capacity and critical
    /// capacity (`capacities::ratios`); filled when results are written.
    #[serde(default)]
    pub ratios: Option<Ratios>,
}

/// Everything the report is made from (also written as `RESULTS_FILE`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchResults {
    pub command: String,
    /// The fleet of every workload that does not name its own.
    pub profiles: Vec<String>,
    pub time_scale: f64,
    pub workloads: Vec<WorkloadRun>,
}

impl BenchResults {
    /// Adds `other`'s workloads and says, one line each, what became of them. A workload this
    /// run already has, measured the same way (step, lead-in, fleet, speed, trace window), gains
    /// `other`'s routers, so a workload too long for one sitting compares in one table; a router
    /// in both keeps its rates and takes `other`'s where both measured one (a rung added below a
    /// cliff, or a rate measured again). Measured another way, it is replaced whole: points
    /// measured differently cannot share a table. Each keeps the commands and time scale it was
    /// measured with (a report made in parts says which part is which).
    pub fn merge(&mut self, other: BenchResults) -> Vec<String> {
        let mut said = Vec::new();
        let BenchResults { command, profiles, time_scale, workloads } = self;
        for mut w in other.workloads {
            w.fill_from_run(&other.command, &other.profiles, other.time_scale);
            let Some(mine) = workloads.iter_mut().find(|mine| mine.workload == w.workload) else {
                said.push(format!("{}: added", w.workload));
                workloads.push(w);
                continue;
            };
            mine.fill_from_run(command, profiles, *time_scale);
            if let Some(differs) = mine.measured_otherwise(&w) {
                said.push(format!("{}: replaced (measured with another {differs})", w.workload));
                *mine = w;
                continue;
            }
            let routers: Vec<&str> = w.runs.iter().map(|r| r.router.as_str()).collect();
            said.push(format!("{}: routers added or measured again: {}", w.workload, routers.join(", ")));
            for run in w.runs {
                match mine.runs.iter_mut().find(|r| r.router == run.router) {
                    Some(r) => r.merge(run),
                    None => mine.runs.push(run),
                }
            }
            // Baselines first, then headroom's routers, in the order the benchmark runs them.
            mine.runs.sort_by_key(|r| CONTENDERS.iter().position(|c| c.name == r.router).unwrap_or(CONTENDERS.len()));
            // One line per part, each named once (a part may itself be merged from parts).
            if let (Some(mine_cmd), Some(theirs)) = (&mut mine.command, w.command) {
                for part in theirs.lines() {
                    if !mine_cmd.lines().any(|l| l == part) {
                        mine_cmd.push('\n');
                        mine_cmd.push_str(part);
                    }
                }
            }
        }
        said
    }
}

impl RouterRun {
    /// Adds `other`'s measurements of the same router: a rate both measured is `other`'s, with
    /// its seeds, and the points stay in increasing rate.
    fn merge(&mut self, other: RouterRun) {
        let measured: Vec<f64> = other.points.iter().map(|(r, _)| *r).collect();
        self.points.retain(|(r, _)| !measured.contains(r));
        self.repeats.retain(|(r, _)| !measured.contains(r));
        self.points.extend(other.points);
        self.repeats.extend(other.repeats);
        self.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.repeats.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
}

impl WorkloadRun {
    /// Takes the command, fleet and speed of the run it was measured in where it records none
    /// of its own (results written before they were recorded per workload), so that it keeps
    /// them once merged into another run's results.
    fn fill_from_run(&mut self, command: &str, profiles: &[String], time_scale: f64) {
        self.time_scale.get_or_insert(time_scale);
        self.command.get_or_insert_with(|| command.to_string());
        if self.profiles.is_empty() {
            self.profiles = profiles.to_vec();
        }
    }

    /// What, if anything, `other` was measured with that this run was not (both with their
    /// fleet and speed filled in). The rate ladder may differ: each router climbs its own.
    fn measured_otherwise(&self, other: &WorkloadRun) -> Option<&'static str> {
        [
            (self.step_s != other.step_s, "step"),
            (self.lead_in_s != other.lead_in_s || self.load_held_after != other.load_held_after, "lead-in"),
            (self.profiles != other.profiles || self.engine != other.engine, "fleet"),
            (self.time_scale != other.time_scale, "time scale"),
            (self.trace_window != other.trace_window, "trace window"),
        ]
        .into_iter()
        .find_map(|(differs, what)| differs.then_some(what))
    }
}

/// The per-request results of one measurement, under `requests/`.
pub(crate) fn requests_file(workload: &str, router: &str, rate: f64, seed: u64) -> String {
    let seed_part = if seed == LADDER_SEED { String::new() } else { format!("-seed{seed}") };
    format!("{workload}-{}-{rate}{seed_part}.jsonl", router.replace([' ', ','], "-"))
}

/// The per-request results in `path` (JSON lines), `None` when there is no such file.
pub(crate) fn read_outcomes(path: &Path) -> anyhow::Result<Option<Vec<runner::Outcome>>> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(None) };
    let outcomes = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(Some(outcomes))
}

/// Every measurement of `run` as `(rate, seed)`: the ladder's points, then its repeats (the
/// k-th repeat of a rate, 1.., ran with `repeat_seed(k)`; see [`repeat`]).
pub(crate) fn seeds_of(run: &RouterRun) -> Vec<(f64, u64)> {
    let points = run.points.iter().map(|(rate, _)| (*rate, LADDER_SEED));
    let mut seen: Vec<f64> = Vec::new();
    let repeats = run.repeats.iter().map(|(rate, _)| {
        seen.push(*rate);
        (*rate, repeat_seed(seen.iter().filter(|x| **x == *rate).count() as u32))
    });
    points.chain(repeats).collect()
}

/// Summarizes every measurement of `results` again from its per-request results under
/// `out/requests`, so that a figure the report gained since the run was made is filled for
/// it too; a measurement whose file is missing keeps its summary. Returns how many were.
pub fn recompute(out: &Path, results: &mut BenchResults) -> anyhow::Result<usize> {
    let mut done = 0;
    for w in &mut results.workloads {
        for r in &mut w.runs {
            let seeds = seeds_of(r);
            let summaries = r.points.iter_mut().chain(r.repeats.iter_mut()).map(|(_, s)| s);
            for ((rate, seed), summary) in seeds.into_iter().zip(summaries) {
                let path = out.join("requests").join(requests_file(&w.workload, &r.router, rate, seed));
                let Some(outcomes) = read_outcomes(&path)? else { continue };
                // What was read from Envoy and the host while it ran is not in the outcomes.
                let read =
                    (summary.gateway_overflow, summary.host_cpu_busy, summary.engine_queue, summary.cpu_by_part.take());
                *summary = Summary::of(&outcomes, w.step_s);
                (summary.gateway_overflow, summary.host_cpu_busy, summary.engine_queue, summary.cpu_by_part) = read;
                done += 1;
            }
        }
    }
    Ok(done)
}

/// The headline comparison of a workload, also written into the results file: the best
/// headroom (predicted) router against the best baseline, by capacity and by critical
/// capacity (each "best" chosen by its own measure).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ratios {
    pub best_headroom: String,
    pub best_baseline: String,
    pub capacity_ratio: f64,
    pub best_headroom_critical: Option<String>,
    pub best_baseline_critical: Option<String>,
    pub critical_capacity_ratio: Option<f64>,
    /// Whether the two capacities' noise bands overlap (a tie); `None` without repeats.
    #[serde(default)]
    pub capacity_within_noise: Option<bool>,
    #[serde(default)]
    pub critical_within_noise: Option<bool>,
}

/// What the results record as a workload's engine when it ran in simulated time (`sim`).
pub const SIM_ENGINE: &str = "simulated time";

/// The name of a run's raw results in its output directory: compact JSON, gzipped (a reference
/// run's is megabytes as text and a tenth of that compressed; `zcat results.json.gz | jq` reads it).
pub const RESULTS_FILE: &str = "results.json.gz";

/// `results` as `RESULTS_FILE` holds them: compact JSON, gzipped without a timestamp, so the
/// same results make the same bytes.
pub fn encode_results(results: &BenchResults) -> anyhow::Result<Vec<u8>> {
    let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
    serde_json::to_writer(&mut gz, results)?;
    Ok(gz.finish()?)
}

/// Reads a run's raw results: `path` is the run's directory (its `RESULTS_FILE`) or a results
/// file, gzipped (told by its magic bytes) or plain JSON. Errors name the file.
pub fn read_results(path: &Path) -> anyhow::Result<BenchResults> {
    let file = if path.is_dir() { path.join(RESULTS_FILE) } else { path.to_path_buf() };
    let named = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", file.display());
    let bytes = std::fs::read(&file).map_err(|e| named(&e))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        serde_json::from_reader(flate2::read::GzDecoder::new(&bytes[..])).map_err(|e| named(&e))
    } else {
        serde_json::from_slice(&bytes).map_err(|e| named(&e))
    }
}

impl BenchResults {
    /// Keeps only the routers named in `routers` (all of them when it is empty), in every
    /// workload: a reference made from parts shows the routers it compares, not every one a part
    /// also ran. A name no workload has is an error, so a typo cannot empty the report silently.
    pub fn keep_routers(&mut self, routers: &[String]) -> anyhow::Result<()> {
        if routers.is_empty() {
            return Ok(());
        }
        for name in routers {
            anyhow::ensure!(
                self.workloads.iter().any(|w| w.runs.iter().any(|r| &r.router == name)),
                "--routers: no workload has a router named {name:?}"
            );
        }
        for w in &mut self.workloads {
            w.runs.retain(|r| routers.contains(&r.router));
        }
        Ok(())
    }
}
