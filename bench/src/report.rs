//! The benchmark report: per workload a verdict, the sweep, the detail at equal load, and a chart.

use std::fmt::Write;

use crate::capacities::{at_rate, capacity_by, critical, mean_curve, measurements, overall, seed_band, seed_spread};
use crate::capacities::{capacity_band, equal_load_rate, ratios, router_capacity, seed_capacities, Pick};
use crate::host;
use crate::results::{BenchResults, RouterRun, WorkloadRun, SIM_ENGINE};
use crate::summary::{Capacity, ClassSummary, Summary, TierCount};
use crate::summary::{STOP_BELOW, TARGET};
use headroom_loadgen::chart::{attainment_svg, Panel, Series};

/// The capacity target of predicted routing over the best baseline.
pub const CAPACITY_TARGET_RATIO: f64 = 1.3;

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn ms(v: &[Option<f64>; 3], digits: usize) -> String {
    let f = |x: &Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.digits$}"));
    format!("{} / {} / {}", f(&v[0]), f(&v[1]), f(&v[2]))
}

/// A capacity with its noise band when there is one: `"141.2 (138.5-144.0)"`. A band's end
/// that is a seed's open-ended capacity says so (`"< 48.3 (< 49.1-59.8)"`: one seed under
/// 90% from the lowest rate, which it offered at 49.1, another crossing at 59.8), where
/// bare numbers read as two crossings above a capacity said to be below both.
fn capacity_label(run: &RouterRun, pick: Pick) -> Option<String> {
    let c = capacity_by(run, pick)?;
    Some(match seed_band(run, pick) {
        // Every seed open-ended alike ("< 80.0" on each): the band adds nothing.
        Some((lo, hi)) if lo.label() == hi.label() && lo.label() == c.label() => c.label(),
        Some((lo, hi)) => format!("{} ({}-{})", c.label(), lo.label(), hi.label()),
        None => c.label(),
    })
}

/// A verdict's ratio in hundredths, rounded down: a ratio just under the target (176.0 against
/// 135.4 req/s is 1.29985) must not print as the target beside the word "missed". The 1e-9
/// keeps a ratio exactly on a hundredth there (1.15 * 100 is 114.999... in floating point).
pub fn ratio_label(ratio: f64) -> String {
    if ratio.is_finite() {
        format!("{:.2}x", (ratio * 100.0 + 1e-9).floor() / 100.0)
    } else {
        format!("{ratio}x")
    }
}

/// What the noise bands say of a comparison of two capacities.
fn noise_note(within: Option<bool>) -> &'static str {
    match within {
        Some(true) => "; **a tie**: the capacities of the seeds overlap, the difference is within the noise",
        Some(false) => "; the seeds' capacities do not overlap",
        None => "",
    }
}

/// The two figures a verdict compares, for saying why a target was missed.
#[derive(Clone, Copy, PartialEq)]
enum Figure {
    /// All requests at [`TARGET`] attainment.
    Capacity,
    /// The non-sheddable classes together at [`TARGET`].
    Critical,
}

impl Figure {
    fn pick(self) -> Pick {
        match self {
            Figure::Capacity => overall,
            Figure::Critical => critical,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Figure::Capacity => "capacity",
            Figure::Critical => "critical capacity",
        }
    }
}

/// The most the fleet was seen to serve of what `pick` measures, over every router and
/// measurement (each seed's too): the offered rate times that attainment, with the router,
/// rate and attainment it came from. For all requests this is the goodput (SLO-meeting
/// requests a second). For the non-sheddable classes it is their goodput divided by their
/// share of the traffic, which is about the same at every rate and seed (a synthetic workload
/// draws its classes from the same shares, the trace replays one window): so in both cases a
/// value G allows [`TARGET`] attainment up to G / TARGET offered req/s, and no further.
fn most_served(w: &WorkloadRun, pick: Pick) -> Option<(f64, &RouterRun, f64, f64)> {
    w.runs
        .iter()
        .flat_map(|r| r.points.iter().chain(&r.repeats).map(move |(rate, s)| (r, *rate, s)))
        .filter_map(|(r, rate, s)| pick(s).map(|a| (a * s.offered_rps, r, rate, a)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// Why `p`, the best headroom router by `figure`, missed the target against `b`, the best
/// baseline by it, from the data; `None` when it met it (`ratio`, the verdict's own, so the two
/// never disagree on a ratio at the target's edge), or when a capacity was left open
/// (the best baseline's not crossed, or some router's ladder ended above the threshold:
/// then the most served is the ladder's, not the fleet's). The first that holds of:
/// - the fleet: no router served enough, at any rate or seed, for the target to be
///   possible ([`most_served`]);
/// - the noise: the target lies inside `p`'s band, some of its seeds' curves reach it;
/// - the routing: the fleet served enough somewhere, and every seed of `p` falls short.
fn why_missed(w: &WorkloadRun, figure: Figure, p: &RouterRun, b: &RouterRun, ratio: f64) -> Option<String> {
    let pick = figure.pick();
    let (cp, cb) = (capacity_by(p, pick)?, capacity_by(b, pick)?);
    let open = w.runs.iter().any(|r| matches!(capacity_by(r, pick), Some(Capacity::AtLeast(_))));
    let target = CAPACITY_TARGET_RATIO * cb.rps();
    if open || !matches!(cb, Capacity::At(_)) || cb.rps() <= 0.0 || ratio >= CAPACITY_TARGET_RATIO {
        return None;
    }
    let (served, by, rate, attainment) = most_served(w, pick).filter(|m| m.0 > 0.0)?;
    let at_most = served / TARGET / cb.rps();
    // Compared as printed, in whole hundredths: a ceiling of 1.2996x reads 1.30x.
    if (100.0 * at_most).round() < (100.0 * CAPACITY_TARGET_RATIO).round() {
        return Some(match figure {
            Figure::Capacity => format!(
                "Ceiling: {CAPACITY_TARGET_RATIO}x the best baseline's capacity is {target:.0} req/s offered; {}% attainment there means {:.0} SLO-meeting requests/s, but no router delivered that at any rate: the most was {served:.1}, enough for at most {at_most:.2}x. The fleet, not the routing, sets the limit here.",
                100.0 * TARGET,
                target * TARGET,
            ),
            Figure::Critical => format!(
                "Critical ceiling: {CAPACITY_TARGET_RATIO}x the best baseline's critical capacity is {target:.0} req/s offered; keeping {} of the non-sheddable classes there means serving them as fully as {:.0} of those {target:.0} req/s (the offered rate times their attainment), but no router did at any rate: the most was {served:.1} ({}, {} of them at {rate} req/s), enough for at most {at_most:.2}x (the classes' mix about the same at every rate and seed). The fleet, not the routing, sets the limit here.",
                pct(TARGET),
                target * TARGET,
                by.router,
                pct(attainment),
            ),
        });
    }
    let lead = format!(
        "Why the {} target was missed: {CAPACITY_TARGET_RATIO}x the best baseline's {} is {target:.1} req/s",
        figure.name(),
        figure.name()
    );
    let fleet = format!(
        "the fleet served enough for {at_most:.2}x ({}, {} at {rate} req/s)",
        by.router,
        if figure == Figure::Critical {
            format!("{} of the non-sheddable classes", pct(attainment))
        } else {
            pct(attainment)
        }
    );
    let seeds = seed_capacities(p, pick).unwrap_or_default();
    let reached = seeds.iter().filter(|c| c.rps() >= target).count();
    Some(match capacity_band(p, pick) {
        Some((lo, hi)) if reached > 0 => format!(
            "{lead}, inside {}'s band ({lo:.1}-{hi:.1}): {reached} of its {} seeds' curves reach it, the mean of their crossings ({:.1}) falls {:.2} req/s short; a miss within the noise, and {fleet}.",
            p.router,
            seeds.len(),
            cp.rps(),
            target - cp.rps(),
        ),
        band => format!(
            "{lead}, beyond {} {}; {fleet}, so the routing, not the fleet, falls short here.",
            p.router,
            match band {
                Some((_, hi)) => format!("on every seed (the best crossed at {hi:.1})"),
                None => format!("({})", cp.label()),
            },
        ),
    })
}

/// Who won a workload, and by how much, in words.
pub fn verdict(w: &WorkloadRun) -> String {
    let mut out = String::new();
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
                "At equal load ({rate} req/s requested: of the rates every router ran, the heaviest at which the best baseline still met {}) {lead}",
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
    // The ratios, their best routers and noise calls, as results.json carries them: every
    // line below names the routers `ratios` chose.
    let ratios = ratios(w);
    let named = |name: &str| w.runs.iter().find(|run| run.router == name);
    let by_capacity = ratios
        .as_ref()
        .and_then(|r| named(&r.best_headroom).zip(named(&r.best_baseline)).map(|pb| (pb, r.capacity_ratio)));
    let by_critical = ratios.as_ref().and_then(|r| {
        let p = r.best_headroom_critical.as_deref().and_then(named);
        p.zip(r.best_baseline_critical.as_deref().and_then(named)).zip(r.critical_capacity_ratio)
    });
    if let (Some(((p, b), ratio)), Some(r)) = (by_capacity, &ratios) {
        let (cp, cb) = (router_capacity(p), router_capacity(b));
        let open = matches!(cp, Capacity::AtLeast(_)) || matches!(cb, Capacity::AtLeast(_) | Capacity::Below(_));
        let _ = writeln!(
            out,
            "\n{}%-attainment capacity: best predicted {} {} req/s vs best baseline {} {} req/s: **{}** (target {CAPACITY_TARGET_RATIO}x: {}){}{}.",
            100.0 * TARGET,
            p.router,
            capacity_label(p, overall).unwrap_or_else(|| cp.label()),
            b.router,
            capacity_label(b, overall).unwrap_or_else(|| cb.label()),
            ratio_label(ratio),
            if ratio >= CAPACITY_TARGET_RATIO { "met" } else { "missed" },
            noise_note(r.capacity_within_noise),
            if open { "; an open-ended capacity (≥ or <) means the ladder did not reach the crossing" } else { "" }
        );
    }
    if let (Some(((p, b), ratio)), Some(r)) = (by_critical, &ratios) {
        let _ = writeln!(
            out,
            "\nCritical capacity (the non-sheddable classes together at {}): best predicted {} {} req/s vs best baseline {} {} req/s: **{}** (target {CAPACITY_TARGET_RATIO}x: {}){}.",
            pct(TARGET),
            p.router,
            capacity_label(p, critical).unwrap_or_default(),
            b.router,
            capacity_label(b, critical).unwrap_or_default(),
            ratio_label(ratio),
            if ratio >= CAPACITY_TARGET_RATIO { "met" } else { "missed" },
            noise_note(r.critical_within_noise),
        );
    }
    // Why a missed target was missed, the capacity's then the critical capacity's.
    for (figure, best) in [(Figure::Capacity, by_capacity), (Figure::Critical, by_critical)] {
        if let Some(why) = best.and_then(|((p, b), ratio)| why_missed(w, figure, p, b, ratio)) {
            let _ = writeln!(out, "\n{why}");
        }
    }
    out
}

/// The workload's section of the report.
pub fn section(w: &WorkloadRun, results: &BenchResults) -> String {
    let mut s = format!("\n## {}\n\n", w.workload);
    if !w.profiles.is_empty() {
        let kind = servers_kind(w.engine.as_deref());
        let _ = writeln!(s, "Fleet: {} {kind} ({}).", w.profiles.len(), fleet(&w.profiles));
    }
    s.push_str(&provenance(w, results));
    if let Some(n) = w.trace_window {
        let _ = writeln!(
            s,
            "Traffic: the trace's first {n} requests at every rate, their arrivals compressed to the rate and replayed back to back, so each rate measures the same requests."
        );
    }
    let _ = writeln!(s, "\n{}", verdict(w));
    let _ = writeln!(s, "![SLO attainment against load: {}]({}.svg)\n", w.workload, w.workload);
    let mut rates: Vec<f64> = w.runs.iter().flat_map(|r| r.points.iter().map(|p| p.0)).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let _ = writeln!(
        s,
        "SLO attainment by requested rate (req/s); `-`: not run, the router was already under {}. Rates near the cliff were measured once per seed: the mean, then the range; a capacity's range is over the seeds' curves (its noise band):\n",
        pct(STOP_BELOW)
    );
    let header: Vec<String> = rates.iter().map(|r| format!("{r}")).collect();
    let _ = writeln!(
        s,
        "| router | {} | capacity at {} (req/s) | critical capacity (req/s) |",
        header.join(" | "),
        pct(TARGET)
    );
    let _ = writeln!(s, "| --- |{} --- | --- |", " ---: |".repeat(rates.len()));
    for r in &w.runs {
        let per_rate = measurements(r);
        let cells: Vec<String> = rates
            .iter()
            .map(|rate| match per_rate.iter().find(|(x, _)| (x - rate).abs() < 1e-9) {
                None => "-".into(),
                Some((_, ms)) if ms.len() == 1 => pct(ms[0].attainment),
                Some((_, ms)) => {
                    let values: Vec<f64> = ms.iter().map(|s| s.attainment).collect();
                    let mean = values.iter().sum::<f64>() / values.len() as f64;
                    let (lo, hi) =
                        values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
                    format!("{} ({:.1}-{:.1})", pct(mean), 100.0 * lo, 100.0 * hi)
                }
            })
            .collect();
        let critical_capacity = capacity_label(r, critical).unwrap_or_else(|| "-".into());
        let capacity = capacity_label(r, overall).unwrap_or_else(|| router_capacity(r).label());
        let _ = writeln!(s, "| {} | {} | {capacity} | {critical_capacity} |", r.router, cells.join(" | "));
    }
    s.push_str(&conditions(w));
    s.push_str(&tier_precision(w, &rates));
    s.push_str(&interactive_and_shed(w, &rates));
    s.push_str(&later_turns(w, &rates));
    s.push_str(&engine_queues(w, &rates));
    s.push_str(&cpu_outside_engines(w, &rates));
    if let Some(rate) = equal_load_rate(w) {
        let _ = writeln!(
            s,
            "\nAt {rate} req/s requested (the equal-load point):\n\n| router | requests | offered req/s | SLO attainment | goodput (req/s) | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms | shed | failed | requests per server (min-max) |\n| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |"
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
                "\nBy SLO class at {rate} req/s (attainment, and the share shed):\n\n| router | non-sheddable together | {} |\n| --- | ---: |{}",
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

/// A table of one figure per router and requested rate, from each rate's measurements (every
/// seed); `cell` gives `None` where the figure does not exist. Routers without any are left
/// out, and so is the table when none has one.
fn rate_table(w: &WorkloadRun, rates: &[f64], title: &str, cell: impl Fn(&[&Summary]) -> Option<String>) -> String {
    let mut rows = Vec::new();
    for r in &w.runs {
        let per_rate = measurements(r);
        let cells: Vec<Option<String>> = rates
            .iter()
            .map(|rate| {
                let ms = per_rate.iter().find(|(x, _)| (x - rate).abs() < 1e-9).map(|(_, ms)| ms.as_slice());
                cell(ms.unwrap_or_default())
            })
            .collect();
        if cells.iter().any(Option::is_some) {
            let cells: Vec<String> = cells.into_iter().map(|c| c.unwrap_or_else(|| "-".into())).collect();
            rows.push((r.router.as_str(), cells));
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let header: Vec<String> = rates.iter().map(|r| format!("{r}")).collect();
    let mut s = format!("\n{title}\n\n| router | {} |\n| --- |{}\n", header.join(" | "), " ---: |".repeat(rates.len()));
    for (router, cells) in rows {
        let _ = writeln!(s, "| {router} | {} |", cells.join(" | "));
    }
    s
}

/// Per headroom router and rate, pooled over the seeds: of the requests placed in the
/// positive tier (predicted to meet their SLOs), the share that did, and of those placed in
/// the negative tier (predicted to miss wherever they went), the share that met them anyway.
/// The first shows how optimistic the predictions were at that load, the second how
/// pessimistic; the second also drives sheds, which need every endpoint predicted short.
fn tier_precision(w: &WorkloadRun, rates: &[f64]) -> String {
    let title = "Tier precision by requested rate, over every seed: of the requests headroom placed in its positive tier (predicted to meet their SLOs where they went), the share that met them, and of those in its negative tier (predicted to miss everywhere), the share that met them anyway (how many were placed in each):";
    let pooled = |ms: &[&Summary], tier: fn(&Summary) -> Option<TierCount>| {
        let (placed, met) = ms.iter().filter_map(|x| tier(x)).fold((0, 0), |(p, m), t| (p + t.placed, m + t.met));
        (placed > 0).then(|| format!("{} ({placed})", pct(met as f64 / placed as f64)))
    };
    rate_table(w, rates, title, |ms| match (pooled(ms, |x| x.positive_tier), pooled(ms, |x| x.negative_tier)) {
        (None, None) => None,
        (p, n) => Some(format!("{} / {}", p.unwrap_or_else(|| "-".into()), n.unwrap_or_else(|| "-".into()))),
    })
}

/// `field` of SLO class `class` over `measurements`, each weighted by its requests of that
/// class (`None`: no such request).
fn pooled(measurements: &[&Summary], class: &str, field: fn(&ClassSummary) -> f64) -> Option<f64> {
    let (sum, n) = measurements
        .iter()
        .filter_map(|x| x.per_class.get(class))
        .fold((0.0, 0usize), |(sum, n), k| (sum + field(k) * k.requests as f64, n + k.requests));
    (n > 0).then(|| sum / n as f64)
}

/// Per router and rate, pooled over the seeds: the interactive class's attainment and the
/// share of sheddable requests shed, the two that flow control and the p90 objective trade
/// (issue #13's "interactive at 1.2x the best baseline's capacity").
fn interactive_and_shed(w: &WorkloadRun, rates: &[f64]) -> String {
    let title = "Interactive attainment / sheddable requests shed, by requested rate, over every seed:";
    rate_table(w, rates, title, |ms| {
        match (pooled(ms, "interactive", |k| k.attainment), pooled(ms, "sheddable", |k| k.shed)) {
            (None, None) => None,
            (i, shed) => Some(format!("{} / {}", i.map_or("-".into(), pct), shed.map_or("-".into(), pct))),
        }
    })
}

/// Per router and rate, in the workloads with sessions: the later turns' TTFT p50 / p90, each
/// the mean over the seeds. A later turn placed where its conversation is cached prefills only
/// its new message, so this is where cache placement shows (issue #84's "TTFT p90 of later
/// turns" target compares it against least request's).
fn later_turns(w: &WorkloadRun, rates: &[f64]) -> String {
    let title = "Later turns' TTFT p50 / p90 ms (turns after a conversation's first), by requested rate, the mean over the seeds:";
    rate_table(w, rates, title, |ms| {
        let mean = |i: usize| {
            let v: Vec<f64> = ms.iter().filter_map(|x| x.later_turn_ttft_ms.and_then(|q| q[i])).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        match (mean(0), mean(1)) {
            (Some(p50), Some(p90)) => Some(format!("{p50:.0} / {p90:.0}")),
            _ => None,
        }
    })
}

/// Per router and rate: requests waiting in the engines, as their own metrics said while it
/// ran (`engines`): whether the engines, not the host or the gateway, were the limit.
fn engine_queues(w: &WorkloadRun, rates: &[f64]) -> String {
    let title = "Requests waiting in the engines (`vllm:num_requests_waiting`, read each second): the mean per engine / the most, and the share of readings with any waiting, by requested rate, the mean over the seeds:";
    rate_table(w, rates, title, |ms| {
        let qs: Vec<_> = ms.iter().filter_map(|x| x.engine_queue).collect();
        let n = qs.len() as f64;
        (!qs.is_empty()).then(|| {
            let mean = qs.iter().map(|q| q.waiting_mean).sum::<f64>() / n;
            let most = qs.iter().map(|q| q.waiting_max).fold(0.0, f64::max);
            let share = qs.iter().map(|q| q.queued_share).sum::<f64>() / n;
            format!("{mean:.1} / {most:.0} ({})", pct(share))
        })
    })
}

/// Per router and rate: the host's CPU outside the engines (the servers' API processes, Envoy,
/// the predictor, the load generator, the rest) and in them. On a CPU host an engine that
/// queues keeps its core busy, so what must stay small is the first (issue #84: at most 20%).
fn cpu_outside_engines(w: &WorkloadRun, rates: &[f64]) -> String {
    let title = "Host CPU outside the engines / in the engines (shares of the whole host: the model servers' API processes, Envoy, the predictor, the load generator and the rest against the engines' own processes), by requested rate, the mean over the seeds:";
    let mut s = rate_table(w, rates, title, |ms| {
        let split: Vec<(f64, f64)> = ms.iter().filter_map(|x| x.cpu_outside_engines()).collect();
        let n = split.len() as f64;
        (!split.is_empty()).then(|| {
            let (outside, inside) = split.iter().fold((0.0, 0.0), |(a, b), (o, i)| (a + o, b + i));
            format!("{} / {}", pct(outside / n), pct(inside / n))
        })
    });
    let Some(rate) = equal_load_rate(w) else { return s };
    let mut parts: Vec<&String> = w
        .runs
        .iter()
        .filter_map(|r| at_rate(r, rate))
        .filter_map(|x| x.cpu_by_part.as_ref())
        .flat_map(|p| p.keys())
        .collect();
    parts.sort();
    parts.dedup();
    if parts.is_empty() {
        return s;
    }
    let names: Vec<&str> = parts.iter().map(|p| p.as_str()).collect();
    let _ = writeln!(
        s,
        "
Host CPU by process at {rate} req/s (shares of the whole host):

| router | {} |
| --- |{}",
        names.join(" | "),
        " ---: |".repeat(parts.len())
    );
    for r in &w.runs {
        let Some(by) = at_rate(r, rate).and_then(|x| x.cpu_by_part.as_ref()) else { continue };
        let cells: Vec<String> = parts.iter().map(|p| by.get(*p).map_or("-".into(), |v| pct(*v))).collect();
        let _ = writeln!(s, "| {} | {} |", r.router, cells.join(" | "));
    }
    s
}

/// The whole report.
/// "6 H100, 2 A100": each profile's count, in first-seen order.
fn fleet(profiles: &[String]) -> String {
    let mut counts: Vec<(&String, usize)> = Vec::new();
    for p in profiles {
        match counts.iter_mut().find(|(name, _)| *name == p) {
            Some((_, n)) => *n += 1,
            None => counts.push((p, 1)),
        }
    }
    counts.iter().map(|(p, n)| format!("{n} {}", p.to_uppercase())).collect::<Vec<_>>().join(", ")
}

/// What served the model: the simulator's GPUs, or real vLLM (`engine` as results record it).
fn servers_kind(engine: Option<&str>) -> &'static str {
    match engine {
        Some("vllm") => "real vLLM servers (CPU build, a core each)",
        _ => "simulated servers",
    }
}

/// Where the routing ran: behind the real Envoy, or in `headroom-bench sim`'s simulated time.
fn gateway_kind(engine: Option<&str>) -> &'static str {
    match engine {
        Some(SIM_ENGINE) => {
            "routed in simulated time (`headroom-bench sim`: the filter's and the predictor's own code on one clock, Envoy and the network modelled as delays)"
        }
        _ => "behind the real Envoy",
    }
}

pub fn markdown(results: &BenchResults) -> String {
    // The header speaks for the whole run: real vLLM only when every workload ran on it.
    let all =
        |e: &str| !results.workloads.is_empty() && results.workloads.iter().all(|w| w.engine.as_deref() == Some(e));
    let engine = if all("vllm") {
        Some("vllm")
    } else if all(SIM_ENGINE) {
        Some(SIM_ENGINE)
    } else {
        None
    };
    let mut s = format!(
        "# Benchmark: SLO attainment by router\n\n{} {} ({}, unless a workload names its own fleet) {}; at each rate every router gets the identical request sequence. {}\n\nCommand: `{}`\n\nSLO attainment: share of requests meeting both their TTFT and TPOT SLO (shed and failed requests count as misses); goodput: such requests per second. Capacity: the offered rate at which attainment crosses {}, interpolated between the two rates around the crossing. Baselines: plain Envoy round robin and least request, llm-d's default scheduler (prefix-cache affinity + token load), and headroom with prediction off (composite of queue, KV cache and prefix). Predicted: headroom with `x-prediction-based-scheduling: true`, with the default `most` (spreading) strategy for the positive tier, or `least` (bin-packing, llm-d's default), or with flow control (`flow_control`: requests wait at the gateway by priority and deadline), or with the predictor's `p90` objective (tiers judged on 90th-percentile predictions).\n\nEach verdict below says whether predicted routing reached the target (at least {CAPACITY_TARGET_RATIO}x the best baseline's capacity); `docs/benchmark.md` explains the reference run's results, including why the target is missed where it is.\n",
        results.profiles.len(),
        servers_kind(engine),
        fleet(&results.profiles),
        gateway_kind(engine),
        match engine {
            Some("vllm") => "Real time: rates and latencies as the clients measured them.".to_string(),
            _ => format!(
                "Simulator speed: {}x real time unless a workload says otherwise (rates and latencies are in simulated time).",
                results.time_scale
            ),
        },
        results.command,
        pct(TARGET)
    );
    for w in &results.workloads {
        s.push_str(&section(w, results));
    }
    s
}

/// `field` of every measurement (ladder and repeats) that recorded it, with its router and rate.
fn recorded<T>(w: &WorkloadRun, field: impl Fn(&Summary) -> Option<T>) -> Vec<(&str, f64, T)> {
    let all = w.runs.iter().flat_map(|r| r.points.iter().chain(&r.repeats).map(move |(rate, s)| (r, *rate, s)));
    all.filter_map(|(r, rate, s)| Some((r.router.as_str(), rate, field(s)?))).collect()
}

/// Share of a headroom router's requests placed by the fallback above which a measurement is
/// named as gateway-bound: the predictor's answers came too late for that many (the host's
/// average CPU can stay under [`host::BUSY`] while Envoy's share of it saturates).
pub const FALLBACK: f64 = 0.01;

/// Whether the measurements measured the routing: no request held back by Envoy's circuit
/// breakers (a connection cap), the host's CPU under [`host::BUSY`], and headroom's requests
/// placed by prediction, not by its fallback (above [`FALLBACK`]). Names every point that was
/// not. Empty for results written before any was read.
fn conditions(w: &WorkloadRun) -> String {
    let mut s = String::new();
    let overflows = recorded(w, |m| m.gateway_overflow);
    let capped: Vec<String> =
        overflows.iter().filter(|m| m.2 > 0).map(|(r, rate, n)| format!("{r} at {rate} req/s ({n})")).collect();
    if !capped.is_empty() {
        let _ = writeln!(
            s,
            "\nGateway caps: **Envoy's circuit breakers held requests back** (overflows) in {}: those points measure the gateway's connection cap, not the routing.",
            capped.join(", ")
        );
    } else if !overflows.is_empty() {
        let n = overflows.len();
        let _ = writeln!(s, "\nGateway caps: Envoy's circuit breakers held back no request in the {n} measurements.");
    }
    // On real engines each engine's processes are its core's work: a host busy with them is
    // the fleet at load, and what could set latencies instead is the CPU everything else used.
    let outside = recorded(w, |m| m.cpu_outside_engines().map(|(outside, _)| outside));
    let busy = recorded(w, |m| m.host_cpu_busy);
    if let Some(most) = outside.iter().map(|m| m.2).reduce(f64::max) {
        let over = shares_over(&outside, host::OUTSIDE_ENGINES);
        let most_busy = busy.iter().map(|m| m.2).fold(0.0, f64::max);
        if over.is_empty() {
            let _ = writeln!(
                s,
                "\nHost CPU: at most {} busy, the engines' own processes included; outside them (the servers' API processes, Envoy, the predictor, the load generator, the rest) at most {} over the {} measurements (host-bound above {}).",
                pct(most_busy),
                pct(most),
                outside.len(),
                pct(host::OUTSIDE_ENGINES)
            );
        } else {
            let _ = writeln!(
                s,
                "\nHost CPU: **outside the engines above {}** in {}: there the host's other work may have set latencies.",
                pct(host::OUTSIDE_ENGINES),
                over.join(", ")
            );
        }
    } else if let Some(most) = busy.iter().map(|m| m.2).reduce(f64::max) {
        let over = shares_over(&busy, host::BUSY);
        if over.is_empty() {
            let (n, limit) = (busy.len(), pct(host::BUSY));
            let _ = writeln!(
                s,
                "\nHost CPU: at most {} busy over the {n} measurements (host-bound above {limit}).",
                pct(most)
            );
        } else {
            let _ = writeln!(
                s,
                "\nHost CPU: **above {} busy** in {}: there the host may have set latencies; a lower `--time-scale` keeps it out.",
                pct(host::BUSY),
                over.join(", ")
            );
        }
    }
    let fallback = recorded(w, |m| m.fallback);
    let late = shares_over(&fallback, FALLBACK);
    if !late.is_empty() {
        let _ = writeln!(
            s,
            "\nPredictor answers: **the filter's callout timed out** and the fallback placed more than {} of the requests in {}: \
             the gateway (Envoy and the filter, on this host's CPU) was the limit there, not the routing; a lower `--time-scale` keeps it out.",
            pct(FALLBACK),
            late.join(", ")
        );
    } else if !fallback.is_empty() {
        let n = fallback.len();
        let _ = writeln!(
            s,
            "\nPredictor answers: in time for at least {} of headroom's requests in the {n} measurements.",
            pct(1.0 - FALLBACK)
        );
    }
    s
}

/// The recorded shares above `limit`, each named as "router at rate req/s (share)".
fn shares_over(recorded: &[(&str, f64, f64)], limit: f64) -> Vec<String> {
    recorded.iter().filter(|m| m.2 > limit).map(|(r, rate, v)| format!("{r} at {rate} req/s ({})", pct(*v))).collect()
}

/// The lines a workload needs where its speed or its command is not the header's: a
/// workload run slower to keep the host out of the result, or one merged from another run.
fn provenance(w: &WorkloadRun, results: &BenchResults) -> String {
    let mut s = String::new();
    let scale = w.time_scale.unwrap_or(results.time_scale);
    if scale != results.time_scale {
        let _ = writeln!(
            s,
            "Simulator speed: {scale}x real time (so that this 2-core host stays out of the result; rates and latencies are in simulated time)."
        );
    }
    if w.lead_in_s > 0.0 {
        let _ = writeln!(
            s,
            "Each rate's step was measured after {} s of the same traffic that was not counted (`--lead-in`): the fleet at that load, not filling up.{}",
            w.lead_in_s,
            if w.load_held_after {
                " The traffic went on after the step until its last request had ended: every measured request decoded in a fleet at that load, not draining."
            } else {
                ""
            }
        );
    }
    let command = w.command.as_deref().unwrap_or(&results.command);
    if command != results.command {
        // One line per part when routers were measured in several sittings (`BenchResults::merge`).
        let parts: Vec<String> = command.lines().map(|c| format!("`{c}`")).collect();
        match parts.as_slice() {
            [one] => _ = writeln!(s, "Measured by another run than the header's: {one}."),
            _ => _ = writeln!(s, "Measured in parts, some routers each: {}.", parts.join(", then ")),
        }
    }
    s
}

/// The workload's chart: attainment against offered load, one line per router (the mean over
/// the seeds, their range shaded), all requests beside the critical classes when the
/// workload has them.
pub fn chart(w: &WorkloadRun) -> String {
    let panel = |title, pick: Pick| Panel {
        title,
        series: w
            .runs
            .iter()
            .map(|r| Series {
                name: &r.router,
                points: mean_curve(r, pick).unwrap_or_default(),
                band: seed_spread(r, pick),
            })
            .collect(),
    };
    let mut panels = vec![panel("all requests", overall)];
    if w.runs.iter().any(|r| r.points.iter().any(|(_, s)| s.critical_attainment.is_some())) {
        panels.push(panel("critical classes (not sheddable)", critical));
    }
    attainment_svg(&format!("{}: SLO attainment vs load", w.workload), &panels, TARGET)
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
            positive_tier: None,
            negative_tier: None,
            gateway_overflow: None,
            host_cpu_busy: None,
            fallback: None,
            later_turn_ttft_ms: None,
            engine_queue: None,
            cpu_by_part: None,
        };
        (rate, s)
    }

    /// Results of one `make bench` run at real time.
    fn one_run(workloads: Vec<WorkloadRun>) -> BenchResults {
        BenchResults { command: "make bench".into(), profiles: vec!["h100".into()], time_scale: 1.0, workloads }
    }

    fn run(name: &str, baseline: bool, pts: &[(f64, f64)]) -> RouterRun {
        RouterRun {
            router: name.into(),
            baseline,
            points: pts.iter().map(|(r, a)| point(*r, *a)).collect(),
            repeats: Vec::new(),
        }
    }

    #[test]
    fn a_ladder_goes_on_while_the_critical_classes_hold() {
        let (_, mut s) = point(140.0, 0.7);
        s.critical_attainment = Some(0.93);
        assert!(!crate::ladder_done(&s), "critical classes at 93%: their cliff is ahead");
        s.critical_attainment = Some(0.6);
        assert!(crate::ladder_done(&s));
        s.critical_attainment = None;
        assert!(crate::ladder_done(&s), "without the figure, all requests decide");
        s.attainment = 0.8;
        assert!(!crate::ladder_done(&s));
    }

    #[test]
    fn the_critical_classes_cliff_is_repeated_too_where_shedding_puts_it_apart() {
        let mut w = workload();
        // A router that sheds: all requests under 90% from 20 req/s, the non-sheddable
        // classes kept to 30 and lost at 40.
        let mut shedder = run("fc", false, &[(10.0, 0.99), (20.0, 0.8), (30.0, 0.78), (40.0, 0.5)]);
        for ((_, s), critical) in shedder.points.iter_mut().zip([1.0, 0.97, 0.92, 0.6]) {
            s.critical_attainment = Some(critical);
        }
        w.runs = vec![shedder];
        // Overall: 10 and 20; critical: 30 and 40. Without the second, the critical band
        // would rest on one seed at 30 and 40.
        assert_eq!(crate::cliff_rates(&w), vec![10.0, 20.0, 30.0, 40.0]);
        // Results without the critical figure repeat the overall cliff alone.
        for (_, s) in &mut w.runs[0].points {
            s.critical_attainment = None;
        }
        assert_eq!(crate::cliff_rates(&w), vec![10.0, 20.0]);
    }

    #[test]
    fn repeats_average_into_the_capacity_and_their_spread_decides_a_tie() {
        let mut w = workload();
        assert_eq!(crate::cliff_rates(&w), vec![10.0, 20.0, 30.0, 40.0]);
        // lr at 30 req/s measured twice more: 0.95 and 0.92 (the ladder said 0.7).
        w.runs[1].repeats = vec![point(30.0, 0.95), point(30.0, 0.92)];
        // Mean at 30: (0.7 + 0.95 + 0.92) / 3 = 0.8567: the crossing moves to 20 + 0.05/0.0933 * 10.
        let Capacity::At(mean) = router_capacity(&w.runs[1]) else { panic!("no crossing") };
        assert!((mean - 25.357).abs() < 1e-2, "{mean}");
        // Seeds' curves cross at 22 (the ladder's), >= 30 at 0.95 (open), and at 30 + ... (0.92):
        let (lo, hi) = capacity_band(&w.runs[1], overall).unwrap();
        assert!((lo - 22.0).abs() < 1e-9 && hi >= 30.0, "{lo}-{hi}");
        assert!(capacity_band(&w.runs[2], overall).is_none(), "no repeats, no band");
        // pred's band must exist to call a tie; give it one that reaches into lr's.
        w.runs[2].repeats = vec![point(30.0, 0.85)];
        let r = ratios(&w).unwrap();
        assert_eq!(r.capacity_within_noise, Some(true), "{r:?}");
        let text = verdict(&w);
        assert!(text.contains("**a tie**"), "{text}");
        let table = section(&w, &one_run(vec![]));
        assert!(table.contains("85.7% (70.0-95.0)"), "the mean and range of lr at 30: {table}");

        // Every seed's curve crosses: the capacity is the mean of the crossings, inside the band
        // (the mean curve's crossing need not be: averaging moves the offered rates too).
        w.runs[1].repeats = vec![point(30.0, 0.8), point(20.0, 0.91)];
        let (lo, hi) = capacity_band(&w.runs[1], overall).unwrap();
        let Capacity::At(c) = router_capacity(&w.runs[1]) else { panic!("no crossing") };
        assert!(lo <= c && c <= hi, "{lo} <= {c} <= {hi}");
    }

    #[test]
    fn a_band_says_which_of_its_ends_are_open() {
        // Under 90% from the lowest rate on the ladder's seed (80% at 10), crossing at 15 on
        // the repeat's (95% at 10, the ladder's 20 after it): the mean curve is under 90% at
        // 10 (87.5%), so the capacity is "< 10.0", and the band must not read as 10.0-15.0.
        let mut r = run("least", false, &[(10.0, 0.8), (20.0, 0.85)]);
        r.repeats = vec![point(10.0, 0.95)];
        assert_eq!(capacity_label(&r, overall).unwrap(), "< 10.0 (< 10.0-15.0)");
        // Every seed under 90% from the lowest rate: no band to show.
        r.repeats = vec![point(10.0, 0.85)];
        assert_eq!(capacity_label(&r, overall).unwrap(), "< 10.0");
        // Every seed crossing: bare numbers, as before.
        r.repeats = vec![point(10.0, 0.97)];
        r.points[0] = point(10.0, 0.93);
        assert!(!capacity_label(&r, overall).unwrap().contains('<'), "{:?}", capacity_label(&r, overall));

        // A seed still over 90% at its last rate, offered lower than where another seed crossed
        // (seeds offer a rung's rate apart): the band's top is open, not the other's crossing.
        let mut r = run("fc", false, &[(10.0, 0.95), (20.0, 0.5)]);
        let (mut slow, mut fast) = (point(10.0, 0.97), point(20.0, 0.95));
        slow.1.offered_rps = 9.0;
        fast.1.offered_rps = 10.5; // its curve never crosses: at least 10.5, under the ladder's 11.1
        r.repeats = vec![slow, fast];
        let crossed = 10.0 + 0.05 / 0.45 * 10.0;
        assert_eq!(capacity_band(&r, overall), Some((10.5, crossed)));
        let label = capacity_label(&r, overall).unwrap();
        assert!(label.ends_with("(≥ 10.5-≥ 11.1)"), "{label}");
    }

    fn workload() -> WorkloadRun {
        WorkloadRun {
            workload: "mixed".into(),
            step_s: 10.0,
            engine: None,
            lead_in_s: 0.0,
            load_held_after: false,
            servers: 2,
            profiles: vec!["h100".into(), "a100".into()],
            trace_window: None,
            time_scale: None,
            command: None,
            runs: vec![
                run("rr", true, &[(10.0, 0.99), (20.0, 0.7)]),
                run("lr", true, &[(10.0, 0.99), (20.0, 0.95), (30.0, 0.7)]),
                run("pred", false, &[(10.0, 1.0), (20.0, 0.99), (30.0, 0.93), (40.0, 0.6)]),
            ],
            ratios: None,
        }
    }

    #[test]
    fn a_reference_keeps_the_routers_it_names_and_refuses_an_unknown_one() {
        let mut results = one_run(vec![workload()]);
        results.keep_routers(&["lr".to_string(), "pred".to_string()]).unwrap();
        let kept: Vec<&str> = results.workloads[0].runs.iter().map(|r| r.router.as_str()).collect();
        assert_eq!(kept, ["lr", "pred"]);
        let unknown = results.keep_routers(&["rr".to_string()]).unwrap_err().to_string();
        assert!(unknown.contains("no workload has a router named \"rr\""), "{unknown}");
        assert_eq!(results.workloads[0].runs.len(), 2, "nothing dropped on a refusal");
        results.keep_routers(&[]).unwrap();
        assert_eq!(results.workloads[0].runs.len(), 2, "no names: every router kept");
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
        let text = section(&workload(), &one_run(vec![]));
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
    fn a_rate_between_whole_numbers_is_printed_as_measured() {
        // A rung at 22.5 where every router still holds: it is the equal-load point.
        let mut w = workload();
        for r in &mut w.runs {
            r.points.push(point(22.5, 0.96));
            r.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        w.runs[0].points.retain(|(rate, _)| *rate <= 22.5);
        assert_eq!(equal_load_rate(&w), Some(22.5));
        let text = section(&w, &one_run(vec![]));
        for said in [
            "| 10 | 20 | 22.5 | 30 |",
            "At equal load (22.5 req/s",
            "At 22.5 req/s requested",
            "By SLO class at 22.5 req/s",
        ] {
            assert!(text.contains(said), "{said:?} in {text}");
        }
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
    fn a_ratio_under_the_target_never_prints_as_it() {
        // mixed held: 176.0 against 135.4 req/s, which rounds to 1.30.
        assert_eq!(ratio_label(176.0 / 135.4), "1.29x");
        assert_eq!(ratio_label(1.3), "1.30x");
        assert_eq!(ratio_label(1.4), "1.40x");
        assert_eq!(ratio_label(1.15), "1.15x");
        assert_eq!(ratio_label(f64::INFINITY), "infx");
    }

    #[test]
    fn verdict_explains_a_target_out_of_reach() {
        let mut w = workload();
        w.runs[2] = run("pred", false, &[(10.0, 1.0), (20.0, 0.99), (30.0, 0.5)]);
        let v = verdict(&w);
        assert!(v.contains(": missed)") && v.contains("Ceiling: 1.3x the best baseline"), "{v}");
        // A router under the threshold from the lowest rate on leaves the ceiling standing;
        // one still over it at the ladder's top does not (its most is not the fleet's).
        w.runs.push(run("pred, least", false, &[(10.0, 0.8), (20.0, 0.7)]));
        assert!(verdict(&w).contains("Ceiling:"), "{}", verdict(&w));
        // A seed's measurement counts toward the most delivered: here 30 * 0.95 is past the ceiling.
        let mut seeded = w.clone();
        seeded.runs[2].repeats = vec![point(30.0, 0.95)];
        assert!(!verdict(&seeded).contains("Ceiling:"), "{}", verdict(&seeded));
        w.runs.push(run("pred, open", false, &[(10.0, 1.0)]));
        assert!(!verdict(&w).contains("Ceiling:"), "{}", verdict(&w));
    }

    #[test]
    fn verdict_explains_a_critical_target_out_of_reach() {
        // Critical (attainment + 0.05): lr 1.0 at 20, 0.75 at 30: 24; pred 1.0, 1.0, 0.55: 22.2.
        // The most served: lr's 30 * 0.75 = 22.5, which allows 25 req/s at 90%: 1.04x of 24.
        let mut w = workload();
        w.runs[2] = run("pred", false, &[(10.0, 1.0), (20.0, 0.99), (30.0, 0.5)]);
        let v = verdict(&w);
        assert!(v.contains("Critical ceiling: 1.3x the best baseline's critical capacity is 31 req/s"), "{v}");
        assert!(v.contains("serving them as fully as 28 of those 31 req/s"), "{v}");
        assert!(v.contains("the most was 22.5 (lr, 75.0% of them at 30 req/s), enough for at most 1.04x"), "{v}");
    }

    #[test]
    fn verdict_calls_a_critical_target_inside_the_band_a_miss_within_the_noise() {
        // lr's critical capacity is 24 (1.0 at 20, 0.75 at 30): the target is 31.2. pred's seeds
        // cross at 32.4 (0.98 at 30, 0.65 at 40), 26.7 (0.85 at 30) and 32.4: their mean, 30.5,
        // misses; two of three reach it.
        let mut w = workload();
        w.runs[2].repeats = vec![point(30.0, 0.80), point(30.0, 0.93)];
        let v = verdict(&w);
        assert!(v.contains("**1.27x** (target 1.3x: missed)"), "{v}");
        assert!(v.contains("Why the critical capacity target was missed: 1.3x the best baseline's critical capacity is 31.2 req/s, inside pred's band (26.7-32.4): 2 of its 3 seeds' curves reach it, the mean of their crossings (30.5) falls 0.69 req/s short"), "{v}");
        assert!(v.contains("a miss within the noise, and the fleet served enough for 1.36x (pred, 98.0% of the non-sheddable classes at 30 req/s)"), "{v}");
        assert!(!v.contains("Critical ceiling"), "{v}");
    }

    #[test]
    fn verdict_says_when_the_routing_not_the_fleet_misses_a_target() {
        // pred's critical classes: 1.0 at 20, 0.85 at 30 (crossing at 26.7), 0.73 at 40, where
        // 40 * 0.73 = 29.2 allows 32.4 req/s at 90%: 1.35x lr's 24, past the target of 31.2.
        let mut w = workload();
        w.runs[2] = run("pred", false, &[(10.0, 1.0), (20.0, 0.99), (30.0, 0.80), (40.0, 0.68)]);
        let v = verdict(&w);
        assert!(v.contains("Why the critical capacity target was missed: 1.3x the best baseline's critical capacity is 31.2 req/s, beyond pred (26.7); the fleet served enough for 1.35x (pred, 73.0% of the non-sheddable classes at 40 req/s), so the routing, not the fleet, falls short here."), "{v}");
        // Seeds' curves all short of it (26.7 and 27.7, 0.87 at 30 on the repeat): the band's top is named.
        w.runs[2].repeats = vec![point(30.0, 0.82)];
        let v = verdict(&w);
        assert!(v.contains("beyond pred on every seed (the best crossed at 27.7)"), "{v}");
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
        assert!(md.contains("3 simulated servers (2 H100, 1 A100, unless"));
        assert!(md.contains("Fleet: 2 simulated servers (1 H100, 1 A100)."), "{md}");
        assert!(md.contains("| rr | 99.0% | 70.0% | - | - | 13.1 |"), "{md}");
        assert!(md.contains("![SLO attainment against load: mixed](mixed.svg)"));
        assert!(md.contains("| pred | 200 | 20.0 | 99.0% |"), "{md}");
        assert!(!md.contains("another run"), "one run: the header says it all: {md}");
        assert!(md.contains("behind the real Envoy"), "{md}");

        let mut sim = r.clone();
        sim.workloads[0].engine = Some(SIM_ENGINE.into());
        let md = markdown(&sim);
        assert!(md.contains("routed in simulated time"), "{md}");
        assert!(!md.contains("behind the real Envoy"), "a simulated run never claims the real gateway: {md}");
    }

    #[test]
    fn engine_queues_and_the_cpu_outside_the_engines_are_tabled_where_read() {
        let mut w = workload();
        let md = section(&w, &one_run(vec![w.clone()]));
        assert!(!md.contains("waiting in the engines") && !md.contains("outside the engines"), "{md}");
        let q = crate::engines::EngineQueue {
            waiting_mean: 1.3,
            waiting_max: 6.0,
            running_mean: 3.0,
            queued_share: 0.4,
            samples: 60,
        };
        w.runs[1].points[1].1.engine_queue = Some(q);
        let parts = [("vLLM engines", 0.5), ("vLLM API servers", 0.1), ("Envoy", 0.02), ("other", 0.05)];
        w.runs[1].points[1].1.cpu_by_part = Some(parts.iter().map(|(k, v)| (k.to_string(), *v)).collect());
        let md = section(&w, &one_run(vec![w.clone()]));
        assert!(md.contains("| lr | - | 1.3 / 6 (40.0%) | - | - |"), "{md}");
        assert!(md.contains("| lr | - | 17.0% / 50.0% | - | - |"), "{md}");
        assert!(md.contains("| router | Envoy | other | vLLM API servers | vLLM engines |"), "{md}");
        assert!(md.contains("| lr | 2.0% | 5.0% | 10.0% | 50.0% |"), "{md}");
        assert!(md.contains("outside them (the servers' API processes, Envoy, the predictor, the load generator, the rest) at most 17.0% over the 1 measurements (host-bound above 20.0%)"), "{md}");
        w.runs[1].points[1].1.cpu_by_part.as_mut().unwrap().insert("other".into(), 0.3);
        let md = section(&w, &one_run(vec![w.clone()]));
        assert!(md.contains("**outside the engines above 20.0%** in lr at 20 req/s (42.0%)"), "{md}");
    }

    #[test]
    fn later_turns_are_tabled_only_where_there_were_sessions() {
        let mut w = workload();
        assert!(!section(&w, &one_run(vec![w.clone()])).contains("Later turns"), "no sessions, no table");
        w.runs[0].points[0].1.later_turn_ttft_ms = Some([Some(210.0), Some(390.0)]);
        let md = section(&w, &one_run(vec![w.clone()]));
        assert!(md.contains("Later turns' TTFT p50 / p90 ms"), "{md}");
        assert!(md.contains("| rr | 210 / 390 | - |"), "{md}");
    }

    #[test]
    fn points_held_back_by_the_gateway_or_the_host_are_named_and_unread_results_say_nothing() {
        let mut w = workload();
        assert_eq!(conditions(&w), "", "nothing read: nothing claimed");
        for r in &mut w.runs {
            for (_, s) in &mut r.points {
                (s.gateway_overflow, s.host_cpu_busy) = (Some(0), Some(0.5));
            }
        }
        let n = w.runs.iter().map(|r| r.points.len()).sum::<usize>();
        let text = conditions(&w);
        assert!(text.contains(&format!("held back no request in the {n} measurements")), "{text}");
        assert!(text.contains(&format!("at most 50.0% busy over the {n} measurements")), "{text}");
        w.runs[1].repeats = vec![point(30.0, 0.7)];
        (w.runs[1].repeats[0].1.gateway_overflow, w.runs[1].repeats[0].1.host_cpu_busy) = (Some(354), Some(0.97));
        let text = conditions(&w);
        assert!(text.contains("held requests back") && text.contains("lr at 30 req/s (354)"), "{text}");
        assert!(text.contains("above 85.0% busy** in lr at 30 req/s (97.0%)"), "{text}");
        assert!(!text.contains("rr at"), "{text}");
        assert!(!text.contains("Predictor answers"), "no router recorded a fallback share: {text}");
        w.runs[2].points[0].1.fallback = Some(0.0);
        assert!(conditions(&w).contains("in time for at least 99.0% of headroom's requests in the 1 measurements"));
        w.runs[2].points[1].1.fallback = Some(0.12);
        let text = conditions(&w);
        assert!(text.contains("callout timed out") && text.contains("pred at 20 req/s (12.0%)"), "{text}");
    }

    #[test]
    fn tier_precision_pools_the_seeds_and_leaves_out_routers_without_a_tier() {
        let mut w = workload();
        let tier = |placed, met| Some(crate::summary::TierCount { placed, met });
        w.runs[2].points[1].1.positive_tier = tier(100, 90);
        let mut repeat = point(20.0, 0.9);
        repeat.1.positive_tier = tier(50, 30);
        repeat.1.negative_tier = tier(10, 4);
        w.runs[2].repeats = vec![repeat];
        w.runs[2].points[2].1.negative_tier = tier(8, 2);
        let text = section(&w, &one_run(vec![]));
        let after = text.split("Tier precision").nth(1).unwrap_or_default();
        let table = after.split("\n\n").nth(1).unwrap_or_default();
        assert!(
            table.contains("| pred | - | 80.0% (150) / 40.0% (10) | - / 25.0% (8) | - |"),
            "(90 + 30) / 150: {text}"
        );
        assert!(!table.contains("| lr |"), "no tier, no row: {table}");
        assert!(!section(&workload(), &one_run(vec![])).contains("Tier precision"), "no tiers at all, no table");
    }

    #[test]
    fn interactive_and_shed_pool_the_seeds_by_their_requests() {
        let mut w = workload();
        // pred at 20 req/s: interactive 90% of 7 and 60% of 14 requests; sheddable 20% and 50% shed of 3 each.
        let mut repeat = point(20.0, 0.6);
        repeat.1.per_class.insert("interactive".into(), ClassSummary { requests: 14, attainment: 0.6, shed: 0.0 });
        repeat.1.per_class.insert("sheddable".into(), ClassSummary { requests: 3, attainment: 0.3, shed: 0.5 });
        w.runs[2].points[1] = point(20.0, 0.9);
        w.runs[2].repeats = vec![repeat];
        let text = section(&w, &one_run(vec![]));
        let after = text.split("Interactive attainment / sheddable").nth(1).unwrap_or_default();
        let table = after.split("\n\n").nth(1).unwrap_or_default();
        // (0.9 * 7 + 0.6 * 14) / 21 = 70%; (0.2 * 3 + 0.5 * 3) / 6 = 35%.
        assert!(table.contains("| 70.0% / 35.0% |"), "{text}");
        let mut classless = workload();
        for r in &mut classless.runs {
            for (_, p) in &mut r.points {
                p.per_class.clear();
            }
        }
        assert!(!section(&classless, &one_run(vec![])).contains("Interactive attainment /"), "no classes, no table");
    }

    #[test]
    fn merging_replaces_a_workload_of_the_same_name_and_keeps_its_run() {
        let named = |names: &[&str]| -> Vec<WorkloadRun> {
            names.iter().map(|n| WorkloadRun { workload: (*n).into(), ..workload() }).collect()
        };
        let mut first = one_run(named(&["mixed", "azure"]));
        let mut second = one_run(named(&["azure", "shared-prefix"]));
        (second.command, second.time_scale) = ("part 2".into(), 0.5);
        first.merge(second);
        let names: Vec<&str> = first.workloads.iter().map(|w| w.workload.as_str()).collect();
        assert_eq!(names, ["mixed", "azure", "shared-prefix"]);
        assert_eq!(first.workloads[0].command, None, "the header's own workloads are untouched");
        assert_eq!(first.workloads[1].command.as_deref(), Some("part 2"));
        assert_eq!(first.workloads[2].time_scale, Some(0.5));
        let md = markdown(&first);
        assert_eq!(md.matches("Measured by another run than the header's: `part 2`.").count(), 2, "{md}");
        assert_eq!(md.matches("Simulator speed: 0.5x real time").count(), 2, "{md}");
    }

    #[test]
    fn a_workload_measured_the_same_way_in_parts_gains_the_other_parts_routers() {
        let part = |command: &str, runs: Vec<RouterRun>| BenchResults {
            command: command.into(),
            workloads: vec![WorkloadRun { runs, lead_in_s: 20.0, load_held_after: true, ..workload() }],
            ..one_run(vec![])
        };
        let mut first = part(
            "part 1",
            vec![
                run("envoy least request", true, &[(10.0, 0.99), (20.0, 0.8)]),
                run("headroom flow control p90", false, &[(10.0, 0.99), (20.0, 0.85)]),
            ],
        );
        let second = part(
            "part 2",
            vec![
                run("headroom flow control p90", false, &[(10.0, 1.0), (20.0, 0.97), (30.0, 0.7)]),
                run("llm-d prefix + token load", true, &[(10.0, 0.95), (20.0, 0.6)]),
            ],
        );
        let said = first.merge(second.clone());
        assert_eq!(
            said,
            ["mixed: routers added or measured again: headroom flow control p90, llm-d prefix + token load"]
        );
        let mixed = &first.workloads[0];
        let routers: Vec<&str> = mixed.runs.iter().map(|r| r.router.as_str()).collect();
        assert_eq!(routers, ["envoy least request", "llm-d prefix + token load", "headroom flow control p90"]);
        let rates = |r: &RouterRun| r.points.iter().map(|(rate, p)| (*rate, p.attainment)).collect::<Vec<_>>();
        assert_eq!(rates(&mixed.runs[2]), [(10.0, 1.0), (20.0, 0.97), (30.0, 0.7)], "the later part's points");
        assert_eq!(mixed.command.as_deref(), Some("part 1\npart 2"));
        assert!(markdown(&first).contains("Measured in parts, some routers each: `part 1`, then `part 2`."));
        // Merged twice, the command is named once; so is each part of a run itself merged.
        first.merge(second);
        assert_eq!(first.workloads[0].command.as_deref(), Some("part 1\npart 2"));
        first.merge(first.clone());
        assert_eq!(first.workloads[0].command.as_deref(), Some("part 1\npart 2"));
        // A rung added below a router's cliff joins its ladder, with its seeds.
        let mut rung = run("envoy least request", true, &[(5.0, 1.0)]);
        rung.repeats = vec![point(5.0, 0.98)];
        first.merge(part("part 3", vec![rung]));
        let lr = &first.workloads[0].runs[0];
        assert_eq!(rates(lr), [(5.0, 1.0), (10.0, 0.99), (20.0, 0.8)]);
        assert_eq!(lr.repeats.len(), 1);

        // Measured another way (here without the lead-in), the later part replaces the workload whole.
        let other = BenchResults { workloads: vec![workload()], ..one_run(vec![]) };
        assert_eq!(first.merge(other), ["mixed: replaced (measured with another lead-in)"]);
        assert_eq!(first.workloads[0].runs.len(), 3);
        assert_eq!(first.workloads[0].runs[0].router, "rr");
    }

    #[test]
    fn a_workload_run_slower_says_so_and_one_at_the_header_speed_does_not() {
        let slow = WorkloadRun {
            workload: "shared-prefix".into(),
            time_scale: Some(0.5),
            command: Some("make bench".into()),
            ..workload()
        };
        let md = markdown(&one_run(vec![workload(), slow]));
        assert_eq!(md.matches("Simulator speed: 0.5x").count(), 1, "{md}");
        assert!(!md.contains("another run"), "one run: {md}");
        let shared = md.split("## shared-prefix").nth(1).unwrap_or_default();
        assert!(shared.contains("Simulator speed: 0.5x"), "said in its own section: {md}");
        assert!(!md.contains("--lead-in"), "no lead-in, not mentioned: {md}");
        let led = WorkloadRun { lead_in_s: 30.0, ..workload() };
        let md = markdown(&one_run(vec![led]));
        assert!(md.contains("after 30 s of the same traffic that was not counted"), "{md}");
        assert!(!md.contains("went on after the step"), "results from before the load was held after: {md}");
        let held = WorkloadRun { lead_in_s: 30.0, load_held_after: true, ..workload() };
        assert!(markdown(&one_run(vec![held])).contains("went on after the step until its last request had ended"));
    }
}
