//! `prior-check [--scale CLASS=FACTOR]... OBSERVATIONS.jsonl...`
//!
//! How far the analytic prior's TPOT is from what requests measured, on a run's
//! observations: `headroom-bench run` keeps them under `observations/` (one
//! `/v1/observations` entry per line), `headroom-stack accuracy --observations F`
//! writes them too. For each request served by a prediction (streamed, answered 200,
//! more than one token) it rebuilds the feature row from the state the predictor saw
//! at dispatch, with this build's `model::features::row`, and compares three TPOTs with
//! the measured one: the prior without its prefill term (what it was before
//! 2026-11-27), the prior, and the prediction the request was placed on (the trained
//! model, calibrated). Printed as a markdown table: mean absolute percentage error and
//! the median of measured over predicted, overall and by the share of the server's
//! time the prior gives to prefill. docs/predictor.md, "Decodes share the engine with
//! prefills", has a run.
//!
//! `--scale` gives the prior's hardware factors by class id as the observations carry
//! it (the pool's hardware names in order, from 1): the benchmark's fleet is
//! `--scale 1=2` (a100 = 1, h100 = 2; `model.prior_hardware_scale`).

use std::io::BufRead;

use anyhow::Context;
use headroom_predictor::model::features::row;
use headroom_predictor::model::prior::AnalyticPrior;
use headroom_protocol::Observation;

/// Bands of the prefill share the table splits by (upper bounds).
const BANDS: [f64; 5] = [0.2, 0.4, 0.6, 0.8, f64::INFINITY];

fn main() -> anyhow::Result<()> {
    let mut scale = Vec::new();
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--scale" {
            let v = args.next().context("--scale needs CLASS=FACTOR")?;
            let (class, factor) = v.split_once('=').context("--scale needs CLASS=FACTOR")?;
            let (class, factor): (usize, f64) = (class.parse()?, factor.parse()?);
            if scale.len() <= class {
                scale.resize(class + 1, 1.0);
            }
            scale[class] = factor;
        } else {
            files.push(a);
        }
    }
    anyhow::ensure!(!files.is_empty(), "usage: prior-check [--scale CLASS=FACTOR]... OBSERVATIONS.jsonl...");
    let prior = AnalyticPrior { hardware_scale: scale, ..AnalyticPrior::default() };
    let without = AnalyticPrior { max_prefill_share: 0.0, ..prior.clone() };

    // (prefill share, measured, [without the term, prior, served])
    let mut points: Vec<(f64, f64, [f64; 3])> = Vec::new();
    for file in &files {
        let reader = std::io::BufReader::new(std::fs::File::open(file).with_context(|| file.clone())?);
        for line in reader.lines() {
            let line = line?;
            let value: serde_json::Value = match serde_json::from_str(&line) {
                Ok(v) => v,
                Err(_) => continue,
            };
            // The accuracy run's dump wraps each one: {"phase": ..., "observation": {...}}.
            let value = if value.get("observation").is_some() { value["observation"].clone() } else { value };
            let Ok(o) = serde_json::from_value::<Observation>(value) else { continue };
            let (Some(state), Some(measured), Some(served)) = (&o.state_at_dispatch, o.tpot_ms, o.predicted_tpot_ms)
            else {
                continue;
            };
            if o.status != 200 || !o.request.streaming || o.output_tokens.unwrap_or(0) < 2 || measured <= 0.0 {
                continue;
            }
            let r = row(&o.request, state, &prior);
            let share = prior.prefill_share(&r);
            points.push((share, measured, [without.predict(&r).1, prior.predict(&r).1, served]));
        }
    }
    anyhow::ensure!(!points.is_empty(), "no observation with a measured TPOT and its state at dispatch");

    println!("TPOT of {} requests: MAPE / median of measured over predicted\n", points.len());
    // (lower, upper) of each band.
    let bands: Vec<(f64, f64)> = std::iter::once(0.0).chain(BANDS).zip(BANDS).collect();
    let in_band = |&(lower, upper): &(f64, f64)| move |p: &&(f64, f64, [f64; 3])| p.0 >= lower && p.0 < upper;
    let mut header = "| prediction | all |".to_string();
    for band @ (lower, upper) in &bands {
        let n = points.iter().filter(in_band(band)).count();
        header += &if upper.is_finite() {
            format!(" prefill {lower:.1}-{upper:.1} ({n}) |")
        } else {
            format!(" prefill >= {lower:.1} ({n}) |")
        };
    }
    println!("{header}\n|---|---|{}", "---|".repeat(bands.len()));
    for (k, name) in ["prior without the prefill term", "prior", "served (trained model)"].iter().enumerate() {
        let mut line = format!("| {name} | {} |", cell(points.iter().map(|p| (p.1, p.2[k]))));
        for band in &bands {
            line += &format!(" {} |", cell(points.iter().filter(in_band(band)).map(|p| (p.1, p.2[k]))));
        }
        println!("{line}");
    }
    Ok(())
}

/// "MAPE / median ratio" of (measured, predicted) pairs.
fn cell(pairs: impl Iterator<Item = (f64, f64)>) -> String {
    let pairs: Vec<(f64, f64)> = pairs.filter(|(_, p)| *p > 0.0).collect();
    if pairs.is_empty() {
        return "-".into();
    }
    let mape = pairs.iter().map(|(m, p)| (p - m).abs() / m).sum::<f64>() / pairs.len() as f64;
    let mut ratios: Vec<f64> = pairs.iter().map(|(m, p)| m / p).collect();
    ratios.sort_by(f64::total_cmp);
    format!("{:.1}% / {:.2}", 100.0 * mape, ratios[ratios.len() / 2])
}
