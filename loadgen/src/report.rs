//! Summaries of a run: per-endpoint load and per-class latency and SLO attainment.

use std::collections::BTreeMap;
use std::fmt::Write;

use headroom_protocol::RouteSource;

use crate::runner::Outcome;

pub use headroom_protocol::stats::quantile;

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.0}"))
}

fn ms1(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

/// The outcomes of each SLO class, by class name, then all of them as "all".
fn by_class(outcomes: &[Outcome]) -> Vec<(&str, Vec<&Outcome>)> {
    let mut classes: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes {
        classes.entry(o.class.as_str()).or_default().push(o);
    }
    let mut rows: Vec<(&str, Vec<&Outcome>)> = classes.into_iter().collect();
    rows.push(("all", outcomes.iter().collect()));
    rows
}

/// Share of `list` that met its SLOs (shed and failed requests are misses).
fn attainment(list: &[&Outcome]) -> f64 {
    if list.is_empty() {
        0.0
    } else {
        list.iter().filter(|o| o.met_slo()).count() as f64 / list.len() as f64
    }
}

/// SLO attainment per class, as `(class, share)` in [`by_class`] order (the demo's chart).
pub fn attainment_by_class(outcomes: &[Outcome]) -> Vec<(String, f64)> {
    by_class(outcomes).into_iter().map(|(name, list)| (name.to_string(), attainment(&list))).collect()
}

/// Two routers on the same requests, side by side per SLO class: attainment of each and
/// the difference (second minus first, in points), TTFT p90 and shed share of each.
pub fn compare(first: (&str, &[Outcome]), second: (&str, &[Outcome])) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A = {}, B = {}", first.0, second.0);
    let _ = writeln!(
        out,
        "{:<12} {:>6} {:>10} {:>10} {:>9} {:>12} {:>12} {:>7} {:>7}",
        "class", "n", "attain A", "attain B", "B - A", "TTFT p90 A", "TTFT p90 B", "shed A", "shed B"
    );
    let b_classes = by_class(second.1);
    for (name, a) in by_class(first.1) {
        let b = b_classes.iter().find(|(n, _)| *n == name).map(|(_, l)| l.as_slice()).unwrap_or_default();
        let ttft_p90 = |list: &[&Outcome]| {
            let v: Vec<f64> = list.iter().filter(|o| o.stream && o.status == 200).filter_map(|o| o.ttft_ms).collect();
            ms(quantile(&v, 0.9))
        };
        let shed = |list: &[&Outcome]| {
            let n = list.iter().filter(|o| o.shed()).count();
            format!("{:.0}%", if list.is_empty() { 0.0 } else { 100.0 * n as f64 / list.len() as f64 })
        };
        let (att_a, att_b) = (attainment(&a), attainment(b));
        let _ = writeln!(
            out,
            "{:<12} {:>6} {:>9.1}% {:>9.1}% {:>+8.1} {:>12} {:>12} {:>7} {:>7}",
            name,
            a.len(),
            100.0 * att_a,
            100.0 * att_b,
            100.0 * (att_b - att_a),
            ttft_p90(&a),
            ttft_p90(b),
            shed(&a),
            shed(b)
        );
    }
    out
}

/// A plain-text table: requests per endpoint, then per SLO class. The endpoint is the
/// `x-served-by` (the simulator's own, or the local stack's Envoy's), else the filter's choice
/// (debug headers); a response that says neither is "(not said)".
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let mut per_endpoint: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes {
        let key = match (o.served_by.as_ref().or(o.chosen.as_ref()), o.status) {
            (Some(s), _) => s.clone(),
            (None, 429) => "(shed: 429)".into(),
            (None, 0) => "(no response)".into(),
            (None, _) => "(not said)".into(),
        };
        *per_endpoint.entry(key).or_default() += 1;
    }
    let _ = writeln!(out, "{:<22} {:>8}", "endpoint", "requests");
    for (e, n) in &per_endpoint {
        let _ = writeln!(out, "{e:<22} {n:>8}");
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<12} {:>6} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
        "class", "n", "ok", "shed", "positive", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90", "SLO attain"
    );
    for (name, list) in by_class(outcomes) {
        let ttft: Vec<f64> = list.iter().filter(|o| o.stream && o.status == 200).filter_map(|o| o.ttft_ms).collect();
        let tpot: Vec<f64> = list.iter().filter(|o| o.status == 200).filter_map(|o| o.tpot_ms).collect();
        let ok = list.iter().filter(|o| o.status == 200).count();
        let shed = list.iter().filter(|o| o.shed()).count();
        let tiered = list.iter().filter(|o| o.tier.is_some()).count();
        let positive_tier = RouteSource::PredictedPositive.tier();
        let positive = list.iter().filter(|o| o.tier.as_deref() == Some(positive_tier)).count();
        let positive =
            if tiered == 0 { "-".to_string() } else { format!("{:.0}%", 100.0 * positive as f64 / tiered as f64) };
        let attain = 100.0 * attainment(&list);
        let _ = writeln!(
            out,
            "{:<12} {:>6} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10.1}%",
            name,
            list.len(),
            ok,
            shed,
            positive,
            ms(quantile(&ttft, 0.5)),
            ms(quantile(&ttft, 0.9)),
            ms1(quantile(&tpot, 0.5)),
            ms1(quantile(&tpot, 0.9)),
            attain
        );
    }
    let _ =
        writeln!(out, "\npositive: share of routed requests the filter placed where every SLO was predicted to hold");
    let _ = writeln!(
        out,
        "(x-headroom-tier). TTFT/TPOT in ms, streaming requests, as the client measured them. SLO attainment counts"
    );
    let _ = writeln!(
        out,
        "shed and failed requests as misses; non-streaming ones must finish by ttft_slo + tpot_slo x max_tokens."
    );
    out
}
