//! The benchmark report: per workload a verdict, the sweep, the detail at equal load, and a chart.

use std::fmt::Write;

use crate::summary::{capacity, Capacity, Summary};
use crate::{BenchResults, RouterRun, WorkloadRun, TARGET};
use headroom_loadgen::chart::{attainment_svg, Series};

/// The capacity target of predicted routing over the best baseline.
pub const CAPACITY_TARGET_RATIO: f64 = 1.3;

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn ms(v: &[Option<f64>; 3], digits: usize) -> String {
    let f = |x: &Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.digits$}"));
    format!("{} / {} / {}", f(&v[0]), f(&v[1]), f(&v[2]))
}

/// `(offered rps, attainment)` of a router's sweep.
fn curve(run: &RouterRun) -> Vec<(f64, f64)> {
    run.points.iter().map(|(_, s)| (s.offered_rps, s.attainment)).collect()
}

/// A router's capacity at [`TARGET`] (`Below(0)` for a router with no points).
pub fn router_capacity(run: &RouterRun) -> Capacity {
    capacity(&curve(run), TARGET).unwrap_or(Capacity::Below(0.0))
}

/// A router's critical capacity: the highest rate at which the non-sheddable classes
/// together keep [`TARGET`] attainment. `None` when a point lacks the figure (older results).
pub fn router_critical_capacity(run: &RouterRun) -> Option<Capacity> {
    let points: Option<Vec<(f64, f64)>> =
        run.points.iter().map(|(_, s)| s.critical_attainment.map(|a| (s.offered_rps, a))).collect();
    capacity(&points?, TARGET)
}

/// The headline comparison of a workload, also written into `results.json`: the best
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
}

/// [`Ratios`] of a workload; `None` without both a headroom and a baseline run.
pub fn ratios(w: &WorkloadRun) -> Option<Ratios> {
    let (p, b) = (best_by_capacity(w, false)?, best_by_capacity(w, true)?);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    let best_critical = |baseline: bool| {
        w.runs
            .iter()
            .filter(|r| r.baseline == baseline)
            .filter_map(|r| Some((r, router_critical_capacity(r)?)))
            .max_by(|a, b| a.1.rps().total_cmp(&b.1.rps()))
    };
    let critical = best_critical(false).zip(best_critical(true));
    Some(Ratios {
        best_headroom: p.router.clone(),
        best_baseline: b.router.clone(),
        capacity_ratio: ratio(router_capacity(p).rps(), router_capacity(b).rps()),
        best_headroom_critical: critical.map(|((p, _), _)| p.router.clone()),
        best_baseline_critical: critical.map(|(_, (b, _))| b.router.clone()),
        critical_capacity_ratio: critical.map(|((_, cp), (_, cb))| ratio(cp.rps(), cb.rps())),
    })
}

/// The baseline (or predicted) router with the highest capacity (ties: the last listed).
fn best_by_capacity(w: &WorkloadRun, baseline: bool) -> Option<&RouterRun> {
    w.runs
        .iter()
        .filter(|r| r.baseline == baseline)
        .max_by(|a, b| router_capacity(a).rps().total_cmp(&router_capacity(b).rps()))
}

/// The equal-load comparison point: of the rates every router ran, the heaviest at which
/// the best baseline still met its SLOs for 90% of requests (where a user would run it);
/// the lightest when it never did. Heavier rates show every router in overload.
pub fn equal_load_rate(w: &WorkloadRun) -> Option<f64> {
    let mut common: Vec<f64> = w.runs.first()?.points.iter().map(|p| p.0).collect();
    common.retain(|rate| w.runs.iter().all(|r| at_rate(r, *rate).is_some()));
    let baseline = best_by_capacity(w, true);
    let kept = |rate: &&f64| baseline.and_then(|b| at_rate(b, **rate)).is_some_and(|s| s.attainment >= TARGET);
    common.iter().rev().find(kept).or(common.first()).copied()
}

fn at_rate(run: &RouterRun, rate: f64) -> Option<&Summary> {
    run.points.iter().find(|(r, _)| (*r - rate).abs() < 1e-9).map(|(_, s)| s)
}

/// Who won a workload, and by how much, in words.
pub fn verdict(w: &WorkloadRun) -> String {
    let mut out = String::new();
    let best = |baseline: bool| best_by_capacity(w, baseline);
    if let Some(rate) = equal_load_rate(w) {
        let scored: Vec<(&RouterRun, f64)> =
            w.runs.iter().filter_map(|r| at_rate(r, rate).map(|s| (r, s.attainment))).collect();
        let top = |baseline: bool| {
            scored.iter().filter(|(r, _)| r.baseline == baseline).max_by(|a, b| a.1.total_cmp(&b.1)).copied()
        };
        if let Some(winner) = scored.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
            // Routers within a tenth of a point of the best share the lead.
            let leaders: Vec<String> =
                scored.iter().filter(|(_, a)| winner.1 - a < 0.001).map(|(r, _)| format!("**{}**", r.router)).collect();
            let lead = if leaders.len() == 1 {
                format!("{} wins with {}", leaders[0], pct(winner.1))
            } else {
                format!("{} tie at {}", leaders.join(", "), pct(winner.1))
            };
            let _ = write!(
                out,
                "At equal load ({rate:.0} req/s requested, the heaviest at which the best baseline still met {}) {lead}",
                pct(TARGET),
            );
            match (top(false), top(true)) {
                (Some(p), Some(b)) => {
                    let _ = writeln!(
                        out,
                        "; best predicted {} {} vs best baseline {} {} ({:+.1} points).",
                        p.0.router,
                        pct(p.1),
                        b.0.router,
                        pct(b.1),
                        100.0 * (p.1 - b.1)
                    );
                }
                _ => out.push_str(".\n"),
            }
        }
    }
    if let (Some(p), Some(b)) = (best(false), best(true)) {
        let (cp, cb) = (router_capacity(p), router_capacity(b));
        let ratio = if cb.rps() > 0.0 { cp.rps() / cb.rps() } else { f64::INFINITY };
        let open = matches!(cp, Capacity::AtLeast(_)) || matches!(cb, Capacity::AtLeast(_) | Capacity::Below(_));
        let _ = writeln!(
            out,
            "\n{}% -attainment capacity: best predicted {} {} req/s vs best baseline {} {} req/s: **{ratio:.2}x** (target {CAPACITY_TARGET_RATIO}x: {}){}.",
            100.0 * TARGET,
            p.router,
            cp.label(),
            b.router,
            cb.label(),
            if ratio >= CAPACITY_TARGET_RATIO { "met" } else { "missed" },
            if open { "; an open-ended capacity (≥ or <) means the ladder did not reach the crossing" } else { "" }
        );
    }
    if let Some(r) = ratios(w) {
        if let (Some(p), Some(b), Some(ratio)) =
            (&r.best_headroom_critical, &r.best_baseline_critical, r.critical_capacity_ratio)
        {
            let capacity_of = |name: &str| {
                w.runs.iter().find(|run| run.router == name).and_then(router_critical_capacity).map(Capacity::label)
            };
            let _ = writeln!(
                out,
                "\nCritical capacity (the non-sheddable classes together at {}): best predicted {p} {} req/s vs best baseline {b} {} req/s: **{ratio:.2}x**.",
                pct(TARGET),
                capacity_of(p).unwrap_or_default(),
                capacity_of(b).unwrap_or_default(),
            );
        }
    }
    // Why a capacity target can be out of reach: no router serves more than the fleet can.
    // With goodput at most G, 90% attainment is possible only up to G / 0.9 offered.
    let goodput = w.runs.iter().flat_map(|r| r.points.iter().map(|(_, s)| s.goodput_rps)).fold(0.0, f64::max);
    if let Some(b) = best(true) {
        let (cb, ceiling) = (router_capacity(b).rps(), goodput / TARGET);
        // Only meaningful when every sweep reached its crossing: an open-ended capacity
        // says the ladder, not the fleet, stopped.
        let closed = w.runs.iter().all(|r| matches!(router_capacity(r), Capacity::At(_)));
        let short = (100.0 * ceiling / cb.max(f64::MIN_POSITIVE)).round() < (100.0 * CAPACITY_TARGET_RATIO).round();
        if closed && cb > 0.0 && goodput > 0.0 && short {
            let _ = writeln!(
                out,
                "\nCeiling: {}x the best baseline's capacity is {:.0} req/s offered; {}% attainment there means {:.0} SLO-meeting requests/s, but no router delivered that at any rate: the most was {goodput:.1}, enough for at most {:.2}x. The fleet, not the routing, sets the limit here.",
                CAPACITY_TARGET_RATIO,
                CAPACITY_TARGET_RATIO * cb,
                100.0 * TARGET,
                CAPACITY_TARGET_RATIO * cb * TARGET,
                ceiling / cb
            );
        }
    }
    out.replace("% -attainment", "%-attainment")
}

/// The workload's section of the report.
pub fn section(w: &WorkloadRun) -> String {
    let mut s = format!("\n## {}\n\n{}\n", w.workload, verdict(w));
    let _ = writeln!(s, "![SLO attainment against load: {}]({}.svg)\n", w.workload, w.workload);
    let mut rates: Vec<f64> = w.runs.iter().flat_map(|r| r.points.iter().map(|p| p.0)).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let _ = writeln!(
        s,
        "SLO attainment by requested rate (req/s); `-`: not run, the router was already under {}:\n",
        pct(crate::STOP_BELOW)
    );
    let header: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
    let _ = writeln!(
        s,
        "| router | {} | capacity at {} (req/s) | critical capacity (req/s) |",
        header.join(" | "),
        pct(TARGET)
    );
    let _ = writeln!(s, "| --- |{} --- | --- |", " ---: |".repeat(rates.len()));
    for r in &w.runs {
        let cells: Vec<String> =
            rates.iter().map(|rate| at_rate(r, *rate).map_or("-".into(), |x| pct(x.attainment))).collect();
        let critical = router_critical_capacity(r).map_or("-".into(), Capacity::label);
        let _ = writeln!(s, "| {} | {} | {} | {critical} |", r.router, cells.join(" | "), router_capacity(r).label());
    }
    if let Some(rate) = equal_load_rate(w) {
        let _ = writeln!(
            s,
            "\nAt {rate:.0} req/s requested (the equal-load point):\n\n| router | requests | offered req/s | SLO attainment | goodput (req/s) | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms | shed | failed | requests per server (min-max) |\n| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |"
        );
        for r in &w.runs {
            if let Some(x) = at_rate(r, rate) {
                let (lo, hi) = x.load_spread(w.servers);
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.1} | {} | {:.1} | {} | {} | {} | {} | {lo}-{hi} |",
                    r.router,
                    x.requests,
                    x.offered_rps,
                    pct(x.attainment),
                    x.goodput_rps,
                    ms(&x.ttft_ms, 0),
                    ms(&x.tpot_ms, 1),
                    pct(x.shed),
                    pct(x.failed)
                );
            }
        }
        let mut classes: Vec<&String> =
            w.runs.iter().filter_map(|r| at_rate(r, rate)).flat_map(|x| x.per_class.keys()).collect();
        classes.sort();
        classes.dedup();
        if !classes.is_empty() {
            let names: Vec<String> = classes.iter().map(|c| format!("{c} (shed)")).collect();
            let _ = writeln!(
                s,
                "\nBy SLO class at {rate:.0} req/s (attainment, and the share shed):\n\n| router | non-sheddable together | {} |\n| --- | ---: |{}",
                names.join(" | "),
                " ---: |".repeat(classes.len())
            );
            for r in &w.runs {
                let Some(x) = at_rate(r, rate) else { continue };
                let cells: Vec<String> = classes
                    .iter()
                    .map(|c| {
                        x.per_class.get(*c).map_or("-".into(), |k| format!("{} ({})", pct(k.attainment), pct(k.shed)))
                    })
                    .collect();
                let critical = x.critical_attainment.map_or("-".into(), pct);
                let _ = writeln!(s, "| {} | {critical} | {} |", r.router, cells.join(" | "));
            }
        }
    }
    s
}

/// The whole report.
pub fn markdown(results: &BenchResults) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for p in &results.profiles {
        match counts.iter_mut().find(|(name, _)| name == p) {
            Some((_, n)) => *n += 1,
            None => counts.push((p.clone(), 1)),
        }
    }
    let fleet: Vec<String> = counts.iter().map(|(p, n)| format!("{n} {}", p.to_uppercase())).collect();
    let mut s = format!(
        "# Benchmark: SLO attainment by router\n\n{} simulated servers ({}) behind the real Envoy; at each rate every router gets the identical request sequence. Simulator speed: {}x real time (rates and latencies are in simulated time).\n\nCommand: `{}`\n\nSLO attainment: share of requests meeting both their TTFT and TPOT SLO (shed and failed requests count as misses); goodput: such requests per second. Capacity: the offered rate at which attainment crosses {}, interpolated between the two rates around the crossing. Baselines: plain Envoy round robin and least request, and headroom with prediction off (composite of queue, KV cache and prefix). Predicted: headroom with `x-prediction-based-scheduling: true`, with the default `most` (spreading) strategy for the positive tier, or `least` (bin-packing, llm-d's default).\n\nEach verdict below says whether predicted routing reached the target (at least {CAPACITY_TARGET_RATIO}x the best baseline's capacity); `docs/benchmark.md` explains the reference run's results, including why the target is missed where it is.\n",
        results.profiles.len(),
        fleet.join(", "),
        results.time_scale,
        results.command,
        pct(TARGET)
    );
    for w in &results.workloads {
        s.push_str(&section(w));
    }
    s
}

/// The workload's chart: attainment against offered load, one line per router.
pub fn chart(w: &WorkloadRun) -> String {
    let series: Vec<Series> = w.runs.iter().map(|r| Series { name: &r.router, points: curve(r) }).collect();
    attainment_svg(&format!("{}: SLO attainment vs load", w.workload), &series, TARGET)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::ClassSummary;

    fn point(rate: f64, attainment: f64) -> (f64, Summary) {
        let s = Summary {
            requests: (rate * 10.0) as usize,
            offered_rps: rate,
            attainment,
            goodput_rps: rate * attainment,
            ttft_ms: [Some(50.0), Some(90.0), Some(120.0)],
            tpot_ms: [Some(10.0), None, None],
            shed: 0.0,
            failed: 0.0,
            per_server: [("a".to_string(), 3usize)].into_iter().collect(),
            // The non-sheddable classes fare better than the whole (sheddable ones go first).
            critical_attainment: Some((attainment + 0.05).min(1.0)),
            per_class: [
                ("interactive".to_string(), ClassSummary { requests: 7, attainment, shed: 0.0 }),
                ("sheddable".to_string(), ClassSummary { requests: 3, attainment: attainment / 2.0, shed: 0.2 }),
            ]
            .into_iter()
            .collect(),
        };
        (rate, s)
    }

    fn run(name: &str, baseline: bool, pts: &[(f64, f64)]) -> RouterRun {
        RouterRun { router: name.into(), baseline, points: pts.iter().map(|(r, a)| point(*r, *a)).collect() }
    }

    fn workload() -> WorkloadRun {
        WorkloadRun {
            workload: "mixed".into(),
            step_s: 10.0,
            servers: 2,
            runs: vec![
                run("rr", true, &[(10.0, 0.99), (20.0, 0.7)]),
                run("lr", true, &[(10.0, 0.99), (20.0, 0.95), (30.0, 0.7)]),
                run("pred", false, &[(10.0, 1.0), (20.0, 0.99), (30.0, 0.93), (40.0, 0.6)]),
            ],
            ratios: None,
        }
    }

    #[test]
    fn ratios_compare_the_best_of_each_side_by_capacity_and_critical_capacity() {
        let r = ratios(&workload()).unwrap();
        assert_eq!((r.best_headroom.as_str(), r.best_baseline.as_str()), ("pred", "lr"));
        // pred crosses 90% at 30 + 0.03/0.33 * 10 = 30.9; lr at 20 + 0.05/0.25 * 10 = 22.
        assert!((r.capacity_ratio - 30.909 / 22.0).abs() < 1e-3, "{r:?}");
        // Critical: pred 0.98 at 30 -> 0.65 at 40: 30 + 0.08/0.33 * 10; lr 1.0 at 20 -> 0.75 at 30: 20 + 0.1/0.25 * 10.
        let expected = (30.0 + 0.08 / 0.33 * 10.0) / (20.0 + 0.1 / 0.25 * 10.0);
        assert!((r.critical_capacity_ratio.unwrap() - expected).abs() < 1e-3, "{r:?}");
        let text = section(&workload());
        assert!(text.contains("critical capacity") && text.contains("Critical capacity"), "{text}");
        assert!(text.contains("| sheddable (shed) |") && text.contains("(20.0%)"), "{text}");
    }

    #[test]
    fn equal_load_is_the_highest_rate_everyone_ran() {
        assert_eq!(equal_load_rate(&workload()), Some(20.0));
    }

    #[test]
    fn equal_load_skips_rates_where_the_best_baseline_is_overloaded() {
        let mut w = workload();
        w.runs[0] = run("rr", true, &[(10.0, 0.99), (20.0, 0.7), (30.0, 0.5)]);
        assert_eq!(equal_load_rate(&w), Some(20.0), "lr (best baseline) still at 95% at 20, 70% at 30");
        w.runs[1] = run("lr", true, &[(10.0, 0.8), (20.0, 0.7), (30.0, 0.5)]);
        w.runs[0] = run("rr", true, &[(10.0, 0.85), (20.0, 0.7), (30.0, 0.5)]);
        assert_eq!(equal_load_rate(&w), Some(10.0), "never at 90%: the lightest rate");
    }

    #[test]
    fn verdict_names_winner_margin_and_capacity_ratio() {
        let v = verdict(&workload());
        assert!(v.contains("**pred** wins with 99.0%"), "{v}");
        assert!(v.contains("(+4.0 points)"), "{v}");
        // lr crosses 0.9 at 20 + 0.2*10 = 22; pred at 30 + (0.03/0.33)*10 ≈ 30.9 -> 1.40x
        assert!(v.contains("**1.40x**") && v.contains(": met)"), "{v}");
        assert!(!v.contains("Ceiling"), "a met target needs no ceiling note: {v}");
    }

    #[test]
    fn verdict_explains_a_target_out_of_reach() {
        let mut w = workload();
        w.runs[2] = run("pred", false, &[(10.0, 1.0), (20.0, 0.99), (30.0, 0.5)]);
        let v = verdict(&w);
        assert!(v.contains(": missed)") && v.contains("Ceiling: 1.3x the best baseline"), "{v}");
    }

    #[test]
    fn markdown_has_every_router_and_rate() {
        let r = BenchResults {
            command: "make bench".into(),
            profiles: vec!["h100".into(), "h100".into(), "a100".into()],
            time_scale: 0.5,
            workloads: vec![workload()],
        };
        let md = markdown(&r);
        assert!(md.contains("3 simulated servers (2 H100, 1 A100)"));
        assert!(md.contains("| rr | 99.0% | 70.0% | - | - | 13.1 |"), "{md}");
        assert!(md.contains("![SLO attainment against load: mixed](mixed.svg)"));
        assert!(md.contains("| pred | 200 | 20.0 | 99.0% |"), "{md}");
    }
}
