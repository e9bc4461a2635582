//! llm-d's default scheduling ("optimized baseline") as a placement profile:
//! a prefix-cache affinity filter, then a token-load scorer and a max-score pick.
//!
//! Built from the documented behaviour of llm-d-router's `prefix-cache-affinity-filter`
//! and `token-load-scorer` (their READMEs and the "Sticky Until Saturated" post), on
//! the state the predictor already keeps per endpoint:
//!
//! 1. **Affinity filter.** Endpoints whose prefix match for this request is at least
//!    `affinity_threshold` (0.80) are sticky; with none, all stay. Load gate: each
//!    endpoint's TTFT is estimated as its in-flight uncached prompt tokens plus this
//!    request's uncached tokens there, over `peak_prefill_tokens_per_s` (15928); when
//!    the best sticky estimate trails the best non-sticky one by more than
//!    `max_ttft_penalty_ms` (18000; 0: always stick), stickiness breaks and all stay.
//! 2. **Token-load scorer.** `1 - min(1, tokens / queue_threshold_tokens)` with `tokens`
//!    the endpoint's uncached prompt tokens in flight (prompts not yet past their first
//!    token) plus this request's uncached tokens there; `queue_threshold_tokens`
//!    4194304.
//! 3. **Max-score pick**, ties at random.
//!
//! The defaults are llm-d's (its peak prefill throughput is calibrated for Qwen3-32B
//! on two H100s); `exploration` (llm-d's `explorationProbability`, default 0) skips
//! the filter for that share of requests.

use headroom_protocol::{EndpointPrediction, RequestFeatures};
use serde::Deserialize;

use headroom_protocol::rng::Rng;

/// The profile's knobs, with llm-d's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefixLoadConfig {
    pub affinity_threshold: f64,
    pub exploration: f64,
    pub max_ttft_penalty_ms: f64,
    pub peak_prefill_tokens_per_s: f64,
    pub queue_threshold_tokens: f64,
}

impl Default for PrefixLoadConfig {
    fn default() -> Self {
        PrefixLoadConfig {
            affinity_threshold: 0.80,
            exploration: 0.0,
            max_ttft_penalty_ms: 18_000.0,
            peak_prefill_tokens_per_s: 15_928.0,
            queue_threshold_tokens: 4_194_304.0,
        }
    }
}

impl PrefixLoadConfig {
    /// The first field out of range and why.
    pub fn invalid(&self) -> Option<(&'static str, &'static str)> {
        if !(0.0..=1.0).contains(&self.affinity_threshold) {
            return Some(("prefix_load.affinity_threshold", "must be within 0..=1"));
        }
        if !(0.0..=1.0).contains(&self.exploration) {
            return Some(("prefix_load.exploration", "must be within 0..=1"));
        }
        if !(self.max_ttft_penalty_ms.is_finite() && self.max_ttft_penalty_ms >= 0.0) {
            return Some(("prefix_load.max_ttft_penalty_ms", "must be a number >= 0"));
        }
        if !(self.peak_prefill_tokens_per_s.is_finite() && self.peak_prefill_tokens_per_s > 0.0) {
            return Some(("prefix_load.peak_prefill_tokens_per_s", "must be a number > 0"));
        }
        if !(self.queue_threshold_tokens.is_finite() && self.queue_threshold_tokens >= 1.0) {
            return Some(("prefix_load.queue_threshold_tokens", "must be a number >= 1"));
        }
        None
    }
}

/// Endpoint indices, the pick first, then the rest by score (fallbacks for retries).
pub fn rank(
    request: &RequestFeatures,
    endpoints: &[EndpointPrediction],
    c: &PrefixLoadConfig,
    rng: &mut Rng,
) -> Vec<usize> {
    // This request's prompt tokens an endpoint would still have to prefill.
    let uncached = |i: usize| (1.0 - endpoints[i].state.prefix_match.clamp(0.0, 1.0)) * f64::from(request.input_tokens);
    let tokens = |i: usize| endpoints[i].state.uncached_tokens_in_flight as f64 + uncached(i);
    let ttft_ms = |i: usize| tokens(i) / c.peak_prefill_tokens_per_s * 1000.0;
    let all: Vec<usize> = (0..endpoints.len()).collect();
    let (sticky, other): (Vec<usize>, Vec<usize>) =
        all.iter().partition(|&&i| endpoints[i].state.prefix_match >= c.affinity_threshold);
    let best = |set: &[usize]| set.iter().map(|&i| ttft_ms(i)).min_by(f64::total_cmp);
    let explore = c.exploration > 0.0 && rng.next_f64() < c.exploration;
    let stick = !sticky.is_empty()
        && !explore
        && match (best(&sticky), best(&other)) {
            (Some(s), Some(o)) => c.max_ttft_penalty_ms == 0.0 || s - o <= c.max_ttft_penalty_ms,
            _ => true,
        };
    let candidates = if stick { sticky } else { all };
    let score = |i: usize| 1.0 - (tokens(i) / c.queue_threshold_tokens).min(1.0);
    let mut keyed: Vec<(f64, u64, usize)> = candidates.iter().map(|&i| (score(i), rng.next_u64(), i)).collect();
    // Highest score first; ties at random.
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut ranked: Vec<usize> = keyed.into_iter().map(|(_, _, i)| i).collect();
    let mut rest: Vec<usize> = (0..endpoints.len()).filter(|i| !ranked.contains(i)).collect();
    rest.sort_by(|&a, &b| score(b).total_cmp(&score(a)));
    ranked.extend(rest);
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::EndpointState;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn endpoint(prefix_match: f64, uncached_in_flight: u64) -> EndpointPrediction {
        EndpointPrediction {
            address: format!("e{prefix_match}-{uncached_in_flight}"),
            ttft_ms: Some(100.0),
            tpot_ms: Some(10.0),
            state: EndpointState { prefix_match, uncached_tokens_in_flight: uncached_in_flight, ..Default::default() },
        }
    }

    fn pick(endpoints: &[EndpointPrediction], c: &PrefixLoadConfig) -> usize {
        let request = RequestFeatures { input_tokens: 1000, ..Default::default() };
        rank(&request, endpoints, c, &mut Rng::new(3))[0]
    }

    #[test]
    fn sticks_to_a_cached_endpoint_despite_more_prefill_in_flight() {
        // 10k tokens in flight there is well inside 18 s at 15928 tokens/s.
        let endpoints = [endpoint(0.0, 0), endpoint(0.9, 10_000)];
        assert_eq!(pick(&endpoints, &PrefixLoadConfig::default()), 1);
    }

    #[test]
    fn saturation_breaks_stickiness() {
        // 300k tokens is about 18.8 s of prefill, past the 18 s allowance.
        let endpoints = [endpoint(0.0, 0), endpoint(0.9, 300_000)];
        assert_eq!(pick(&endpoints, &PrefixLoadConfig::default()), 0);
        let always = PrefixLoadConfig { max_ttft_penalty_ms: 0.0, ..PrefixLoadConfig::default() };
        assert_eq!(pick(&endpoints, &always), 1, "a zero penalty always sticks");
    }

    #[test]
    fn without_sticky_endpoints_token_load_decides_counting_what_is_cached() {
        // Below the threshold: the smaller backlog wins, though the other caches more.
        assert_eq!(pick(&[endpoint(0.0, 100), endpoint(0.5, 1_000)], &PrefixLoadConfig::default()), 0);
        // The request's own uncached tokens count: 1000 here against 500 + 0 there.
        assert_eq!(pick(&[endpoint(0.0, 0), endpoint(0.5, 400)], &PrefixLoadConfig::default()), 1);
    }

    #[test]
    fn ties_spread_and_the_rest_follow_as_fallbacks() {
        let endpoints = [endpoint(0.0, 0), endpoint(0.0, 0), endpoint(0.0, 5_000)];
        let request = RequestFeatures { input_tokens: 10, ..Default::default() };
        let mut rng = Rng::new(1);
        let firsts: std::collections::BTreeSet<usize> =
            (0..50).map(|_| rank(&request, &endpoints, &PrefixLoadConfig::default(), &mut rng)[0]).collect();
        assert_eq!(firsts, [0, 1].into());
        let ranked = rank(&request, &endpoints, &PrefixLoadConfig::default(), &mut rng);
        assert_eq!((ranked.len(), ranked[2]), (3, 2));
    }
}
