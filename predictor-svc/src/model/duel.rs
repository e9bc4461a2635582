//! The analytic prior as a standing contender of the trained model, judged on live
//! traffic, per target.
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
//! How: while the model serves a target, each report of a request it served is scored
//! twice with the objective's loss (the absolute relative error for `mean`, the pinball
//! loss of the relative error for a quantile, as the holdout is scored): what was served
//! for it, and what the prior, corrected by its own live correction, would have served
//! at dispatch. The prior reads only the state at dispatch, which the report carries, so
//! that second figure is exact, not a guess. Every [`WINDOW`] such reports are judged:
//! when the prior's mean loss is under the served one's by [`MARGIN`], the prior serves
//! the target for a probation; afterwards the model serves again and is judged afresh.
//! The probation starts at [`BASE_PROBATION`] and doubles each time the prior wins again,
//! to [`MAX_PROBATION`]; a window the model wins resets it. While the prior serves, the
//! model cannot be judged (what it would have said at dispatch was never served), hence
//! a probation rather than a comparison both ways.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::gbdt::Objective;
use super::training;

/// Reports per judgment.
pub const WINDOW: usize = 200;
/// The prior takes over when its mean loss is under the served one's by this share.
pub const MARGIN: f64 = 0.1;
/// The first probation, and what a window the model wins resets it to.
pub const BASE_PROBATION: Duration = Duration::from_secs(30);
/// The longest probation.
pub const MAX_PROBATION: Duration = Duration::from_secs(300);
/// How far back the record of who served reaches: a report of a request dispatched
/// earlier is not told apart (treated as served by the model).
const HISTORY: Duration = Duration::from_secs(120);

/// One target's contest.
#[derive(Debug, Clone)]
struct Contest {
    /// (served loss, prior loss) of the reports judged so far in this window.
    window: Vec<(f64, f64)>,
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
            window: Vec::with_capacity(WINDOW),
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
    /// What serves each target now: `model` or `prior`.
    pub ttft: &'static str,
    pub tpot: &'static str,
    /// Windows won by the prior / by the model, per target (TTFT, TPOT).
    pub prior_wins: [u64; 2],
    pub model_wins: [u64; 2],
}

/// The contest between the trained model and the prior, per target (0 TTFT, 1 TPOT).
#[derive(Debug, Clone)]
pub struct Duel {
    objective: Objective,
    contests: [Contest; 2],
    /// Reports of requests dispatched before this are not judged: they were served by
    /// what came before the model (the prior before the first one, an old regime's).
    from: Instant,
}

impl Duel {
    pub fn new(objective: Objective, now: Instant) -> Duel {
        Duel { objective, contests: [Contest::new(), Contest::new()], from: now }
    }

    /// Whether the prior serves target `k` at `at`.
    pub fn prior_serves(&self, k: usize, at: Instant) -> bool {
        self.contests[k].prior_at(at)
    }

    /// One report of target `k`, of a request dispatched at `dispatched`: what was served
    /// for it, what the corrected prior would have served, what it took. Judged only when
    /// the model served it; true when this report ended a window the prior won (it serves
    /// from `now`).
    pub fn observe(
        &mut self,
        k: usize,
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
        let c = &mut self.contests[k];
        while c.prior_turns.front().is_some_and(|&(_, until)| now.saturating_duration_since(until) > HISTORY) {
            c.prior_turns.pop_front();
        }
        if dispatched < from || c.prior_at(now) || c.model_since().is_some_and(|since| dispatched < since) {
            return false;
        }
        c.window.push((served_loss, prior_loss));
        if c.window.len() < WINDOW {
            return false;
        }
        let n = c.window.len() as f64;
        let (served_mean, prior_mean) = c.window.drain(..).fold((0.0, 0.0), |(s, p), (a, b)| (s + a / n, p + b / n));
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
        for c in &mut self.contests {
            c.window.clear();
        }
        self.from = now;
    }

    /// The contest at `now`; without a model active (`model_active` false) the prior
    /// serves both targets.
    pub fn view(&self, now: Instant, model_active: bool) -> DuelView {
        let serves = |k: usize| if !model_active || self.prior_serves(k, now) { "prior" } else { "model" };
        DuelView {
            ttft: serves(0),
            tpot: serves(1),
            prior_wins: [0, 1].map(|k| self.contests[k].prior_wins),
            model_wins: [0, 1].map(|k| self.contests[k].model_wins),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` reports of target 1 dispatched `lag` before `now`, the served prediction off by
    /// `served_off` and the prior's by `prior_off` (relative); the instant after them.
    fn judge(duel: &mut Duel, now: Instant, n: usize, served_off: f64, prior_off: f64) -> (bool, Instant) {
        let mut switched = false;
        let mut t = now;
        for i in 0..n {
            t = now + Duration::from_millis(i as u64);
            let dispatched = t.checked_sub(Duration::from_millis(500)).unwrap_or(t);
            switched |= duel.observe(1, dispatched, 100.0 * (1.0 + served_off), 100.0 * (1.0 + prior_off), 100.0, t);
        }
        (switched, t)
    }

    /// A contest judging requests dispatched from a second before `t0`.
    fn started(objective: Objective, t0: Instant) -> Duel {
        Duel::new(objective, t0.checked_sub(Duration::from_secs(1)).unwrap_or(t0))
    }

    #[test]
    fn the_prior_serves_a_probation_when_it_beats_what_was_served_and_the_model_is_judged_again_after() {
        let t0 = Instant::now();
        let mut duel = started(Objective::Mean, t0);
        // The model's window: 40% off against the prior's 20%.
        let (switched, t) = judge(&mut duel, t0, WINDOW, 0.4, 0.2);
        assert!(switched && duel.prior_serves(1, t) && !duel.prior_serves(0, t));
        // Its reports while the prior serves are not the model's to be judged on.
        let (switched, _) = judge(&mut duel, t + Duration::from_secs(1), 3 * WINDOW, 0.4, 0.0);
        assert!(!switched);
        // After the probation the model serves again; reports of requests dispatched during
        // the prior's turn do not count, those after do.
        let after = t + BASE_PROBATION + Duration::from_secs(1);
        assert!(!duel.prior_serves(1, after));
        let (switched, t) = judge(&mut duel, after, WINDOW, 0.4, 0.2);
        assert!(switched, "the prior wins again");
        assert!(duel.prior_serves(1, t + BASE_PROBATION + Duration::from_secs(1)), "for twice as long");
        assert_eq!(duel.view(t, true).prior_wins, [0, 2]);
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
        assert!(duel.prior_serves(1, t + Duration::from_secs(1)));
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
            // Within the margin: 20% against 19%.
            let (switched, t) = judge(&mut duel, t0, 5 * WINDOW, 0.2, 0.19);
            assert!(!switched && !duel.prior_serves(1, t), "{objective:?}");
            assert_eq!(duel.view(t, true).model_wins, [0, 5]);
        }
    }
}
