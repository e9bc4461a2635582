//! What a router's measurements say of its capacity: the highest rate at which it keeps
//! [`TARGET`] attainment, per seed and over the seeds, the noise band the seeds span, and the
//! ratios between the best headroom router and the best baseline that a verdict states.

use crate::results::{Ratios, RouterRun, WorkloadRun};
use crate::summary::{capacity, Capacity, Summary, TARGET};

/// What a curve plots of each measurement: overall attainment, or the critical classes'.
pub(crate) type Pick = fn(&Summary) -> Option<f64>;

pub(crate) fn overall(s: &Summary) -> Option<f64> {
    Some(s.attainment)
}

pub(crate) fn critical(s: &Summary) -> Option<f64> {
    s.critical_attainment
}

/// Every measurement of each rate the ladder ran: the ladder's first, then the repeats'.
pub(crate) fn measurements(run: &RouterRun) -> Vec<(f64, Vec<&Summary>)> {
    run.points
        .iter()
        .map(|(rate, s)| {
            let repeats = run.repeats.iter().filter(|(r, _)| r == rate).map(|(_, s)| s);
            (*rate, std::iter::once(s).chain(repeats).collect())
        })
        .collect()
}

/// `(offered rps, value)` per rate, each the mean of that rate's measurements.
/// `None` when a measurement lacks the value (older results).
pub(crate) fn mean_curve(run: &RouterRun, pick: Pick) -> Option<Vec<(f64, f64)>> {
    measurements(run)
        .iter()
        .map(|(_, ms)| {
            let n = ms.len() as f64;
            let value: f64 = ms.iter().map(|s| pick(s)).sum::<Option<f64>>()? / n;
            Some((ms.iter().map(|s| s.offered_rps).sum::<f64>() / n, value))
        })
        .collect()
}

/// One curve per seed: the ladder's, then for each repeat k the ladder's with the k-th
/// repeat in place of the ladder's point where there is one.
fn seed_curves(run: &RouterRun, pick: Pick) -> Option<Vec<Vec<(f64, f64)>>> {
    let per_rate = measurements(run);
    let seeds = per_rate.iter().map(|(_, ms)| ms.len()).max().unwrap_or(1);
    (0..seeds)
        .map(|k| {
            per_rate
                .iter()
                .map(|(_, ms)| ms.get(k).or(ms.first()).and_then(|s| Some((s.offered_rps, pick(s)?))))
                .collect()
        })
        .collect()
}

/// The capacity of each seed's curve; `None` without repeats.
pub(crate) fn seed_capacities(run: &RouterRun, pick: Pick) -> Option<Vec<Capacity>> {
    let curves = seed_curves(run, pick)?;
    (curves.len() >= 2).then(|| curves.iter().filter_map(|c| capacity(c, TARGET)).collect())
}

/// The lowest and highest of the seeds' capacities: the noise band. An end is open when any
/// seed's capacity is open that way, wherever its bound falls among the others: a seed still
/// over the threshold at its last rate (offered at 52.9 req/s) may cross far above another's
/// crossing at 52.9 (long-short, where seeds offer a rung's rate 10% apart), so
/// the band then reads "52.8-≥ 52.9", not "52.8-52.9". `None` without repeats.
pub(crate) fn seed_band(run: &RouterRun, pick: Pick) -> Option<(Capacity, Capacity)> {
    let caps = seed_capacities(run, pick)?;
    let lo = caps.iter().copied().min_by(|a, b| a.rps().total_cmp(&b.rps()))?;
    let hi = caps.iter().copied().max_by(|a, b| a.rps().total_cmp(&b.rps()))?;
    let lo = if caps.iter().any(|c| matches!(c, Capacity::Below(_))) { Capacity::Below(lo.rps()) } else { lo };
    let hi = if caps.iter().any(|c| matches!(c, Capacity::AtLeast(_))) { Capacity::AtLeast(hi.rps()) } else { hi };
    Some((lo, hi))
}

/// The noise band in req/s: the lowest and highest of the seeds' capacities.
pub fn capacity_band(run: &RouterRun, pick: Pick) -> Option<(f64, f64)> {
    seed_band(run, pick).map(|(lo, hi)| (lo.rps(), hi.rps()))
}

/// A router's capacity by `pick`: with repeats whose curves all cross, the mean of their
/// crossings (inside the band by construction); otherwise the crossing of the mean curve
/// (which also says when the ladder never crossed, or crossed before its first rate).
pub(crate) fn capacity_by(run: &RouterRun, pick: Pick) -> Option<Capacity> {
    if let Some(caps) = seed_capacities(run, pick) {
        if !caps.is_empty() && caps.iter().all(|c| matches!(c, Capacity::At(_))) {
            return Some(Capacity::At(caps.iter().map(|c| c.rps()).sum::<f64>() / caps.len() as f64));
        }
    }
    capacity(&mean_curve(run, pick)?, TARGET)
}

/// Two routers' capacities are a tie when their noise bands overlap. `None` unless both
/// have one.
pub(crate) fn within_noise(a: &RouterRun, b: &RouterRun, pick: Pick) -> Option<bool> {
    let ((alo, ahi), (blo, bhi)) = (capacity_band(a, pick)?, capacity_band(b, pick)?);
    Some(alo <= bhi && blo <= ahi)
}

/// A router's capacity at [`TARGET`] over its seeds (`Below(0)` for a router with no points).
pub fn router_capacity(run: &RouterRun) -> Capacity {
    capacity_by(run, overall).unwrap_or(Capacity::Below(0.0))
}

/// A router's critical capacity: the highest rate at which the non-sheddable classes
/// together keep [`TARGET`] attainment. `None` when a point lacks the figure (older results).
pub fn router_critical_capacity(run: &RouterRun) -> Option<Capacity> {
    capacity_by(run, critical)
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
    let best = best_critical(false).zip(best_critical(true));
    Some(Ratios {
        best_headroom: p.router.clone(),
        best_baseline: b.router.clone(),
        capacity_ratio: ratio(router_capacity(p).rps(), router_capacity(b).rps()),
        best_headroom_critical: best.map(|((p, _), _)| p.router.clone()),
        best_baseline_critical: best.map(|(_, (b, _))| b.router.clone()),
        critical_capacity_ratio: best.map(|((_, cp), (_, cb))| ratio(cp.rps(), cb.rps())),
        capacity_within_noise: within_noise(p, b, overall),
        critical_within_noise: best.and_then(|((p, _), (b, _))| within_noise(p, b, critical)),
    })
}

/// The baseline (or predicted) router with the highest capacity (ties: the last listed).
pub(crate) fn best_by_capacity(w: &WorkloadRun, baseline: bool) -> Option<&RouterRun> {
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

pub(crate) fn at_rate(run: &RouterRun, rate: f64) -> Option<&Summary> {
    run.points.iter().find(|(r, _)| (*r - rate).abs() < 1e-9).map(|(_, s)| s)
}

/// `(offered rps, lowest, highest)` of `pick` per rate over that rate's measurements (the
/// seeds' spread; one measurement gives a band of no width).
pub(crate) fn seed_spread(run: &RouterRun, pick: Pick) -> Vec<(f64, f64, f64)> {
    measurements(run)
        .iter()
        .filter_map(|(_, ms)| {
            let values: Vec<f64> = ms.iter().filter_map(|s| pick(s)).collect();
            let lo = values.iter().copied().reduce(f64::min)?;
            let hi = values.iter().copied().reduce(f64::max)?;
            Some((ms.iter().map(|s| s.offered_rps).sum::<f64>() / ms.len() as f64, lo, hi))
        })
        .collect()
}
