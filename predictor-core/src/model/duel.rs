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
//! How: while the model serves a target on a class, each report of a request it served
//! there is scored twice with the objective's loss (`training::loss`, as the holdout is
//! scored): what was served for it, and what the prior, corrected by its own live
//! correction, would have served at dispatch. The prior reads only the state at
//! dispatch, which the report carries, so that second figure is exact, not a guess. A
//! judgment comes as soon as the evidence allows: after [`MIN_JUDGED`] reports when the
//! mean difference is beyond [`Z`] standard errors, else at [`WINDOW`] reports. When the
//! prior's mean loss is under the served one's by [`MARGIN`], the prior serves the target
//! on that class for a probation; afterwards the model serves again and is judged
//! afresh. The probation starts at [`BASE_PROBATION`] and doubles each time the prior
//! wins again, to [`MAX_PROBATION`]; a window the model wins resets it. While the prior
//! serves, the model cannot be judged (what it would have said at dispatch was never
//! served), hence a probation rather than a comparison both ways.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

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
/// The prior takes over when its mean loss is under the served one's by this share.
pub const MARGIN: f64 = 0.1;
/// The first probation, and what a window the model wins resets it to.
pub const BASE_PROBATION: Duration = Duration::from_secs(30);
/// The longest probation.
pub const MAX_PROBATION: Duration = Duration::from_secs(300);
/// How far back the record of who served reaches: a report of a request dispatched
/// earlier is not told apart (treated as served by the model).
const HISTORY: Duration = Duration::from_secs(120);

/// The losses judged so far in one window: sums, so a judgment costs nothing.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    n: usize,
    served: f64,
    prior: f64,
    /// Sum and sum of squares of `served - prior`, for the standard error.
    diff: f64,
    diff_sq: f64,
}

impl Window {
    fn push(&mut self, served: f64, prior: f64) {
        let d = served - prior;
        self.n += 1;
        self.served += served;
        self.prior += prior;
        self.diff += d;
        self.diff_sq += d * d;
    }

    /// The mean losses (served, prior) when a judgment is due: a full window, or
    /// [`MIN_JUDGED`] reports whose mean difference is beyond [`Z`] standard errors.
    fn due(&self) -> Option<(f64, f64)> {
        let n = self.n as f64;
        let means = (self.served / n, self.prior / n);
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
#[derive(Debug, Clone)]
struct Contest {
    window: Window,
    /// The prior's turns, oldest first: from, until.
    prior_turns: VecDeque<(Instant, Instant)>,
    /// The next probation.
    probation: Duration,
    /// Windows the prior won, and that the model won.
    prior_wins: u64,
    model_wins: u64,
}

impl Contest {
    fn new() -> Contest {
        Contest {
            window: Window::default(),
            prior_turns: VecDeque::new(),
            probation: BASE_PROBATION,
            prior_wins: 0,
            model_wins: 0,
        }
    }

    /// Whether the prior served at `at`.
    fn prior_at(&self, at: Instant) -> bool {
        self.prior_turns.iter().any(|&(from, until)| from <= at && at < until)
    }

    /// The end of the prior's last turn: reports of requests dispatched before it are not
    /// the model's to be judged on.
    fn model_since(&self) -> Option<Instant> {
        self.prior_turns.back().map(|&(_, until)| until)
    }
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
    /// Windows won by the prior / by the model, per target (TTFT, TPOT), all classes.
    pub prior_wins: [u64; 2],
    pub model_wins: [u64; 2],
}

/// The contest between the trained model and the prior, per target (0 TTFT, 1 TPOT) and
/// hardware class.
#[derive(Debug, Clone)]
pub struct Duel {
    objective: Objective,
    contests: [[Contest; CLASSES]; 2],
    /// Reports of requests dispatched before this are not judged: they were served by
    /// what came before the model (the prior before the first one, an old regime's).
    from: Instant,
}

impl Duel {
    pub fn new(objective: Objective, now: Instant) -> Duel {
        Duel { objective, contests: std::array::from_fn(|_| std::array::from_fn(|_| Contest::new())), from: now }
    }

    /// Whether the prior serves target `k` on hardware class `class` at `at`.
    pub fn prior_serves(&self, k: usize, class: f32, at: Instant) -> bool {
        self.contests[k][slot(class)].prior_at(at)
    }

    /// [`Self::prior_serves`] for both targets (TTFT, TPOT).
    pub fn prior_serves_targets(&self, class: f32, at: Instant) -> [bool; 2] {
        [0, 1].map(|k| self.prior_serves(k, class, at))
    }

    /// One report of target `k`, of a request dispatched at `dispatched` to an endpoint of
    /// hardware class `class`: what was served for it, what the corrected prior would have
    /// served, what it took. Judged only when the model served it; true when this report
    /// ended a window the prior won (it serves from `now`).
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        k: usize,
        class: f32,
        dispatched: Instant,
        served: f64,
        prior: f64,
        actual: f64,
        now: Instant,
    ) -> bool {
        let usable = |v: f64| v.is_finite() && v > 0.0;
        if !(usable(served) && usable(prior) && usable(actual)) {
            return false;
        }
        let loss = |predicted: f64| training::loss(self.objective, predicted, actual);
        let (served_loss, prior_loss) = (loss(served), loss(prior));
        let from = self.from;
        let c = &mut self.contests[k][slot(class)];
        while c.prior_turns.front().is_some_and(|&(_, until)| now.saturating_duration_since(until) > HISTORY) {
            c.prior_turns.pop_front();
        }
        if dispatched < from || c.prior_at(now) || c.model_since().is_some_and(|since| dispatched < since) {
            return false;
        }
        c.window.push(served_loss, prior_loss);
        let Some((served_mean, prior_mean)) = c.window.due() else { return false };
        c.window = Window::default();
        if prior_mean < served_mean * (1.0 - MARGIN) {
            c.prior_turns.push_back((now, now + c.probation));
            c.probation = (c.probation * 2).min(MAX_PROBATION);
            c.prior_wins += 1;
            true
        } else {
            c.probation = BASE_PROBATION;
            c.model_wins += 1;
            false
        }
    }

    /// Judges afresh from `now`: the first model replaced the prior, or drift replaced the
    /// regime, and what was served before is no new model's to be judged on. A turn the
    /// prior is serving goes on, and its probation stays: drift says the old models were
    /// stale, not that the next one beats the prior (past a cliff, drift rounds came every
    /// few seconds and, ending the prior's turns, handed the traffic back to the models).
    pub fn reset(&mut self, now: Instant) {
        for c in self.contests.iter_mut().flatten() {
            c.window = Window::default();
        }
        self.from = now;
    }

    /// The contest at `now`; without a model active (`model_active` false) the prior
    /// serves both targets everywhere.
    pub fn view(&self, now: Instant, model_active: bool) -> DuelView {
        let prior_classes: [Vec<usize>; 2] =
            [0, 1].map(|k| (0..CLASSES).filter(|&c| self.contests[k][c].prior_at(now)).collect::<Vec<_>>());
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

    /// `n` reports of target 1 on class `class`, dispatched half a second before they are
    /// reported from `now` on, the served prediction off by `served_off` (relative, plus
    /// `jitter` up and down on alternate reports) and the prior's by `prior_off`; whether
    /// one ended a window the prior won, and the instant after them.
    fn judge_on(
        duel: &mut Duel,
        class: f32,
        now: Instant,
        n: usize,
        (served_off, jitter): (f64, f64),
        prior_off: f64,
    ) -> (bool, Instant) {
        let mut switched = false;
        let mut t = now;
        for i in 0..n {
            t = now + Duration::from_millis(i as u64);
            let dispatched = t.checked_sub(Duration::from_millis(500)).unwrap_or(t);
            let served = 100.0 * (1.0 + served_off + if i % 2 == 0 { jitter } else { -jitter });
            switched |= duel.observe(1, class, dispatched, served, 100.0 * (1.0 + prior_off), 100.0, t);
        }
        (switched, t)
    }

    fn judge(duel: &mut Duel, now: Instant, n: usize, served_off: f64, prior_off: f64) -> (bool, Instant) {
        judge_on(duel, CLASS, now, n, (served_off, 0.0), prior_off)
    }

    /// A contest judging requests dispatched from a second before `t0`.
    fn started(objective: Objective, t0: Instant) -> Duel {
        Duel::new(objective, t0.checked_sub(Duration::from_secs(1)).unwrap_or(t0))
    }

    #[test]
    fn the_prior_serves_a_probation_when_it_beats_what_was_served_and_the_model_is_judged_again_after() {
        let t0 = Instant::now();
        let mut duel = started(Objective::Mean, t0);
        // The model's reports: 40% off against the prior's 20%, every one of them: plain
        // after the fewest reports a judgment takes, not one before.
        let (switched, t) = judge(&mut duel, t0, MIN_JUDGED - 1, 0.4, 0.2);
        assert!(!switched);
        let (switched, t) = judge(&mut duel, t, 1, 0.4, 0.2);
        assert!(switched && duel.prior_serves(1, CLASS, t) && !duel.prior_serves(0, CLASS, t));
        // Its reports while the prior serves are not the model's to be judged on.
        let (switched, _) = judge(&mut duel, t + Duration::from_secs(1), 3 * WINDOW, 0.4, 0.0);
        assert!(!switched);
        // After the probation the model serves again; reports of requests dispatched during
        // the prior's turn do not count, those after do.
        let after = t + BASE_PROBATION + Duration::from_secs(1);
        assert!(!duel.prior_serves(1, CLASS, after));
        let (switched, t) = judge(&mut duel, after, WINDOW, 0.4, 0.2);
        assert!(switched, "the prior wins again");
        assert!(duel.prior_serves(1, CLASS, t + BASE_PROBATION + Duration::from_secs(1)), "for twice as long");
        assert_eq!(duel.view(t, true).prior_wins, [0, 2]);
    }

    #[test]
    fn each_hardware_class_is_judged_on_its_own_reports() {
        let t0 = Instant::now();
        let mut duel = started(Objective::Quantile { q: 0.9 }, t0);
        // On class 1 the model is a third under, on class 2 as close as the prior.
        let (switched, t) = judge_on(&mut duel, 1.0, t0, WINDOW, (-0.33, 0.0), 0.1);
        assert!(switched);
        let (switched, t) = judge_on(&mut duel, CLASS, t, WINDOW, (0.1, 0.05), 0.1);
        assert!(!switched);
        assert!(duel.prior_serves(1, 1.0, t) && !duel.prior_serves(1, CLASS, t));
        let view = duel.view(t, true);
        assert_eq!((view.tpot, view.ttft), ("model+prior", "model"));
        assert_eq!(view.prior_classes, [vec![], vec![1]]);
        assert_eq!(duel.view(t, false).tpot, "prior", "no model: the prior serves everywhere");
    }

    #[test]
    fn under_a_quantile_a_cautious_prior_beats_an_optimistic_model() {
        // The p90 of a saturated engine: the prior six times over, the model 1.3x under.
        // By the pinball loss of the relative error the model won (0.21 against 0.5); by
        // the log, the loss the quantile is the minimum of, the prior does (0.18 against 0.24).
        let t0 = Instant::now();
        let mut duel = started(Objective::Quantile { q: 0.9 }, t0);
        let (switched, _) = judge(&mut duel, t0, WINDOW, 1.0 / 1.3 - 1.0, 5.0);
        assert!(switched);
    }

    #[test]
    fn a_fresh_start_keeps_the_prior_s_turn() {
        let t0 = Instant::now();
        let mut duel = started(Objective::Mean, t0);
        let (switched, t) = judge(&mut duel, t0, WINDOW, 0.4, 0.2);
        assert!(switched);
        // Drift replaced the regime: the turn goes on, and reports served by the prior
        // before the restart are not the new model's.
        duel.reset(t);
        assert!(duel.prior_serves(1, CLASS, t + Duration::from_secs(1)));
        let (switched, _) = judge(&mut duel, t + BASE_PROBATION + Duration::from_millis(100), WINDOW, 0.9, 0.0);
        assert!(!switched, "dispatched before the turn ended: not judged");
    }

    #[test]
    fn requests_dispatched_before_the_contest_started_are_not_judged() {
        let t0 = Instant::now();
        let mut duel = Duel::new(Objective::Mean, t0);
        // Dispatched half a second before it started (served by the prior before the first
        // model): however bad, not the model's.
        let (switched, _) = judge(&mut duel, t0, 2 * WINDOW, 0.9, 0.0);
        assert!(!switched);
        assert_eq!(duel.view(t0, true).prior_wins, [0, 0]);
    }

    #[test]
    fn a_model_as_good_as_the_prior_keeps_serving() {
        let t0 = Instant::now();
        for objective in [Objective::Mean, Objective::Quantile { q: 0.9 }] {
            let mut duel = started(objective, t0);
            // Within the margin, and within the noise until a window is full: 20% (give or
            // take 10) against 19%.
            let (switched, t) = judge_on(&mut duel, CLASS, t0, 5 * WINDOW, (0.2, 0.1), 0.19);
            assert!(!switched && !duel.prior_serves(1, CLASS, t), "{objective:?}");
            assert_eq!(duel.view(t, true).model_wins, [0, 5], "{objective:?}");
        }
    }
}
