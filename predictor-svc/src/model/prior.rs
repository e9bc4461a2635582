//! Predictions before any model is trained: an analytic prior over the same
//! feature row the models take (`crate::model::features`).
//!
//! Derived from the step-time model in `docs/simulator.md` (Llama-3.1-8B on
//! one H100, continuous batching with chunked prefill). It is honest about what
//! it is: a fixed formula over the endpoint state, labelled `analytic-prior`,
//! to be replaced by the trained models.
//!
//! ```text
//! step     = 0.8 + max(6.0, running * 0.024) + context_tokens * 65e-6      (ms)
//! TTFT     = 10 + (uncached prompt + uncached prompts in flight) * 0.03 + waiting * step
//! TPOT     = step + prompt tokens in flight * 65e-6 (longer contexts read more KV)
//! ```
//!
//! Other GPUs: `model.prior_hardware_scale` multiplies every engine term (all
//! but the 10 ms overhead) for the endpoints of a hardware class (e.g. 1.7 for
//! an A100).

use crate::model::features::Row;

/// Name reported as `model_version` for analytic predictions.
pub const ANALYTIC_PRIOR: &str = "analytic-prior";

/// Constants of the prior (milliseconds).
#[derive(Debug, Clone)]
pub struct AnalyticPrior {
    pub overhead_ms: f64,
    pub step_fixed_ms: f64,
    pub weight_floor_ms: f64,
    pub per_batched_token_ms: f64,
    pub per_context_token_ms: f64,
    pub prefill_per_token_ms: f64,
    /// Engine-time multiplier by hardware class id (the row's `hardware_class`);
    /// classes past the end run at 1.0.
    pub hardware_scale: Vec<f64>,
}

impl Default for AnalyticPrior {
    fn default() -> Self {
        AnalyticPrior {
            overhead_ms: 10.0,
            step_fixed_ms: 0.8,
            weight_floor_ms: 6.0,
            per_batched_token_ms: 0.024,
            per_context_token_ms: 65e-6,
            prefill_per_token_ms: 0.03,
            hardware_scale: Vec::new(),
        }
    }
}

impl AnalyticPrior {
    /// Predicted (TTFT, TPOT) in ms from a feature row (`model::features::row`); reads
    /// the state columns only, never the prior columns it fills.
    pub fn predict(&self, row: &Row) -> (f64, f64) {
        let f = |i: usize| f64::from(row[i]);
        let (waiting, running, uncached_in_flight, effective_input, in_flight, tokens_in_flight) =
            (f(2), f(3), f(5), f(6), f(7), f(8));
        let input = f(1);
        let scale = self.hardware_scale.get(f(9) as usize).copied().unwrap_or(1.0);
        let step = scale
            * (self.step_fixed_ms
                + self.weight_floor_ms.max(running.max(in_flight) * self.per_batched_token_ms)
                + tokens_in_flight * self.per_context_token_ms);
        let prefill = scale * (effective_input + uncached_in_flight) * self.prefill_per_token_ms;
        let ttft = self.overhead_ms + prefill + waiting * step;
        let tpot = step + scale * input * self.per_context_token_ms;
        (ttft, tpot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::features::row;
    use headroom_protocol::{EndpointState, RequestFeatures};

    #[test]
    fn latency_grows_with_load_and_prompt() {
        let p = AnalyticPrior::default();
        let req = RequestFeatures { input_tokens: 2000, ..Default::default() };
        let idle = p.predict(&row(&req, &EndpointState::default(), &p));
        let busy_state =
            EndpointState { running: 64, in_flight: 64, waiting: 4, tokens_in_flight: 131_072, ..Default::default() };
        let busy = p.predict(&row(&req, &busy_state, &p));
        assert!(busy.0 > idle.0 && busy.1 > idle.1);
        // Calibration anchors (H100, 8B): ~6.8 ms TPOT alone, ~15.6 ms at 64 x 2k context.
        assert!((idle.1 - 6.93).abs() < 0.2, "{idle:?}");
        assert!((busy.1 - 15.5).abs() < 1.0, "{busy:?}");
        let cached = p.predict(&row(&req, &EndpointState { prefix_match: 1.0, ..Default::default() }, &p));
        assert!(cached.0 < idle.0);
    }

    #[test]
    fn a_scaled_hardware_class_is_slower_by_its_factor() {
        let p = AnalyticPrior { hardware_scale: vec![1.0, 1.7], ..AnalyticPrior::default() };
        let req = RequestFeatures { input_tokens: 2000, ..Default::default() };
        let h100 = p.predict(&row(&req, &EndpointState::default(), &p));
        let a100 = p.predict(&row(&req, &EndpointState { hardware_class: 1, ..Default::default() }, &p));
        let unknown = p.predict(&row(&req, &EndpointState { hardware_class: 7, ..Default::default() }, &p));
        assert!((a100.1 / h100.1 - 1.7).abs() < 1e-6, "TPOT {a100:?} vs {h100:?}");
        let engine = |t: (f64, f64)| t.0 - p.overhead_ms;
        assert!((engine(a100) / engine(h100) - 1.7).abs() < 1e-6, "TTFT beyond the API overhead scales");
        assert_eq!(unknown, h100, "a class without a factor runs at the calibration");
    }
}
