//! The edge of the load a trained model has seen, and the rows beyond it.
//!
//! Why: trees do not extrapolate. A model trained while a fleet fills up has seen
//! light and middling loads; when the load rises past anything in its samples, each
//! tree answers with its outermost leaf, and the residual learnt at lighter loads
//! (often "the prior is too cautious here") is applied where the prior's physics is
//! the only thing that knows. On the azure trace past the cliff, the first tenths of
//! each step were where the served p90 TPOT covered 2-25% of what one class's
//! requests took, against 40-90% for the prior alone (docs/predictor.md, "The edge of
//! the seen load").
//!
//! How: the analytic prior's own prediction for a row is one physical measure of its
//! load (queue, batch, prefill share, prompt, hardware), so the edge is, per target and
//! hardware class, the highest prior prediction among the samples the model was
//! trained on. For a row whose prior prediction is beyond it the trees' residual is
//! no evidence either way, so it is served the more cautious of the model and the
//! prior with its correction (`store::predict`), until a model trained on such loads
//! arrives. The more cautious, not the prior outright: where the fleet runs at the
//! prior's shape times a factor, the residual model extrapolates it exactly
//! (`learning.rs`, `residual_learning_extrapolates_where_no_sample_has_been`).

use super::calibration::{slot, CLASSES};
use super::features::{Row, HARDWARE_CLASS, PRIOR_LOG_TPOT, PRIOR_LOG_TTFT};
use super::sampler::Sample;

/// Per target (TTFT, TPOT), by hardware class (index: `calibration::slot`), the highest
/// prior prediction (ms) among a model's training samples of that target; 0 where it
/// had none. Classes past the end had none either.
pub type Edge = [Vec<f64>; 2];

/// The prior's prediction (ms) for target `k` in `row` (its prior columns).
fn prior_ms(row: &Row, k: usize) -> f64 {
    f64::from(row[if k == 0 { PRIOR_LOG_TTFT } else { PRIOR_LOG_TPOT }]).exp()
}

/// The edge of what `train` shows a model.
pub fn edge(train: &[Sample]) -> Edge {
    [0, 1].map(|k| {
        let mut highest = vec![0.0f64; CLASSES];
        for s in train.iter().filter(|s| if k == 0 { s.ttft_ms.is_some() } else { s.tpot_ms.is_some() }) {
            let c = slot(s.row[HARDWARE_CLASS]);
            let p = prior_ms(&s.row, k);
            if p.is_finite() {
                highest[c] = highest[c].max(p);
            }
        }
        // Trailing classes without samples need no entry.
        let len = highest.iter().rposition(|&h| h > 0.0).map_or(0, |i| i + 1);
        highest.truncate(len);
        highest
    })
}

/// Per target, whether `row` is beyond `edge`.
pub fn beyond(edge: &Edge, row: &Row) -> [bool; 2] {
    let c = slot(row[HARDWARE_CLASS]);
    [0, 1].map(|k| prior_ms(row, k) > edge[k].get(c).copied().unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::super::features;
    use super::super::prior::AnalyticPrior;
    use super::*;
    use headroom_protocol::{EndpointState, RequestFeatures};

    fn row(class: u32, running: u32) -> Row {
        let waiting = running / 10;
        let state = EndpointState { running, in_flight: running, waiting, hardware_class: class, ..Default::default() };
        features::row(&RequestFeatures { input_tokens: 500, ..Default::default() }, &state, &AnalyticPrior::default())
    }

    fn sample(class: u32, running: u32, tpot: bool) -> Sample {
        Sample { row: row(class, running), ttft_ms: Some(10.0), tpot_ms: tpot.then_some(5.0) }
    }

    #[test]
    fn rows_past_the_heaviest_load_trained_on_are_beyond_per_class_and_target() {
        // Class 1 trained up to 300 running, class 2 up to 600 but with TTFT only there.
        let train = [sample(1, 10, true), sample(1, 300, true), sample(2, 600, false), sample(2, 50, false)];
        let e = edge(&train);
        assert_eq!(e[1].len(), 2, "TPOT: no class past 1: {e:?}");
        assert_eq!(beyond(&e, &row(1, 200)), [false, false]);
        assert_eq!(beyond(&e, &row(1, 900)), [true, true]);
        assert_eq!(beyond(&e, &row(2, 400)), [false, true], "no TPOT sample on class 2");
        assert_eq!(beyond(&e, &row(3, 1)), [true, true], "a class it never saw");
    }
}
