//! `headroom-bench agreement REAL SIM`: how far the simulated-time bench (`sim`) agrees with
//! the real one (`run`, the judge of record) on the same traffic. Per workload, three rungs
//! near the real run's cliffs that both measured for the same routers, each class's
//! attainment side by side (the mean over the seeds both measured there), how far apart the
//! real bench's own seeds lie there (what a difference is read against: on a cliff rung a
//! few requests turn a class's attainment), and each workload's verdict (the best headroom
//! router against the best baseline, by capacity and critical capacity) both ways.

use std::fmt::Write;

use crate::capacities::ratios;
use crate::summary::Summary;
use crate::{cliff_rates, BenchResults, RouterRun, WorkloadRun};

/// How far apart (in points of attainment) a class may be measured both ways and agree.
pub const AGREE_POINTS: f64 = 3.0;

/// The ladder point of `run` at `rate` (the ladder's seed: both benches send it the same traffic).
fn point(run: &RouterRun, rate: f64) -> Option<&Summary> {
    run.points.iter().find(|(r, _)| *r == rate).map(|(_, s)| s)
}

/// What `run` measured at `rate`: the ladder's point, then its repeats in seed order (the
/// same seeds both benches: the ladder's, then `repeat_seed(1)`, `repeat_seed(2)`...).
fn measured(run: &RouterRun, rate: f64) -> Vec<&Summary> {
    run.points.iter().chain(&run.repeats).filter(|(r, _)| *r == rate).map(|(_, s)| s).collect()
}

/// A class's attainment over some seeds: their mean, and how far apart the seeds lie
/// (highest less lowest).
#[derive(Debug, Clone, Copy)]
struct Seeds {
    mean: f64,
    spread: f64,
}

/// Each class's attainment over the first `n` of `runs`.
fn class_means(runs: &[&Summary], n: usize) -> Vec<(String, Seeds)> {
    let Some(first) = runs.first() else { return Vec::new() };
    first
        .per_class
        .keys()
        .filter_map(|class| {
            let values: Vec<f64> =
                runs.iter().take(n).filter_map(|s| Some(s.per_class.get(class)?.attainment)).collect();
            let spread = values.iter().copied().reduce(f64::max)? - values.iter().copied().reduce(f64::min)?;
            (values.len() == n).then(|| (class.clone(), Seeds { mean: values.iter().sum::<f64>() / n as f64, spread }))
        })
        .collect()
}

/// The routers both runs measured on a workload, in the real run's order.
fn common<'a>(real: &'a WorkloadRun, sim: &'a WorkloadRun) -> Vec<(&'a RouterRun, &'a RouterRun)> {
    real.runs.iter().filter_map(|r| Some((r, sim.runs.iter().find(|s| s.router == r.router)?))).collect()
}

/// Three rungs of a workload to compare: of the rates every common router measured both
/// ways, those nearest the real run's cliffs (`cliff_rates`), lowest, middle and highest.
pub fn rungs(real: &WorkloadRun, sim: &WorkloadRun) -> Vec<f64> {
    let pairs = common(real, sim);
    let both = |rate: f64| !pairs.is_empty() && pairs.iter().all(|(r, s)| point(r, rate).and(point(s, rate)).is_some());
    let mut candidates: Vec<f64> = real.runs.iter().flat_map(|r| r.points.iter().map(|p| p.0)).collect();
    candidates.sort_by(f64::total_cmp);
    candidates.dedup();
    candidates.retain(|&r| both(r));
    let mut cliff: Vec<f64> = cliff_rates(real).into_iter().filter(|&r| both(r)).collect();
    if cliff.is_empty() {
        cliff = candidates.clone();
    }
    let mid = cliff.iter().sum::<f64>() / cliff.len().max(1) as f64;
    let mut chosen: Vec<f64> = match cliff.len() {
        0..=3 => cliff.clone(),
        n => vec![cliff[0], cliff[n / 2], cliff[n - 1]],
    };
    // Fewer than three at the cliffs: the nearest other rungs.
    let mut others: Vec<f64> = candidates.into_iter().filter(|r| !chosen.contains(r)).collect();
    others.sort_by(|a, b| (a - mid).abs().total_cmp(&(b - mid).abs()));
    chosen.extend(others.into_iter().take(3usize.saturating_sub(chosen.len())));
    chosen.sort_by(f64::total_cmp);
    chosen
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The agreement tables of every workload both runs measured, as markdown.
pub fn table(real: &BenchResults, sim: &BenchResults) -> String {
    let mut out = String::new();
    let mut compared = (0usize, 0usize, 0usize);
    for rw in &real.workloads {
        let Some(sw) = sim.workloads.iter().find(|s| s.workload == rw.workload) else { continue };
        let rates = rungs(rw, sw);
        let _ = writeln!(out, "### {}\n", rw.workload);
        let _ =
            writeln!(out, "| router | rate (req/s) | seeds | class | real | sim | difference | real's seeds apart |");
        let _ = writeln!(out, "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |");
        let (mut within, mut total, mut widest, mut in_spread) = (0usize, 0usize, 0f64, 0usize);
        for (r, s) in common(rw, sw) {
            for &rate in &rates {
                // The seeds both measured at this rate, the mean of each side's.
                let (a, b) = (measured(r, rate), measured(s, rate));
                let n = a.len().min(b.len());
                let sim_means = class_means(&b, n);
                for (class, ca) in class_means(&a, n) {
                    let Some(cb) = sim_means.iter().find(|(c, _)| *c == class).map(|(_, v)| v.mean) else { continue };
                    let diff = 100.0 * (cb - ca.mean);
                    let mark = if diff.abs() > AGREE_POINTS { " **" } else { "" };
                    let apart = if n > 1 { format!("{:.1}", 100.0 * ca.spread) } else { "-".to_string() };
                    let _ = writeln!(
                        out,
                        "| {} | {rate} | {n} | {class} | {} | {} | {diff:+.1}{mark} | {apart} |",
                        r.router,
                        pct(ca.mean),
                        pct(cb)
                    );
                    total += 1;
                    within += usize::from(diff.abs() <= AGREE_POINTS);
                    in_spread += usize::from(diff.abs() > AGREE_POINTS && n > 1 && diff.abs() <= 100.0 * ca.spread);
                    widest = widest.max(diff.abs());
                }
            }
        }
        let _ = writeln!(
            out,
            "\n{within} of {total} class attainments within {AGREE_POINTS} points (widest {widest:.1}; ** marks the others); \
             {in_spread} of the others within the real bench's own seeds' spread there.\n"
        );
        let verdict = |w: &WorkloadRun| {
            ratios(w).map_or("-".to_string(), |v| {
                let critical = v.critical_capacity_ratio.map_or("-".to_string(), |c| format!("{c:.2}x"));
                format!("{:.2}x / {critical} ({})", v.capacity_ratio, v.best_headroom)
            })
        };
        let _ = writeln!(
            out,
            "Verdict, best headroom router against the best baseline (capacity / critical capacity): real {}, sim {}.\n",
            verdict(rw),
            verdict(sw)
        );
        compared = (compared.0 + within, compared.1 + total, compared.2 + in_spread);
    }
    let _ = writeln!(
        out,
        "All workloads: {} of {} class attainments within {AGREE_POINTS} points; {} of the others within the real \
         bench's own seeds' spread at their rung.",
        compared.0, compared.1, compared.2
    );
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::summary::ClassSummary;

    fn summary(attainment: f64) -> Summary {
        let mut s: Summary = serde_json::from_value(serde_json::json!({
            "requests": 10, "offered_rps": 1.0, "attainment": attainment, "goodput_rps": 1.0,
            "ttft_ms": [null, null, null], "tpot_ms": [null, null, null], "shed": 0.0, "failed": 0.0,
            "per_server": {}
        }))
        .unwrap();
        s.critical_attainment = Some(attainment);
        s.per_class.insert("interactive".into(), ClassSummary { requests: 10, attainment, shed: 0.0 });
        s
    }

    fn workload(points: &[(f64, f64)]) -> WorkloadRun {
        let run = RouterRun {
            router: "envoy least request".into(),
            baseline: true,
            points: points.iter().map(|&(rate, a)| (rate, summary(a))).collect(),
            repeats: Vec::new(),
        };
        serde_json::from_value(serde_json::json!({
            "workload": "w", "step_s": 15.0, "servers": 8, "runs": [run]
        }))
        .unwrap()
    }

    #[test]
    fn three_rungs_at_the_real_cliff_are_compared_class_by_class() {
        let real = workload(&[(10.0, 1.0), (20.0, 0.95), (30.0, 0.8), (40.0, 0.5), (50.0, 0.2)]);
        let sim = workload(&[(10.0, 1.0), (20.0, 0.96), (30.0, 0.7), (40.0, 0.51), (50.0, 0.3)]);
        // The cliff is 20-30; the nearest other rung joins them.
        assert_eq!(rungs(&real, &sim), [10.0, 20.0, 30.0]);
        let results = |w: WorkloadRun| BenchResults {
            command: String::new(),
            profiles: vec![],
            time_scale: 1.0,
            workloads: vec![w],
        };
        let text = table(&results(real.clone()), &results(sim.clone()));
        assert!(
            text.contains("| envoy least request | 30 | 1 | interactive | 80.0% | 70.0% | -10.0 ** | - |"),
            "{text}"
        );
        assert!(text.contains("2 of 3 class attainments within 3 points"), "{text}");
        assert!(text.contains("0 of the others within the real bench's own seeds' spread"), "{text}");

        // Repeats: the seeds both measured, each side's mean; a seed one side alone ran is left out.
        let (mut real, mut sim) = (real, sim);
        real.runs[0].repeats = vec![(30.0, summary(0.9))];
        sim.runs[0].repeats = vec![(30.0, summary(0.84)), (30.0, summary(0.0))];
        let text = table(&results(real.clone()), &results(sim.clone()));
        assert!(
            text.contains("| envoy least request | 30 | 2 | interactive | 85.0% | 77.0% | -8.0 ** | 10.0 |"),
            "{text}"
        );
        assert!(text.contains("1 of the others within the real bench's own seeds' spread"), "{text}");
        // Seeds that lie closer together than the difference: outside it.
        real.runs[0].repeats = vec![(30.0, summary(0.84))];
        let text = table(&results(real), &results(sim));
        assert!(text.contains("| 82.0% | 77.0% | -5.0 ** | 4.0 |"), "{text}");
        assert!(text.contains("0 of the others within the real bench's own seeds' spread"), "{text}");
    }
}
