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

/// A plain-text table: requests per endpoint, then per SLO class.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let mut per_endpoint: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes {
        let key = match (&o.served_by, o.status) {
            (Some(s), _) => s.clone(),
            (None, 429) => "(shed: 429)".into(),
            (None, _) => "(no response)".into(),
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
    let mut classes: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes {
        classes.entry(o.class.as_str()).or_default().push(o);
    }
    let all: Vec<&Outcome> = outcomes.iter().collect();
    let mut rows: Vec<(&str, Vec<&Outcome>)> = classes.into_iter().collect();
    rows.push(("all", all));
    for (name, list) in rows {
        let ttft: Vec<f64> = list.iter().filter(|o| o.stream && o.status == 200).filter_map(|o| o.ttft_ms).collect();
        let tpot: Vec<f64> = list.iter().filter(|o| o.status == 200).filter_map(|o| o.tpot_ms).collect();
        let ok = list.iter().filter(|o| o.status == 200).count();
        let shed = list.iter().filter(|o| o.shed()).count();
        let met = list.iter().filter(|o| o.met_slo()).count();
        let tiered = list.iter().filter(|o| o.tier.is_some()).count();
        let positive_tier = RouteSource::PredictedPositive.tier();
        let positive = list.iter().filter(|o| o.tier.as_deref() == Some(positive_tier)).count();
        let positive =
            if tiered == 0 { "-".to_string() } else { format!("{:.0}%", 100.0 * positive as f64 / tiered as f64) };
        let attain = if list.is_empty() { 0.0 } else { 100.0 * met as f64 / list.len() as f64 };
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
