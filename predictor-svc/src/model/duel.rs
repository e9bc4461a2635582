//! The analytic prior as a standing contender of the trained model, judged on live
//! traffic, per target and per hardware class.
//!
//! Why: a trained model is judged on held-out samples of the same stretch of traffic it
//! was fitted on. Past a fleet's cliff that stretch is a few seconds of reports about
//! requests dispatched seconds before, and the models refitted on it swung 2-10x against
//! what requests then measured, where the prior, which reads the endpoint's load at
//! dispatch, held; flow control on the prior kept 91% of the benchmark's interactive
//! class where the trained models kept 74% (docs/predictor.md, "Trained models past the
//! cliff"). At light load the trained models are the better of the two (TTFT from the
//! prior's 50-60% error to about 20%). So neither serves everywhere: the traffic says
//! which, and keeps saying it.
//!
//! Per hardware class, because the classes differ in how far the models can be trusted:
//! a pool's minority class (2 A100 among 8 servers) gives the models a sixth of their
//! samples, and judged over all classes at once its errors drowned in the majority's
//! (azure past the cliff: the models' A100 TPOTs missed 10% of the placements they
//! allowed while the H100s' were as good as the prior's; docs/predictor.md, "A proper
//! loss, judged per hardware class").
//!
//! How: every report is scored twice with the objective's loss (`training::loss`, as
//! the holdout is scored): against what the model side (the model active at the
//! request's dispatch, with its correction then) served or would have served for it,
//! and against what the prior, with its own correction then, served or would have
//! served. Both read only the state at dispatch, which the report carries, so both
//! figures are exact whichever side served; `store` works them out. A judgment comes as
//! soon as the evidence allows: after [`MIN_JUDGED`] reports when the mean difference is
//! beyond [`Z`] standard errors, else at [`WINDOW`] reports. The side not serving takes
//! the target on that class when its mean loss is under the serving side's by
//! [`MARGIN`].
//!
//! Judged both ways on every report, not on what was served alone: a report arrives
//! when its request ends (azure's answers take 8 s, 33 s of wall time at the
//! benchmark's 0.25x), so a contest that could judge the model only on reports of the
//! requests it served handed the prior a target for a fixed probation, then gave it
//! back to a model that served half a minute unjudged, at every turn (docs/predictor.md,
//! "The contest judged on every report").

use serde::Serialize;

use super::calibration::{slot, CLASSES};
use super::gbdt::Objective;
use super::training;

/// Reports per judgment, at most.
pub const WINDOW: usize = 200;
/// Reports before a judgment can come early.
pub const MIN_JUDGED: usize = 50;
/// Standard errors of the mean difference between the two losses that let a judgment
/// come before [`WINDOW`] reports: a class with a sixth of the traffic fills a window
/// six times slower, and a predictor several times off is plain long before.
pub const Z: f64 = 3.0;
/// The side not serving takes over when its mean loss is under the serving one's by
/// this share: a tie stays with the side that serves.
pub const MARGIN: f64 = 0.1;

/// The losses judged so far in one window: sums, so a judgment costs nothing.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    n: usize,
    model: f64,
    prior: f64,
    /// Sum and sum of squares of `model - prior`, for the standard error.
    diff: f64,
    diff_sq: f64,
}

impl Window {
    fn push(&mut self, model: f64, prior: f64) {
        let d = model - prior;
        self.n += 1;
        self.model += model;
        self.prior += prior;
        self.diff += d;
        self.diff_sq += d * d;
    }

    /// The mean losses (model, prior) when a judgment is due: a full window, or
    /// [`MIN_JUDGED`] reports whose mean difference is beyond [`Z`] standard errors.
    fn due(&self) -> Option<(f64, f64)> {
        let n = self.n as f64;
        let means = (self.model / n, self.prior / n);
        if self.n >= WINDOW {
            return Some(means);
        }
        if self.n < MIN_JUDGED {
            return None;
        }
        let mean = self.diff / n;
        let variance = (self.diff_sq / n - mean * mean).max(0.0) * n / (n - 1.0);
        (mean.abs() > Z * (variance / n).sqrt()).then_some(means)
    }
}

/// One target's contest on one hardware class.
#[derive(Debug, Clone, Copy, Default)]
struct Contest {
    window: Window,
    prior_serves: bool,
    /// Windows after which the prior served, and after which the model did.
    prior_wins: u64,
    model_wins: u64,
}

/// What `/v1/models` shows of the contest.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DuelView {
    /// What serves each target now: `model`, `prior` (before any model, or on every
    /// hardware class judged so far), or `model+prior` when the prior serves it on some
    /// classes (`prior_classes`) and the model on others.
    pub ttft: &'static str,
    pub tpot: &'static str,
    /// The hardware classes on which the prior serves each target (TTFT, TPOT).
    pub prior_classes: [Vec<usize>; 2],
    /// Windows after which the prior served / the model did, per target (TTFT, TPOT),
    /// all classes.
    pub prior_wins: [u64; 2],
    pub model_wins: [u64; 2],
}

/// The contest between the trained model and the prior, per target (0 TTFT, 1 TPOT) and
/// hardware class.
#[derive(Debug, Clone)]
pub struct Duel {
    objective: Objective,
    contests: [[Contest; CLASSES]; 2],
}

impl Duel {
    pub fn new(objective: Objective) -> Duel {
        Duel { objective, contests: [[Contest::default(); CLASSES]; 2] }
    }

    /// Whether the prior serves target `k` on hardware class `class`.
    pub fn prior_serves(&self, k: usize, class: f32) -> bool {
        self.contests[k][slot(class)].prior_serves
    }

    /// [`Self::prior_serves`] for both targets (TTFT, TPOT).
    pub fn prior_serves_targets(&self, class: f32) -> [bool; 2] {
        [0, 1].map(|k| self.prior_serves(k, class))
    }

    /// One report of target `k` from an endpoint of hardware class `class`: what the model
    /// side and the prior served or would have served for it at dispatch, and what it
    /// took. `Some(prior serves)` when this report ended a window that handed the target
    /// on this class to the other side.
    pub fn observe(&mut self, k: usize, class: f32, model: f64, prior: f64, actual: f64) -> Option<bool> {
        let usable = |v: f64| v.is_finite() && v > 0.0;
        if !(usable(model) && usable(prior) && usable(actual)) {
            return None;
        }
        let loss = |predicted: f64| training::loss(self.objective, predicted, actual);
        let c = &mut self.contests[k][slot(class)];
        c.window.push(loss(model), loss(prior));
        let (model_mean, prior_mean) = c.window.due()?;
        c.window = Window::default();
        let (serving, other) = if c.prior_serves { (prior_mean, model_mean) } else { (model_mean, prior_mean) };
        let handed = other < serving * (1.0 - MARGIN);
        c.prior_serves ^= handed;
        if c.prior_serves {
            c.prior_wins += 1;
        } else {
            c.model_wins += 1;
        }
        handed.then_some(c.prior_serves)
    }

    /// The contest now; without a model active (`model_active` false) the prior serves
    /// both targets everywhere.
    pub fn view(&self, model_active: bool) -> DuelView {
        let prior_classes: [Vec<usize>; 2] =
            [0, 1].map(|k| (0..CLASSES).filter(|&c| self.contests[k][c].prior_serves).collect::<Vec<_>>());
        // The classes judged so far: the prior serving all of them serves the target.
        let judged = |k: usize| self.contests[k].iter().filter(|c| c.prior_wins + c.model_wins > 0).count();
        let serves = |k: usize| match prior_classes[k].len() {
            _ if !model_active => "prior",
            0 => "model",
            n if n >= judged(k) => "prior",
            _ => "model+prior",
        };
        let wins = |k: usize, f: fn(&Contest) -> u64| self.contests[k].iter().map(f).sum();
        DuelView {
            ttft: serves(0),
            tpot: serves(1),
            prior_wins: [0, 1].map(|k| wins(k, |c| c.prior_wins)),
            model_wins: [0, 1].map(|k| wins(k, |c| c.model_wins)),
            prior_classes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hardware class the tests judge on unless they say otherwise.
    const CLASS: f32 = 2.0;

    /// `n` reports of target 1 on class `class`, the model side's prediction off by
    /// `model_off` (relative, plus `jitter` up and down on alternate reports) and the
    /// prior's by `prior_off`; the hand-overs they caused.
    fn judge_on(duel: &mut Duel, class: f32, n: usize, (model_off, jitter): (f64, f64), prior_off: f64) -> Vec<bool> {
        (0..n)
            .filter_map(|i| {
                let model = 100.0 * (1.0 + model_off + if i % 2 == 0 { jitter } else { -jitter });
                duel.observe(1, class, model, 100.0 * (1.0 + prior_off), 100.0)
            })
            .collect()
    }

    fn judge(duel: &mut Duel, n: usize, model_off: f64, prior_off: f64) -> Vec<bool> {
        judge_on(duel, CLASS, n, (model_off, 0.0), prior_off)
    }

    #[test]
    fn the_side_with_the_smaller_loss_serves_and_hands_back_when_the_other_wins() {
        let mut duel = Duel::new(Objective::Mean);
        // The model 40% off against the prior's 20%, every report: plain after the fewest
        // reports a judgment takes, not one before.
        assert!(judge(&mut duel, MIN_JUDGED - 1, 0.4, 0.2).is_empty());
        assert_eq!(judge(&mut duel, 1, 0.4, 0.2), [true]);
        assert!(duel.prior_serves(1, CLASS) && !duel.prior_serves(0, CLASS));
        // While the prior serves, the model is still judged on every report: as long as it
        // stays worse, the prior keeps the target, without a turn that runs out.
        assert!(judge(&mut duel, 5 * WINDOW, 0.4, 0.2).is_empty());
        assert!(duel.prior_serves(1, CLASS));
        // The model becomes the better one: it takes the target back.
        assert_eq!(judge(&mut duel, WINDOW, 0.05, 0.2), [false]);
        assert!(!duel.prior_serves(1, CLASS));
        // Every report differs alike: each judgment came after the fewest reports.
        let view = duel.view(true);
        assert_eq!((view.prior_wins, view.model_wins), ([0, 21], [0, 4]));
    }

    #[test]
    fn each_hardware_class_is_judged_on_its_own_reports() {
        let mut duel = Duel::new(Objective::Quantile { q: 0.9 });
        // On class 1 the model is a third under, on class 2 as close as the prior.
        assert_eq!(judge_on(&mut duel, 1.0, WINDOW, (-0.33, 0.0), 0.1), [true]);
        assert!(judge_on(&mut duel, CLASS, WINDOW, (0.1, 0.05), 0.1).is_empty());
        assert!(duel.prior_serves(1, 1.0) && !duel.prior_serves(1, CLASS));
        let view = duel.view(true);
        assert_eq!((view.tpot, view.ttft), ("model+prior", "model"));
        assert_eq!(view.prior_classes, [vec![], vec![1]]);
        assert_eq!(duel.view(false).tpot, "prior", "no model: the prior serves everywhere");
    }

    #[test]
    fn under_a_quantile_a_cautious_prior_beats_an_optimistic_model() {
        // The p90 of a saturated engine: the prior six times over, the model 1.3x under.
        // By the pinball loss of the relative error the model won (0.21 against 0.5); by
        // the log, the loss the quantile is the minimum of, the prior does (0.18 against 0.24).
        let mut duel = Duel::new(Objective::Quantile { q: 0.9 });
        assert_eq!(judge(&mut duel, WINDOW, 1.0 / 1.3 - 1.0, 5.0), [true]);
    }

    #[test]
    fn a_tie_stays_with_the_side_that_serves() {
        for objective in [Objective::Mean, Objective::Quantile { q: 0.9 }] {
            let mut duel = Duel::new(objective);
            // Within the margin, and within the noise until a window is full: 20% (give or
            // take 10) against 19%; then the prior serves and the model is as close to it.
            assert!(judge_on(&mut duel, CLASS, 5 * WINDOW, (0.2, 0.1), 0.19).is_empty(), "{objective:?}");
            assert!(!duel.prior_serves(1, CLASS));
            assert_eq!(duel.view(true).model_wins, [0, 5], "{objective:?}");
            assert_eq!(judge(&mut duel, WINDOW, 0.4, 0.2), [true]);
            assert!(judge_on(&mut duel, CLASS, 5 * WINDOW, (0.19, 0.1), 0.2).is_empty(), "{objective:?}");
            assert!(duel.prior_serves(1, CLASS), "{objective:?}");
        }
    }

    #[test]
    fn reports_that_cannot_be_scored_are_not_judged() {
        let mut duel = Duel::new(Objective::Mean);
        for bad in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
            for _ in 0..WINDOW {
                assert_eq!(duel.observe(1, CLASS, bad, 100.0, 100.0), None);
                assert_eq!(duel.observe(1, CLASS, 100.0, bad, 100.0), None);
                assert_eq!(duel.observe(1, CLASS, 100.0, 100.0, bad), None);
            }
        }
        assert_eq!(duel.view(true).model_wins, [0, 0]);
    }
}
