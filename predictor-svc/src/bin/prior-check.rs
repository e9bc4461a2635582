//! `prior-check [--scale CLASS=FACTOR]... OBSERVATIONS.jsonl...`
//!
//! How far the analytic prior's TPOT is from what requests measured, on a run's
//! observations: `headroom-bench run` keeps them under `observations/` (one
//! `/v1/observations` entry per line), `headroom-stack accuracy --observations F`
//! writes them too. For each request served by a prediction (streamed, answered 200,
//! more than one token) it rebuilds the feature row from the state the predictor saw
//! at dispatch, with this build's `model::features::row`, and compares three TPOTs with
//! the measured one: the prior without its prefill term (what it was before
//! decodes shared the engine with prefills), the prior, and the prediction the request was placed on (the trained
//! model, calibrated). Printed as a markdown table: mean absolute percentage error, the
//! median of measured over predicted and the share of requests that took no longer than
//! predicted (coverage, what a p90 objective holds at 90%), overall, by the share of the
//! server's time the prior gives to prefill and by hardware class. docs/predictor.md,
//! "Decodes share the engine with prefills", has a run.
//!
//! A second table, per hardware class, scores the served TPOT and the prior's (times
//! the factor that puts it at the class's 90th percentile, where a live correction of a
//! p90 objective would take it) with the p90 pinball loss two ways: of the relative
//! error (what judged models before `training::loss`) and of the log ratio (`training::loss`),
//! with the share of requests each would have let through on their TPOT goal that then
//! missed it. docs/notebook/predictor.md, "A proper loss, judged per hardware class", has a run.
//!
//! `--scale` gives the prior's hardware factors by class id as the observations carry
//! it (the pool's hardware names in order, from 1): the benchmark's fleet is
//! `--scale 1=2` (a100 = 1, h100 = 2; `model.prior_hardware_scale`).

use headroom_predictor_core::model::features::row;
use headroom_predictor_core::model::gbdt::Objective;
use headroom_predictor_core::model::prior::AnalyticPrior;
use headroom_predictor_core::model::replay;
use headroom_predictor_core::model::training;

/// Bands of the prefill share the table splits by (upper bounds).
const BANDS: [f64; 5] = [0.2, 0.4, 0.6, 0.8, f64::INFINITY];

const USAGE: &str = "usage: prior-check [--scale CLASS=FACTOR]... OBSERVATIONS.jsonl...";

/// One request: its prefill share by the prior, hardware class, measured TPOT and the
/// three predictions (without the prefill term, the prior, as served).
struct Point {
    share: f64,
    class: u32,
    measured: f64,
    predicted: [f64; 3],
    /// The request's TPOT goal, if it had one.
    slo: Option<f64>,
}

/// Which points a column of the table takes.
type Keep = Box<dyn Fn(&Point) -> bool>;

fn main() -> anyhow::Result<()> {
    let mut scale = Vec::new();
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "-h" || a == "--help" {
            println!("{USAGE}");
            return Ok(());
        } else if a == "--scale" {
            replay::hardware_scale(&args.next().unwrap_or_default(), &mut scale)?;
        } else if a.starts_with('-') {
            anyhow::bail!("unknown option {a}; {USAGE}");
        } else {
            files.push(a);
        }
    }
    anyhow::ensure!(!files.is_empty(), "{USAGE}");
    let prior = AnalyticPrior { hardware_scale: scale, ..AnalyticPrior::default() };
    let without = AnalyticPrior { max_prefill_share: 0.0, ..prior.clone() };

    let mut points: Vec<Point> = Vec::new();
    for recorded in replay::read(&files)? {
        let o = recorded.observation;
        let (Some(state), Some(measured), Some(served)) = (&o.state_at_dispatch, o.report.tpot_ms, o.predicted_tpot_ms)
        else {
            continue;
        };
        if o.report.status != 200 || !o.request.streaming || o.report.output_tokens.unwrap_or(0) < 2 || measured <= 0.0
        {
            continue;
        }
        let r = row(&o.request, state, &prior);
        let share = prior.prefill_share(&r);
        let predicted = [without.predict(&r).1, prior.predict(&r).1, served];
        let slo = o.request.slo.tpot_ms;
        points.push(Point { share, class: state.hardware_class, measured, predicted, slo });
    }
    anyhow::ensure!(!points.is_empty(), "no observation with a measured TPOT and its state at dispatch");

    println!(
        "TPOT of {} requests: MAPE / median of measured over predicted / share measured within predicted\n",
        points.len()
    );
    // The columns after "all": each band of the prefill share, then each hardware class.
    let mut columns: Vec<(String, Keep)> = Vec::new();
    for (lower, upper) in std::iter::once(0.0).chain(BANDS).zip(BANDS) {
        let name =
            if upper.is_finite() { format!("prefill {lower:.1}-{upper:.1}") } else { format!("prefill >= {lower:.1}") };
        columns.push((name, Box::new(move |p: &Point| p.share >= lower && p.share < upper)));
    }
    let mut classes: Vec<u32> = points.iter().map(|p| p.class).collect();
    classes.sort_unstable();
    classes.dedup();
    for class in classes {
        columns.push((format!("class {class}"), Box::new(move |p: &Point| p.class == class)));
    }
    let mut header = "| prediction | all |".to_string();
    for (name, keep) in &columns {
        header += &format!(" {name} ({}) |", points.iter().filter(|p| keep(p)).count());
    }
    println!("{header}\n|---|---|{}", "---|".repeat(columns.len()));
    for (k, name) in ["prior without the prefill term", "prior", "served (as placed)"].iter().enumerate() {
        let pair = |p: &Point| (p.measured, p.predicted[k]);
        let mut line = format!("| {name} | {} |", cell(points.iter().map(pair)));
        for (_, keep) in &columns {
            line += &format!(" {} |", cell(points.iter().filter(|p| keep(p)).map(pair)));
        }
        println!("{line}");
    }
    println!("{}", losses(&points));
    Ok(())
}

/// The per-class table of p90 losses (module docs).
fn losses(points: &[Point]) -> String {
    const P90: Objective = Objective::Quantile { q: 0.9 };
    // The pinball loss of the relative error, as models were judged before `training::loss`.
    let relative = |predicted: f64, measured: f64| {
        let r = (measured - predicted) / measured;
        if r > 0.0 {
            0.9 * r
        } else {
            -0.1 * r
        }
    };
    let mut out = String::from(
        "\nTPOT p90 losses by hardware class: pinball of the relative error / of the log ratio / requests let through \
         on their TPOT goal that missed it\n\n| class | requests | served | prior x its p90 factor |\n|---|---:|---|---|\n",
    );
    let mut classes: Vec<u32> = points.iter().map(|p| p.class).collect();
    classes.sort_unstable();
    classes.dedup();
    for class in classes {
        let of: Vec<&Point> = points.iter().filter(|p| p.class == class && p.predicted[1] > 0.0).collect();
        let mut ratios: Vec<f64> = of.iter().map(|p| p.measured / p.predicted[1]).collect();
        ratios.sort_by(f64::total_cmp);
        let Some(&factor) = ratios.get((ratios.len() * 9 / 10).min(ratios.len().saturating_sub(1))) else { continue };
        let scores = |predicted: &dyn Fn(&Point) -> f64| {
            let n = of.len() as f64;
            let mean = |f: &dyn Fn(&Point) -> f64| of.iter().map(|p| f(p)).sum::<f64>() / n;
            let missed = |p: &Point| p.slo.is_some_and(|slo| predicted(p) <= slo && p.measured > slo);
            format!(
                "{:.3} / {:.3} / {:.1}%",
                mean(&|p| relative(predicted(p), p.measured)),
                mean(&|p| training::loss(P90, predicted(p), p.measured)),
                100.0 * of.iter().filter(|p| missed(p)).count() as f64 / n
            )
        };
        out += &format!(
            "| {class} | {} | {} | {} (x{factor:.2}) |\n",
            of.len(),
            scores(&|p| p.predicted[2]),
            scores(&|p| p.predicted[1] * factor)
        );
    }
    out
}

/// "MAPE / median ratio / coverage" of (measured, predicted) pairs.
fn cell(pairs: impl Iterator<Item = (f64, f64)>) -> String {
    let pairs: Vec<(f64, f64)> = pairs.filter(|(_, p)| *p > 0.0).collect();
    if pairs.is_empty() {
        return "-".into();
    }
    let mape = pairs.iter().map(|(m, p)| (p - m).abs() / m).sum::<f64>() / pairs.len() as f64;
    let mut ratios: Vec<f64> = pairs.iter().map(|(m, p)| m / p).collect();
    ratios.sort_by(f64::total_cmp);
    let covered = pairs.iter().filter(|(m, p)| m <= p).count() as f64 / pairs.len() as f64;
    format!("{:.1}% / {:.2} / {:.0}%", 100.0 * mape, ratios[ratios.len() / 2], 100.0 * covered)
}
