//! The model's input features: defined once, used by prediction and training.
//!
//! At predict time the vector is built from the request and the endpoint's
//! [`EndpointState`] the predictor computes. The predictor keeps that state in its
//! record of the request (`state_at_dispatch` of the observation the report completes),
//! and training builds the vector from it with this same function: prediction and
//! training cannot disagree on what a feature means (no train/serve skew).
//!
//! The last two columns are the analytic prior's prediction for the row, in log
//! space: the trees learn the residual `log(actual) - log(prior)` (`gbdt`), and the
//! exported ONNX graph adds the column back, so the prior is an input column of
//! one standard graph rather than code beside it.

use headroom_protocol::{EndpointState, RequestFeatures};

use super::prior::AnalyticPrior;

pub use super::columns::{Row, COUNT, HARDWARE_CLASS, NAMES, PREFILL_TOKENS_PER_S, PRIOR_LOG_TPOT, PRIOR_LOG_TTFT};

/// The features of `request` on an endpoint in `state`.
///
/// | column | from |
/// | --- | --- |
/// | kv_usage | `vllm:kv_cache_usage_perc` at the last scrape |
/// | input_tokens | the request's prompt tokens (shared approximation) |
/// | waiting, running | `vllm:num_requests_waiting` / `_running` at the last scrape |
/// | prefix_match | share of the prompt's blocks the endpoint likely caches |
/// | prefill_backlog_tokens | uncached prompt tokens dispatched there that the engine has likely not prefilled yet (`EndpointState::prefill_backlog_tokens`; from an older predictor's state, every uncached token not yet past its first token) |
/// | effective_input_tokens | `(1 - prefix_match) * input_tokens`: prompt tokens left to prefill |
/// | in_flight | requests dispatched there and not yet reported |
/// | tokens_in_flight | prompt + expected output tokens of those requests (KV they will read) |
/// | hardware_class | the endpoint's class from the pool config (0: unknown), so one pool can mix GPUs |
/// | recent_tpot_ms | the time between tokens it runs at now: its inter-token latency histogram between scrapes, else a moving average of TPOTs reported there (0: neither yet) |
/// | prefill_tokens_per_s | uncached prompt tokens dispatched there per second, decaying over 5 s: prefill that will share its steps |
/// | prior_log_ttft, prior_log_tpot | `ln` of the analytic prior's TTFT and TPOT for the columns above |
pub fn row(request: &RequestFeatures, state: &EndpointState, prior: &AnalyticPrior) -> Row {
    let prefix = state.prefix_match.clamp(0.0, 1.0);
    let input = request.input_tokens as f32;
    let mut row = [
        state.kv_usage as f32,
        input,
        state.waiting as f32,
        state.running as f32,
        prefix as f32,
        state.prefill_backlog_tokens.unwrap_or(state.uncached_tokens_in_flight) as f32,
        (1.0 - prefix as f32) * input,
        state.in_flight as f32,
        state.tokens_in_flight as f32,
        state.hardware_class as f32,
        state.recent_tpot_ms.unwrap_or(0.0) as f32,
        state.prefill_tokens_per_s as f32,
        0.0,
        0.0,
    ];
    let (ttft, tpot) = prior.predict(&row);
    // The prior is positive by construction; the floor keeps a broken constant from
    // writing -inf into a row.
    row[PRIOR_LOG_TTFT] = ttft.max(1e-3).ln() as f32;
    row[PRIOR_LOG_TPOT] = tpot.max(1e-3).ln() as f32;
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_tokens_follow_prefix() {
        let req = RequestFeatures { input_tokens: 1000, ..Default::default() };
        let state = EndpointState { prefix_match: 0.25, hardware_class: 2, ..Default::default() };
        let prior = AnalyticPrior::default();
        let r = row(&req, &state, &prior);
        assert_eq!(r[6], 750.0);
        assert_eq!(r[9], 2.0);
        assert_eq!(NAMES.len(), r.len());
        assert_eq!(NAMES[HARDWARE_CLASS], "hardware_class");
        assert_eq!(NAMES[PREFILL_TOKENS_PER_S], "prefill_tokens_per_s");
        // The backlog the engine has left, where the predictor gave it; an older one's
        // state has only the tokens not yet past their first token.
        let both = EndpointState { uncached_tokens_in_flight: 900, prefill_backlog_tokens: Some(300), ..state.clone() };
        assert_eq!(row(&req, &both, &prior)[5], 300.0);
        let older = EndpointState { prefill_backlog_tokens: None, ..both };
        assert_eq!(row(&req, &older, &prior)[5], 900.0);
        let (ttft, tpot) = prior.predict(&r);
        assert!((f64::from(r[PRIOR_LOG_TTFT]) - ttft.ln()).abs() < 1e-5);
        assert!((f64::from(r[PRIOR_LOG_TPOT]) - tpot.ln()).abs() < 1e-5);
    }
}
