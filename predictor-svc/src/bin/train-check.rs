//! `train-check [--scale CLASS=FACTOR]... [--variant NAME:KEY=V,...]... OBSERVATIONS.jsonl...`
//!
//! Online training replayed offline, so that a change to the samples or the trees
//! is judged on one recorded run in seconds instead of a live accuracy run per try
//! (whose figures move by 2-4 points between runs of the same build). The
//! observations are read in the order they were reported (`headroom-stack accuracy
//! --observations F` writes them with their phase); each one that the live store
//! would learn from is first predicted by the model active at that moment (the
//! raw model: no live correction, no contest, no drift handling), then filed as a
//! sample with the sampler the service uses; every `min_new_samples` new training
//! samples a round fits, is scored on the holdout against the active model and
//! replaces it unless worse by `keep_margin`, as `store::ModelStore::train` does.
//!
//! Printed per variant, as markdown: the error of those predictions per phase (a
//! phase of the accuracy run, else one file: the benchmark writes one per router and
//! rate): MAPE, the first variant's objective's loss (`training::loss`: MAPE, or the
//! pinball loss of the log ratio for p90), the share of requests within their
//! prediction, and the MAPE over its last 500 (what `headroom_live_mape` reads) as it
//! is and at the constant factor that would minimise it,
//! the held-out MAPE of the model active at the end of the first phase, and the
//! samples it trained on. A variant is the service's defaults with some keys
//! changed: `bucket_cap`, `trees`, `depth`, `lr`, `leaf` (least samples in a
//! leaf), `lambda`, `min_new` (samples between rounds), `residual` (0 or 1),
//! `objective` (`mean` or `p90`). With no `--variant` the defaults alone run.
//! The holdout split uses one fixed key, so every variant holds out the same requests.

use anyhow::Context;
use headroom_predictor::config::ModelConfig;
use headroom_predictor_core::model::features::row;
use headroom_predictor_core::model::gbdt::Params;
use headroom_predictor_core::model::prior::AnalyticPrior;
use headroom_predictor_core::model::replay::{self, Recorded};
use headroom_predictor_core::model::sampler::{self, Sample, Samples};
use headroom_predictor_core::model::training::{self, Fitted};

const USAGE: &str = "usage: train-check [--scale CLASS=FACTOR]... [--variant NAME:KEY=V,...]... OBSERVATIONS.jsonl...";

/// Observations at the end of a phase that `headroom_live_mape` reads.
const LIVE_WINDOW: usize = 500;

/// One way to train.
struct Variant {
    name: String,
    config: ModelConfig,
    params: Params,
}

impl Variant {
    fn parse(spec: &str) -> anyhow::Result<Variant> {
        let (name, keys) = spec.split_once(':').unwrap_or((spec, ""));
        let mut v = Variant::default_named(name);
        for kv in keys.split(',').filter(|s| !s.is_empty()) {
            let (k, val) = kv.split_once('=').with_context(|| format!("--variant {spec}: {kv} is not KEY=V"))?;
            let num = || val.parse::<f64>().with_context(|| format!("--variant {spec}: {k} takes a number"));
            match k {
                "bucket_cap" => v.config.bucket_cap = num()? as usize,
                "trees" => v.params.trees = num()? as usize,
                "depth" => v.params.max_depth = num()? as usize,
                "lr" => v.params.learning_rate = num()?,
                "leaf" => v.params.min_samples_leaf = num()? as usize,
                "lambda" => v.params.lambda = num()?,
                "min_new" => v.config.min_new_samples = num()? as usize,
                "residual" => v.config.residual = num()? != 0.0,
                "objective" => {
                    v.config.objective = val.to_string();
                    v.params.objective = v.config.objective();
                }
                _ => anyhow::bail!("--variant {spec}: unknown key {k}"),
            }
        }
        Ok(v)
    }

    fn default_named(name: &str) -> Variant {
        let config = ModelConfig::default();
        Variant { name: name.to_string(), params: training::params(&config), config }
    }
}

/// (predicted, measured) per target: TTFT, TPOT.
type Pairs = [Vec<(f64, f64)>; 2];

/// What one variant's replay measured.
#[derive(Default)]
struct Outcome {
    /// Per phase, in order of first appearance: (predicted, measured) per target.
    errors: Vec<(String, Pairs)>,
    /// Held-out MAPE (TTFT, TPOT) of the model active when the first phase ended.
    holdout_at_first_end: [Option<f64>; 2],
    /// Training samples (TTFT) of that model.
    trained_on: usize,
    rounds: usize,
    activated: usize,
}

fn main() -> anyhow::Result<()> {
    let mut scale = Vec::new();
    let mut files = Vec::new();
    let mut variants = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "--scale" => replay::hardware_scale(&args.next().unwrap_or_default(), &mut scale)?,
            "--variant" => variants.push(Variant::parse(&args.next().context("--variant needs NAME:KEY=V,...")?)?),
            _ if a.starts_with('-') => anyhow::bail!("unknown option {a}; {USAGE}"),
            _ => files.push(a),
        }
    }
    anyhow::ensure!(!files.is_empty(), "{USAGE}");
    if variants.is_empty() {
        variants.push(Variant::default_named("defaults"));
    }
    let prior = AnalyticPrior { hardware_scale: scale, ..AnalyticPrior::default() };
    let recorded = replay::read(&files)?;
    let learnable: Vec<Learnable> = recorded.iter().filter_map(|r| learnable(r, &prior)).collect();
    anyhow::ensure!(!learnable.is_empty(), "no observation the store would learn from");
    println!("{} observations, {} the store learns from\n", recorded.len(), learnable.len());

    let mut outcomes: Vec<(&Variant, Outcome)> = variants.iter().map(|v| (v, replay_one(v, &learnable))).collect();
    let live = Variant::default_named("as served live");
    outcomes.insert(0, (&live, as_served(&learnable)));
    let phases: Vec<String> = outcomes[0].1.errors.iter().map(|(p, _)| p.clone()).collect();
    let mut header = "| variant | rounds / activated | trained on (TTFT) | holdout TTFT / TPOT |".to_string();
    for p in &phases {
        header +=
            &format!(" {p}: MAPE TTFT / TPOT | loss | coverage | last {LIVE_WINDOW}: MAPE | at the best factor |");
    }
    println!("{header}\n|---|---|---|---|{}", "---|---|---|---|---|".repeat(phases.len()));
    for (v, o) in &outcomes {
        let mut line = format!(
            "| {} | {} / {} | {} | {} / {} |",
            v.name,
            o.rounds,
            o.activated,
            o.trained_on,
            pct(o.holdout_at_first_end[0]),
            pct(o.holdout_at_first_end[1])
        );
        let objective = variants.first().map_or(v.config.objective(), |first| first.config.objective());
        for (_, e) in &o.errors {
            let last = |k: usize| &e[k][e[k].len().saturating_sub(LIVE_WINDOW)..];
            let best = |k: usize| match best_factor(last(k)) {
                Some((f, m)) => format!("{} (x{f:.2})", pct(Some(m))),
                None => "-".into(),
            };
            let loss = |k: usize| mean_of(&e[k], |p, a| training::loss(objective, p, a));
            let coverage = |k: usize| mean_of(&e[k], |p, a| if p >= a { 1.0 } else { 0.0 });
            line += &format!(
                " {} / {} | {} / {} | {} / {} | {} / {} | {} / {} |",
                pct(mape(&e[0], 1.0)),
                pct(mape(&e[1], 1.0)),
                num(loss(0)),
                num(loss(1)),
                pct(coverage(0)),
                pct(coverage(1)),
                pct(mape(last(0), 1.0)),
                pct(mape(last(1), 1.0)),
                best(0),
                best(1)
            );
        }
        println!("{line}");
    }
    Ok(())
}

/// An observation the live store learns from.
struct Learnable {
    phase: String,
    request_id: String,
    sample: Sample,
    /// What was served at dispatch (TTFT, TPOT): the live store's model, corrected.
    served: [Option<f64>; 2],
}

/// The sample the live store would file for `r` (`ModelStore::observe_at`).
fn learnable(r: &Recorded, prior: &AnalyticPrior) -> Option<Learnable> {
    let o = &r.observation;
    let (state, ttft, tpot) = sampler::learnable(o)?;
    let sample = Sample { row: row(&o.request, state, prior), ttft_ms: ttft, tpot_ms: tpot };
    Some(Learnable {
        phase: r.phase.clone(),
        request_id: o.report.request_id.clone(),
        sample,
        served: [o.predicted_ttft_ms, o.predicted_tpot_ms],
    })
}

/// The errors of what the live run served, phase by phase.
fn as_served(learnable: &[Learnable]) -> Outcome {
    let mut out = Outcome::default();
    for l in learnable {
        if out.errors.last().is_none_or(|(p, _)| *p != l.phase) {
            out.errors.push((l.phase.clone(), [Vec::new(), Vec::new()]));
        }
        let errors = &mut out.errors.last_mut().unwrap_or_else(|| unreachable!()).1;
        for (k, truth) in [l.sample.ttft_ms, l.sample.tpot_ms].into_iter().enumerate() {
            if let (Some(p), Some(a)) = (l.served[k], truth) {
                errors[k].push((p, a));
            }
        }
    }
    out
}

fn replay_one(v: &Variant, learnable: &[Learnable]) -> Outcome {
    let mut samples = Samples::keyed(v.config.bucket_cap, v.config.holdout_percent, 0x5eed);
    let mut active: Option<(Fitted, f64)> = None;
    let mut out = Outcome::default();
    let first_phase = learnable[0].phase.clone();
    for Learnable { phase, request_id: id, sample, .. } in learnable {
        if out.errors.last().is_none_or(|(p, _)| p != phase) {
            if out.errors.last().is_some_and(|(p, _)| *p == first_phase) {
                out.holdout_at_first_end = holdout_mape(&samples, active.as_ref().map(|a| &a.0));
                out.trained_on = active.as_ref().map_or(0, |a| a.0.train_samples_ttft);
            }
            out.errors.push((phase.clone(), [Vec::new(), Vec::new()]));
        }
        if let Some((model, _)) = &active {
            let (t, p) = model.predict(&sample.row);
            let errors = &mut out.errors.last_mut().unwrap_or_else(|| unreachable!()).1;
            for (k, (pred, truth)) in [(t, sample.ttft_ms), (p, sample.tpot_ms)].into_iter().enumerate() {
                if let Some(truth) = truth {
                    errors[k].push((pred, truth));
                }
            }
        }
        samples.push(id, sample.clone());
        if samples.new_since_training < v.config.min_new_samples {
            continue;
        }
        let train: Vec<Sample> = samples.train.samples().cloned().collect();
        let Some(fitted) = training::fit_with(&train, &v.params, v.config.residual, v.config.min_samples) else {
            continue;
        };
        samples.trained_on(samples.new_since_training);
        out.rounds += 1;
        let holdout: Vec<Sample> = samples.holdout.samples().cloned().collect();
        let objective = v.config.objective();
        let candidate = training::score(&holdout, objective, |r| fitted.predict(r));
        let replace = match &active {
            None => true,
            Some((m, _)) => {
                let current = training::score(&holdout, objective, |r| m.predict(r));
                !training::worse(&candidate, &current, holdout.len(), v.config.keep_margin)
            }
        };
        if replace {
            out.activated += 1;
            active = Some((fitted, candidate.error));
        }
    }
    if out.errors.len() == 1 {
        out.holdout_at_first_end = holdout_mape(&samples, active.as_ref().map(|a| &a.0));
        out.trained_on = active.as_ref().map_or(0, |a| a.0.train_samples_ttft);
    }
    out
}

fn holdout_mape(samples: &Samples, model: Option<&Fitted>) -> [Option<f64>; 2] {
    let Some(model) = model else { return [None, None] };
    let holdout: Vec<Sample> = samples.holdout.samples().cloned().collect();
    let s = training::score(&holdout, headroom_predictor_core::model::gbdt::Objective::Mean, |r| model.predict(r));
    [s.mape_ttft, s.mape_tpot]
}

/// The mean of `f(predicted, measured)` over the pairs.
fn mean_of(pairs: &[(f64, f64)], f: impl Fn(f64, f64) -> f64) -> Option<f64> {
    (!pairs.is_empty()).then(|| pairs.iter().map(|(p, a)| f(*p, *a)).sum::<f64>() / pairs.len() as f64)
}

/// MAPE of the predictions times `factor`.
fn mape(pairs: &[(f64, f64)], factor: f64) -> Option<f64> {
    (!pairs.is_empty()).then(|| pairs.iter().map(|(p, a)| (p * factor - a).abs() / a).sum::<f64>() / pairs.len() as f64)
}

/// The constant factor (0.5-1.5, in steps of 0.01) that gives these predictions their
/// least MAPE, and that MAPE: how much a predictor aimed at the median (what the live
/// correction holds the mean objective to) gives up on the MAPE figure.
fn best_factor(pairs: &[(f64, f64)]) -> Option<(f64, f64)> {
    (50..=150)
        .map(|i| f64::from(i) / 100.0)
        .filter_map(|f| mape(pairs, f).map(|m| (f, m)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

fn num(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.3}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
}
