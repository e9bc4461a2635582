//! `headroom-bench analyze`: what the report leaves out, read from a run's `results.json.gz` and
//! its per-request logs with the definitions the report itself uses ([`Outcome::met_slo`],
//! [`Outcome::missed`], [`Summary::of`]): every class over every seed, where each server's
//! requests went and how they fared, and how flow control let each class through.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use headroom_loadgen::report::quantile;
use headroom_loadgen::runner::Outcome;

use crate::summary::Summary;
use crate::{read_outcomes, requests_file, seeds_of};

/// What `analyze` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum View {
    /// Per workload, router and rate: attainment of all requests, the non-sheddable ones and
    /// each class, and the share shed: the mean over the seeds and their range.
    Classes,
    /// Per measurement and server: requests by class, prompt tokens, TTFT and TPOT medians and
    /// the share that met their SLOs. The server is `x-served-by`, else the filter's choice;
    /// `unknown` when neither is known (shed or failed, or plain Envoy in front of servers
    /// that do not name themselves, as vLLM does not).
    Servers,
    /// Per measurement and class: requests by flow control's outcome (`x-headroom-flow`) and
    /// how many of each met their SLOs, misses by what they missed, the released ones' wait.
    Flows,
}

/// One measurement's requests: which run, workload, router, rate and seed they are.
pub struct Measured {
    /// The run directory's name.
    pub run: String,
    pub workload: String,
    pub router: String,
    pub rate: f64,
    pub seed: u64,
    pub step_s: f64,
    pub outcomes: Vec<Outcome>,
}

/// Every measurement of the run in `dir` whose per-request log is there (`requests/`, named
/// as the run wrote it; a reference assembled from parts may hold none for some).
pub fn load(dir: &Path) -> anyhow::Result<Vec<Measured>> {
    let results = crate::read_results(dir)?;
    let run = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
    let mut out = Vec::new();
    for w in &results.workloads {
        for r in &w.runs {
            for (rate, seed) in seeds_of(r) {
                let file = dir.join("requests").join(requests_file(&w.workload, &r.router, rate, seed));
                let Some(outcomes) = read_outcomes(&file)? else { continue };
                let (workload, router) = (w.workload.clone(), r.router.clone());
                out.push(Measured { run: run.clone(), workload, router, rate, seed, step_s: w.step_s, outcomes });
            }
        }
    }
    anyhow::ensure!(!out.is_empty(), "{}: no per-request log of its measurements under requests/", dir.display());
    Ok(out)
}

/// The table `view` makes of `measured` (from one or more runs).
pub fn table(view: View, measured: &[Measured]) -> String {
    match view {
        View::Classes => classes(measured),
        View::Servers => servers(measured),
        View::Flows => flows(measured),
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// `mean (lowest-highest)` in percent; the mean alone for one value, `-` for none.
fn spread(values: &[f64]) -> String {
    let Some(lo) = values.iter().copied().reduce(f64::min) else { return "-".into() };
    let hi = values.iter().copied().fold(lo, f64::max);
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    if values.len() == 1 {
        pct(mean)
    } else {
        format!("{} ({:.1}-{:.1})", pct(mean), 100.0 * lo, 100.0 * hi)
    }
}

fn median_ms(values: Vec<f64>) -> String {
    quantile(&values, 0.5).map_or("-".into(), |v| format!("{v:.0} ms"))
}

/// A table's two header lines: `columns` as (name, `---` or `---:`), after a run column when
/// the measurements come from more than one run.
fn header(measured: &[Measured], columns: &[(&str, &str)]) -> String {
    let run = several_runs(measured);
    let names: Vec<&str> = run.then_some("run").into_iter().chain(columns.iter().map(|c| c.0)).collect();
    let rules: Vec<&str> = run.then_some("---").into_iter().chain(columns.iter().map(|c| c.1)).collect();
    format!("| {} |\n| {} |\n", names.join(" | "), rules.join(" | "))
}

/// `outcomes` by `key`, in key order.
fn group_by<'a>(outcomes: &'a [Outcome], key: impl Fn(&'a Outcome) -> &'a str) -> BTreeMap<&'a str, Vec<&'a Outcome>> {
    let mut groups: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes {
        groups.entry(key(o)).or_default().push(o);
    }
    groups
}

/// Whether the measurements come from more than one run (the tables then lead with it).
fn several_runs(measured: &[Measured]) -> bool {
    measured.iter().any(|x| x.run != measured[0].run)
}

/// The run column's text: only when the measurements come from more than one run.
fn run_cell(measured: &[Measured], m: &Measured) -> String {
    if several_runs(measured) {
        format!("{} | ", m.run)
    } else {
        String::new()
    }
}

/// The columns that name one measurement, leading the per-seed tables.
const MEASUREMENT_COLUMNS: [(&str, &str); 4] =
    [("workload", "---"), ("router", "---"), ("rate", "---:"), ("seed", "---:")];

/// `m`'s cells under [`MEASUREMENT_COLUMNS`] (after the run's, when there is one).
fn measurement_cells(measured: &[Measured], m: &Measured) -> String {
    format!("{}{} | {} | {} | {}", run_cell(measured, m), m.workload, m.router, m.rate, m.seed)
}

/// The share of `outcomes` that met their SLOs.
fn met_share(outcomes: &[&Outcome]) -> f64 {
    outcomes.iter().filter(|o| o.met_slo()).count() as f64 / outcomes.len() as f64
}

fn classes(measured: &[Measured]) -> String {
    let mut names: Vec<&str> = measured.iter().flat_map(|m| m.outcomes.iter().map(|o| o.class.as_str())).collect();
    names.sort_unstable();
    names.dedup();
    // Each point (run, workload, router, rate) with its seeds' summaries, in table order.
    let mut groups: Vec<(&Measured, Vec<Summary>)> = Vec::new();
    for m in measured {
        let summary = Summary::of(&m.outcomes, m.step_s);
        let same = |g: &&mut (&Measured, Vec<Summary>)| {
            (&g.0.run, &g.0.workload, &g.0.router, g.0.rate) == (&m.run, &m.workload, &m.router, m.rate)
        };
        match groups.iter_mut().find(same) {
            Some(g) => g.1.push(summary),
            None => groups.push((m, vec![summary])),
        }
    }
    groups.sort_by(|(a, _), (b, _)| {
        (&a.workload, &a.router, &a.run).cmp(&(&b.workload, &b.router, &b.run)).then(a.rate.total_cmp(&b.rate))
    });
    let (l, r) = ("---", "---:");
    let mut columns = vec![("workload", l), ("router", l), ("rate", r), ("seeds", r), ("all", r), ("non-sheddable", r)];
    columns.extend(names.iter().map(|c| (*c, r)));
    columns.push(("shed", r));
    let mut s = header(measured, &columns);
    for (m, sums) in groups {
        let (run, workload, router) = (run_cell(measured, m), &m.workload, &m.router);
        let all: Vec<f64> = sums.iter().map(|x| x.attainment).collect();
        let critical: Vec<f64> = sums.iter().filter_map(|x| x.critical_attainment).collect();
        let shed: Vec<f64> = sums.iter().map(|x| x.shed).collect();
        let per_class: String = names
            .iter()
            .map(|c| {
                let v: Vec<f64> = sums.iter().filter_map(|x| x.per_class.get(*c).map(|k| k.attainment)).collect();
                format!(" {} |", spread(&v))
            })
            .collect();
        let _ = writeln!(
            s,
            "| {run}{workload} | {router} | {} | {} | {} | {} |{per_class} {} |",
            m.rate,
            sums.len(),
            spread(&all),
            spread(&critical),
            spread(&shed)
        );
    }
    s
}

/// Where a request went: the server that answered, else the endpoint the filter chose.
fn server_of(o: &Outcome) -> Option<&str> {
    o.served_by.as_deref().or(o.chosen.as_deref())
}

fn servers(measured: &[Measured]) -> String {
    let (l, r) = ("---", "---:");
    let columns = [
        ("server", l),
        ("requests", r),
        ("by class", l),
        ("prompt tokens (k)", r),
        ("TTFT p50", r),
        ("TPOT p50", r),
        ("met", r),
    ];
    let mut s = header(measured, &[&MEASUREMENT_COLUMNS[..], &columns].concat());
    for m in measured {
        let by_server = group_by(&m.outcomes, |o| server_of(o).unwrap_or("unknown"));
        let mut rows: Vec<_> = by_server.into_iter().collect();
        rows.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(b.0)));
        for (server, os) in rows {
            let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
            for o in &os {
                *classes.entry(o.class.as_str()).or_default() += 1;
            }
            let by_class: Vec<String> = classes.iter().map(|(c, n)| format!("{c} {n}")).collect();
            let tokens: u64 = os.iter().map(|o| u64::from(o.prompt_tokens)).sum();
            let ok = || os.iter().filter(|o| o.status == 200);
            let _ = writeln!(
                s,
                "| {} | {server} | {} | {} | {:.1} | {} | {} | {} |",
                measurement_cells(measured, m),
                os.len(),
                by_class.join(", "),
                tokens as f64 / 1000.0,
                median_ms(ok().filter_map(|o| o.ttft_ms).collect()),
                median_ms(ok().filter_map(|o| o.tpot_ms).collect()),
                pct(met_share(&os))
            );
        }
    }
    s
}

fn flows(measured: &[Measured]) -> String {
    let (l, r) = ("---", "---:");
    let columns = [
        ("class", l),
        ("requests", r),
        ("met", r),
        ("by flow outcome: n (met)", l),
        ("misses by cause", l),
        ("released: waited, mean", r),
    ];
    let mut s = header(measured, &[&MEASUREMENT_COLUMNS[..], &columns].concat());
    for m in measured {
        for (class, os) in group_by(&m.outcomes, |o| o.class.as_str()) {
            let mut by_flow: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
            let mut causes: BTreeMap<&str, usize> = BTreeMap::new();
            for o in &os {
                let e = by_flow.entry(o.flow.as_deref().unwrap_or("-")).or_default();
                e.0 += 1;
                e.1 += usize::from(o.met_slo());
                if let Some(cause) = o.missed() {
                    *causes.entry(cause).or_default() += 1;
                }
            }
            let flows: Vec<String> =
                by_flow.iter().map(|(f, (n, k))| format!("{f} {n} ({:.0}%)", 100.0 * *k as f64 / *n as f64)).collect();
            let causes: Vec<String> = causes.iter().map(|(c, n)| format!("{c} {n}")).collect();
            let waits: Vec<f64> = os
                .iter()
                .filter(|o| o.flow.as_deref() == Some("released"))
                .map(|o| o.queued_ms.unwrap_or(0.0))
                .collect();
            let waited = if waits.is_empty() {
                "-".to_string()
            } else {
                format!("{:.0} ms", waits.iter().sum::<f64>() / waits.len() as f64)
            };
            let _ = writeln!(
                s,
                "| {} | {class} | {} | {} | {} | {} | {waited} |",
                measurement_cells(measured, m),
                os.len(),
                pct(met_share(&os)),
                flows.join(", "),
                if causes.is_empty() { "-".to_string() } else { causes.join(", ") }
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{repeat_seed, BenchResults, RouterRun, WorkloadRun, LADDER_SEED};

    fn outcome(class: &str, priority: i32, ttft: f64, flow: &str, server: &str) -> Outcome {
        Outcome {
            class: class.into(),
            priority,
            stream: true,
            status: if flow == "saturated" { 429 } else { 200 },
            slo_ttft_ms: Some(100.0),
            ttft_ms: Some(ttft),
            prompt_tokens: 500,
            served_by: (!server.is_empty()).then(|| server.into()),
            flow: Some(flow.into()),
            queued_ms: (flow == "released").then_some(40.0),
            ..Default::default()
        }
    }

    /// A run directory: one router at 10 req/s, the ladder's seed and one repeat.
    fn run_dir(name: &str, seeds: [Vec<Outcome>; 2]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("headroom-analyze-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("requests")).unwrap_or_default();
        let [ladder, repeat] = seeds;
        for (seed, outcomes) in [(LADDER_SEED, &ladder), (repeat_seed(1), &repeat)] {
            let lines: Vec<String> = outcomes.iter().filter_map(|o| serde_json::to_string(o).ok()).collect();
            let file = dir.join("requests").join(requests_file("mixed", "headroom", 10.0, seed));
            std::fs::write(file, lines.join("\n")).unwrap_or_default();
        }
        let run = RouterRun {
            router: "headroom".into(),
            baseline: false,
            points: vec![(10.0, Summary::of(&ladder, 1.0))],
            repeats: vec![(10.0, Summary::of(&repeat, 1.0))],
        };
        let results = BenchResults {
            command: "test".into(),
            profiles: vec![],
            time_scale: 1.0,
            workloads: vec![WorkloadRun {
                workload: "mixed".into(),
                step_s: 1.0,
                engine: None,
                lead_in_s: 0.0,
                load_held_after: false,
                servers: 2,
                profiles: vec![],
                trace_window: None,
                time_scale: None,
                command: None,
                runs: vec![run],
                ratios: None,
            }],
        };
        std::fs::write(dir.join(crate::RESULTS_FILE), crate::encode_results(&results).unwrap_or_default())
            .unwrap_or_default();
        dir
    }

    fn seeds() -> [Vec<Outcome>; 2] {
        [
            vec![
                outcome("interactive", 0, 50.0, "immediate", "a"),
                outcome("interactive", 0, 150.0, "released", "b"),
                outcome("sheddable", -1, 0.0, "saturated", ""),
                outcome("batch", 0, 50.0, "immediate", "a"),
            ],
            vec![
                outcome("interactive", 0, 50.0, "immediate", "a"),
                outcome("interactive", 0, 50.0, "released", "b"),
                outcome("sheddable", -1, 50.0, "immediate", "b"),
                outcome("batch", 0, 50.0, "immediate", "a"),
            ],
        ]
    }

    #[test]
    fn classes_pool_the_seeds_with_the_reports_own_definitions() {
        let dir = run_dir("classes", seeds());
        let measured = load(&dir).unwrap_or_default();
        assert_eq!(measured.len(), 2, "the ladder's seed and the repeat's, found by name");
        let table = table(View::Classes, &measured);
        let _ = std::fs::remove_dir_all(&dir);
        // all: 2/4 then 4/4; non-sheddable: 2/3 then 3/3; interactive 1/2 then 2/2; shed 1/4 then 0.
        let row = table.lines().nth(2).unwrap_or_default();
        assert_eq!(
            row,
            "| mixed | headroom | 10 | 2 | 75.0% (50.0-100.0) | 83.3% (66.7-100.0) | 100.0% (100.0-100.0) | 75.0% (50.0-100.0) | 50.0% (0.0-100.0) | 12.5% (0.0-25.0) |"
        );
        assert!(table.starts_with(
            "| workload | router | rate | seeds | all | non-sheddable | batch | interactive | sheddable | shed |"
        ));
    }

    #[test]
    fn servers_and_flows_say_where_requests_went_and_why_they_missed() {
        let dir = run_dir("servers", seeds());
        let measured = load(&dir).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        let servers = table(View::Servers, &measured);
        assert!(
            servers
                .contains("| mixed | headroom | 10 | 11 | a | 2 | batch 1, interactive 1 | 1.0 | 50 ms | - | 100.0% |"),
            "{servers}"
        );
        assert!(servers.contains("| 11 | unknown | 1 | sheddable 1 |"), "{servers}");
        let flows = table(View::Flows, &measured);
        assert!(
            flows.contains("| 11 | interactive | 2 | 50.0% | immediate 1 (100%), released 1 (0%) | ttft 1 | 40 ms |"),
            "{flows}"
        );
        assert!(flows.contains("| 11 | sheddable | 1 | 0.0% | saturated 1 (0%) | shed 1 | - |"), "{flows}");
    }

    #[test]
    fn two_runs_are_told_apart_and_a_run_without_logs_is_an_error() {
        let (a, b) = (run_dir("a", seeds()), run_dir("b", seeds()));
        let mut measured = load(&a).unwrap_or_default();
        measured.extend(load(&b).unwrap_or_default());
        let table = table(View::Classes, &measured);
        assert!(table.starts_with("| run | workload |"));
        assert_eq!(table.lines().count(), 4, "one row per run: {table}");
        let _ = std::fs::remove_dir_all(a.join("requests"));
        let err = load(&a).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("no per-request log"), "{err}");
        let _ = (std::fs::remove_dir_all(&a), std::fs::remove_dir_all(&b));
    }
}
