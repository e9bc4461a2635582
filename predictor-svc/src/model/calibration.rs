//! Online correction of served predictions from what was observed since.
//!
//! A model is fitted to samples that are at least one training round old, and the
//! fleet moves on: under a new load the predictions run optimistic until the next
//! model, and a p90 model's coverage on live traffic drifts off 90%. This keeps
//! one multiplicative correction per target and hardware class and moves it after
//! every observed request, the way adaptive conformal inference tracks a quantile:
//! `log_shift += rate * (missed - (1 - q))`, where `missed` is 1 when the request
//! took longer than the served (corrected) prediction. At equilibrium a share
//! `1 - q` of requests take longer than served: q = 0.9 for the p90 objective
//! (coverage held at 90%), q = 0.5 for the mean objective (served predictions
//! median-unbiased on live traffic). The correction carries over from one model
//! to the next: with a new model every few seconds, one restarted each time would
//! never settle (measured: p90 coverage 0.82 with resets). It is forgotten only
//! when drift handling replaces the regime the models were trained on.

use serde::Serialize;

/// Most hardware classes corrected separately; higher ones share the last slot.
pub const CLASSES: usize = 16;
/// The correction never goes beyond this factor either way.
const MAX_LOG_SHIFT: f64 = 2.0; // e^2 = 7.4x

/// The live correction of one model's predictions.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// The quantile tracked: the objective's, or 0.5 for the mean objective.
    quantile: f64,
    /// Step per observation in log space; 0 turns correction off.
    rate: f64,
    /// [target][class] log factor; target 0 TTFT, 1 TPOT.
    log_shift: [[f64; CLASSES]; 2],
}

/// What `/v1/models` shows of the correction.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CalibrationView {
    pub quantile: f64,
    pub rate: f64,
    /// Factor applied to TTFT predictions, by hardware class id (index).
    pub ttft_factor: Vec<f64>,
    /// Factor applied to TPOT predictions, by hardware class id (index).
    pub tpot_factor: Vec<f64>,
}

fn slot(class: f32) -> usize {
    if class.is_finite() && class > 0.0 {
        (class as usize).min(CLASSES - 1)
    } else {
        0
    }
}

impl Calibration {
    pub fn new(quantile: f64, rate: f64) -> Calibration {
        Calibration { quantile: quantile.clamp(0.01, 0.99), rate: rate.max(0.0), log_shift: [[0.0; CLASSES]; 2] }
    }

    /// The served (TTFT, TPOT) for a raw prediction on an endpoint of `class`.
    pub fn apply(&self, class: f32, (ttft, tpot): (f64, f64)) -> (f64, f64) {
        let c = slot(class);
        (ttft * self.log_shift[0][c].exp(), tpot * self.log_shift[1][c].exp())
    }

    /// One observed request: what was served for it and what it took (`None`: not
    /// measured). Only the targets with both move.
    pub fn observe(&mut self, class: u32, served: [Option<f64>; 2], actual: [Option<f64>; 2]) {
        let c = slot(class as f32);
        for k in 0..2 {
            let (Some(p), Some(a)) = (served[k], actual[k]) else { continue };
            if !(p.is_finite() && a.is_finite() && p > 0.0 && a > 0.0) {
                continue;
            }
            let missed = if a > p { 1.0 } else { 0.0 };
            let shift = &mut self.log_shift[k][c];
            *shift = (*shift + self.rate * (missed - (1.0 - self.quantile))).clamp(-MAX_LOG_SHIFT, MAX_LOG_SHIFT);
        }
    }

    /// Forgets the correction: after a regime change (drift) it was learnt on traffic
    /// that is gone.
    pub fn reset(&mut self) {
        self.log_shift = [[0.0; CLASSES]; 2];
    }

    pub fn view(&self) -> CalibrationView {
        let factors = |k: usize| self.log_shift[k].iter().map(|s| s.exp()).collect();
        CalibrationView { quantile: self.quantile, rate: self.rate, ttft_factor: factors(0), tpot_factor: factors(1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests whose latency is `scale` x a uniform draw around the raw prediction 100.
    fn coverage_after(quantile: f64, scale: f64) -> f64 {
        let mut c = Calibration::new(quantile, 0.01);
        let mut seed = 11u64;
        let mut uniform = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let (mut covered, mut n) = (0.0, 0.0);
        for i in 0..20_000 {
            let actual = scale * (50.0 + 100.0 * uniform());
            let served = c.apply(1.0, (100.0, 10.0)).0;
            if i >= 10_000 {
                covered += if actual <= served { 1.0 } else { 0.0 };
                n += 1.0;
            }
            c.observe(1, [Some(served), None], [Some(actual), None]);
        }
        covered / n
    }

    #[test]
    fn coverage_settles_at_the_quantile_even_when_the_model_is_optimistic() {
        for (q, scale) in [(0.9, 1.0), (0.9, 2.0), (0.5, 1.5), (0.9, 0.5)] {
            let got = coverage_after(q, scale);
            assert!((got - q).abs() < 0.02, "q {q} scale {scale}: coverage {got}");
        }
    }

    #[test]
    fn classes_are_corrected_apart() {
        let mut c = Calibration::new(0.5, 0.05);
        for _ in 0..200 {
            c.observe(2, [Some(10.0), Some(5.0)], [Some(30.0), None]);
        }
        assert!(c.apply(2.0, (10.0, 5.0)).0 > 20.0, "class 2 TTFT raised");
        assert_eq!(c.apply(2.0, (10.0, 5.0)).1, 5.0, "TPOT was never observed");
        assert_eq!(c.apply(1.0, (10.0, 5.0)), (10.0, 5.0), "other classes untouched");
        assert!(c.view().ttft_factor[2] > 2.0);
        c.reset();
        assert_eq!(c.apply(2.0, (10.0, 5.0)), (10.0, 5.0));
        // Off: nothing moves.
        let mut off = Calibration::new(0.9, 0.0);
        off.observe(0, [Some(1.0), Some(1.0)], [Some(9.0), Some(9.0)]);
        assert_eq!(off.apply(0.0, (1.0, 1.0)), (1.0, 1.0));
    }
}
