//! Choosing an endpoint from the predictor's answer.
//!
//! Headroom is the slack between a stated SLO and the prediction:
//! `ttft = slo_ttft - predicted_ttft`, and for streaming requests with a TPOT
//! SLO `tpot = min(slo_tpot, tightest TPOT SLO running there) * buffer -
//! predicted_tpot`. Only the SLOs the request stated are judged. Endpoints
//! where every judged headroom is >= 0 form the positive tier; the rest (and
//! endpoints without a prediction) the negative tier.
//!
//! Pipeline for a request that asked for SLO routing:
//! 1. tiers, the positive one cut to the endpoints flow control cleared a request it held
//!    or let go for (`FlowAnswer::cleared`); with probability `negative_tier_epsilon`
//!    explore the negative tier;
//! 2. within the chosen positive tier, prefix affinity (strict, then loose
//!    threshold), unless the affine endpoints' best predicted TTFT is worse than
//!    the others' by more than `prefix_ttft_penalty_ms`. Unlike the reference,
//!    affinity runs inside the tier, so it can never move a request from an
//!    endpoint predicted to meet its SLO to one predicted to miss it;
//! 3. score (`least` bin-packs, `most` spreads) and weighted random pick (A-Res);
//! 4. nothing positive: shed a sheddable request (priority < 0) when every
//!    endpoint has a prediction and none is idle or cold. Otherwise, where some
//!    endpoints would meet the request's own SLOs and fail only the running
//!    requests' tighter TPOT SLO, the one where the fewest such requests run, the
//!    busiest among equals (the harm is done there already), or, for a request released
//!    from the flow queue, one where still fewer run that it reaches late by no more than
//!    it waited. Else, on the endpoints caching the prompt unless moving gains the
//!    request more time than the prefill it adds elsewhere (`stay_where_cached`),
//!    idle endpoints first, then the smallest deficit (only TPOT short, only TTFT
//!    short, both short).

pub use headroom_protocol::headroom::{headroom, least_harm_with_own_room, Headroom, SloBuffers};
use headroom_protocol::{EndpointPrediction, EndpointState, FlowAnswer, RequestFeatures, RouteSource};

use crate::config::{DefaultProfile, FilterConfig, Strategy};
use crate::fallback;
use headroom_protocol::rng::Rng;

/// Smallest weight an eligible endpoint gets, so none is starved outright.
const MIN_WEIGHT: f64 = 0.01;

/// What the policy decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Route to `endpoints[ranked[0]]`; the rest are fallbacks for retries
    /// (at most `fallback_endpoints` of them).
    Route { ranked: Vec<usize>, source: RouteSource },
    /// Reject with 429: sheddable and no endpoint can serve it in time.
    Shed,
    /// No endpoint has a prediction: the caller falls back.
    NoPrediction,
}

/// Decides where `request` goes among `endpoints`.
///
/// `slo_routing` is true when the caller asked for prediction-based
/// scheduling; otherwise the default profile places it. `flow` is flow control's answer,
/// when the request offered to wait: `waited_ms`, what it spent in the queue (already taken
/// from `request`'s TTFT SLO), is how late its first token may be to keep it from slowing
/// tighter decodes ([`least_harm_with_own_room`]); `cleared`, the endpoints it was let go
/// to, bounds the positive tier (`within_cleared`).
pub fn decide(
    request: &RequestFeatures,
    endpoints: &[EndpointPrediction],
    slo_routing: bool,
    flow: Option<&FlowAnswer>,
    config: &FilterConfig,
    rng: &mut Rng,
) -> Decision {
    let waited_ms = flow.map_or(0.0, |f| f.waited_ms);
    if !endpoints.iter().any(|e| e.ttft_ms.is_some()) {
        return Decision::NoPrediction;
    }
    if !(slo_routing && request.slo.is_set()) {
        return default_profile(request, endpoints, config, rng);
    }
    let judged: Vec<Option<Headroom>> = endpoints.iter().map(|e| headroom(request, e, config.slo_buffers())).collect();
    let positive: Vec<usize> = (0..endpoints.len()).filter(|&i| judged[i].is_some_and(|h| h.is_positive())).collect();
    let negative: Vec<usize> = (0..endpoints.len()).filter(|i| !positive.contains(i)).collect();
    let positive = within_cleared(positive, endpoints, flow.map_or(&[], |f| &f.cleared));

    // Exploration probes endpoints predicted short, to learn where the model is wrong; one
    // without a prediction (no fresh metrics) has nothing to check and is not probed.
    let explorable = negative.iter().any(|&i| judged[i].is_some());
    let explore = explorable && rng.next_f64() < config.negative_tier_epsilon;
    if !positive.is_empty() && !explore {
        let tier = prefix_affinity(&positive, endpoints, config, rng);
        let weights = score(&tier, &judged, config.strategy, config.ttft_weight);
        let ranked = with_fallbacks(order_weighted(&tier, &weights, rng), endpoints, config.fallback_endpoints);
        return Decision::Route { ranked, source: RouteSource::PredictedPositive };
    }
    let all_predicted = judged.iter().all(Option::is_some);
    if request.is_sheddable() && positive.is_empty() && all_predicted && !has_idle_or_cold(endpoints, config) {
        return Decision::Shed;
    }
    // It meets its own SLOs somewhere, but only by slowing the requests running there past
    // their TPOT SLO (a batch request where interactive ones decode): where it slows the
    // fewest of them, and among equals the busiest, where that harm is done already,
    // rather than the least busy, where tight requests still meet theirs; having waited in
    // the flow queue, late where it slows fewer still.
    if positive.is_empty() {
        if let Some(least_harm) = least_harm_with_own_room(request, endpoints, config.slo_buffers(), waited_ms) {
            let ranked = with_fallbacks(vec![least_harm], endpoints, config.fallback_endpoints);
            return Decision::Route { ranked, source: RouteSource::PredictedNegative };
        }
    }
    let negative = stay_where_cached(&negative, request, endpoints, config, rng);
    let choice = pick_negative(&negative, &judged, endpoints, config.ttft_weight, rng);
    let ranked = with_fallbacks(vec![choice], endpoints, config.fallback_endpoints);
    Decision::Route { ranked, source: RouteSource::PredictedNegative }
}

/// The positive tier cut to the endpoints flow control cleared the request for (its queue
/// within the dispatch horizon there, or its SLO pressing), so the horizon it checked holds
/// where the request goes; the whole tier when nothing is cleared (no flow control, or an
/// older predictor) or none of the cleared endpoints is in it (ejected since, say). The
/// endpoints cut stay fallbacks for retries.
fn within_cleared(positive: Vec<usize>, endpoints: &[EndpointPrediction], cleared: &[String]) -> Vec<usize> {
    let kept: Vec<usize> = positive.iter().copied().filter(|&i| cleared.contains(&endpoints[i].address)).collect();
    if kept.is_empty() {
        positive
    } else {
        kept
    }
}

fn is_idle(s: &EndpointState) -> bool {
    s.in_flight == 0 && s.running == 0 && s.waiting == 0
}

fn has_idle_or_cold(endpoints: &[EndpointPrediction], config: &FilterConfig) -> bool {
    endpoints.iter().any(|e| is_idle(&e.state) || e.state.kv_usage < config.cold_kv_usage)
}

/// Prefix affinity within `tier`: strict, then loose threshold, each behind the
/// TTFT penalty gate; skipped with probability `prefix_explore_epsilon`.
fn prefix_affinity(
    tier: &[usize],
    endpoints: &[EndpointPrediction],
    config: &FilterConfig,
    rng: &mut Rng,
) -> Vec<usize> {
    if rng.next_f64() < config.prefix_explore_epsilon {
        return tier.to_vec();
    }
    let strict = affinity_pass(tier, endpoints, config.prefix_strict_threshold, config.prefix_ttft_penalty_ms);
    affinity_pass(&strict, endpoints, config.prefix_loose_threshold, config.prefix_ttft_penalty_ms)
}

/// Prefix affinity for a request nowhere in time: the fleet is behind, and a request moved
/// off the endpoints caching its prompt is prefilled again where it goes, work every request
/// queued there waits for (seconds for a conversation on an engine that queues; tens of
/// milliseconds for a system prompt on a GPU). It stays with the cache unless moving gains it
/// more time than the move adds ([`refill_ms`]), and moves past `prefix_ttft_penalty_ms`
/// either way. The positive tier needs no such test: there the request keeps its goals.
fn stay_where_cached(
    tier: &[usize],
    request: &RequestFeatures,
    endpoints: &[EndpointPrediction],
    config: &FilterConfig,
    rng: &mut Rng,
) -> Vec<usize> {
    let threshold = config.prefix_loose_threshold;
    if threshold <= 0.0 || rng.next_f64() < config.prefix_explore_epsilon {
        return tier.to_vec();
    }
    let (holders, others): (Vec<usize>, Vec<usize>) =
        tier.iter().partition(|&&i| endpoints[i].state.prefix_match >= threshold);
    let fastest = |set: &[usize]| {
        set.iter().filter_map(|&i| endpoints[i].ttft_ms.map(|t| (t, i))).min_by(|a, b| a.0.total_cmp(&b.0))
    };
    let (Some((held, h)), Some((other, o))) = (fastest(&holders), fastest(&others)) else {
        return tier.to_vec();
    };
    let gain = held - other;
    if gain <= refill_ms(request, &endpoints[h], &endpoints[o]).min(config.prefix_ttft_penalty_ms) {
        holders
    } else {
        tier.to_vec()
    }
}

/// What moving `request` from `holder` to `other` adds to `other`'s work (ms): the prompt
/// tokens the holder caches and `other` does not, at `other`'s cost per prompt token. The
/// predicted TTFT cannot stand in for that cost: on a fast engine behind a queue it is
/// mostly the queue (a 1,500-token system prompt refilled on a loaded H100 costs ~45 ms of
/// a predicted 800), and staying where the prompt is cached then piled the prompt's
/// requests onto its holders. Unknown cost: nothing, so the request goes where it is sooner.
fn refill_ms(request: &RequestFeatures, holder: &EndpointPrediction, other: &EndpointPrediction) -> f64 {
    let saved = (holder.state.prefix_match - other.state.prefix_match).max(0.0) * f64::from(request.input_tokens);
    other.state.prefill_ms_per_token.map_or(0.0, |ms| saved * ms)
}

fn affinity_pass(set: &[usize], endpoints: &[EndpointPrediction], threshold: f64, penalty_ms: f64) -> Vec<usize> {
    let (affine, other): (Vec<usize>, Vec<usize>) =
        set.iter().partition(|&&i| endpoints[i].state.prefix_match >= threshold && threshold > 0.0);
    if affine.is_empty() || other.is_empty() {
        return set.to_vec();
    }
    let best = |s: &[usize]| s.iter().filter_map(|&i| endpoints[i].ttft_ms).fold(f64::INFINITY, f64::min);
    if best(&affine) - best(&other) > penalty_ms {
        return set.to_vec();
    }
    affine
}

/// Weights over the positive tier from min-max normalised headroom.
fn score(tier: &[usize], judged: &[Option<Headroom>], strategy: Strategy, ttft_weight: f64) -> Vec<f64> {
    let ttft: Vec<Option<f64>> = tier.iter().map(|&i| judged[i].and_then(|h| h.ttft)).collect();
    let tpot: Vec<Option<f64>> = tier.iter().map(|&i| judged[i].and_then(|h| h.tpot)).collect();
    blend(&ttft, &tpot, ttft_weight)
        .into_iter()
        .map(|c| match strategy {
            Strategy::Least => (1.0 - c).max(MIN_WEIGHT),
            Strategy::Most => c.max(MIN_WEIGHT),
        })
        .collect()
}

/// All candidates short: an idle endpoint if any, else the first non-empty
/// group of (only TPOT short, only TTFT short, both short), smallest deficit
/// weighted most. Endpoints without predictions come last.
fn pick_negative(
    tier: &[usize],
    judged: &[Option<Headroom>],
    endpoints: &[EndpointPrediction],
    ttft_weight: f64,
    rng: &mut Rng,
) -> usize {
    // An endpoint without a prediction has no fresh metrics: its last state (often all zeros,
    // and nothing routed there since) says nothing, so it is not idle, only unknown. Such
    // endpoints are picked only when none has a prediction.
    let predicted: Vec<usize> = tier.iter().copied().filter(|&i| judged[i].is_some()).collect();
    let tier = if predicted.is_empty() { tier } else { predicted.as_slice() };
    let idle: Vec<usize> = tier.iter().copied().filter(|&i| is_idle(&endpoints[i].state)).collect();
    if !idle.is_empty() {
        return idle[(rng.next_u64() % idle.len() as u64) as usize];
    }
    let group_of = |i: usize| judged[i].and_then(|h| deficit_group(&h));
    let Some(best) = tier.iter().filter_map(|&i| group_of(i)).min() else {
        return tier[(rng.next_u64() % tier.len().max(1) as u64) as usize];
    };
    let members: Vec<usize> = tier.iter().copied().filter(|&i| group_of(i) == Some(best)).collect();
    let deficit = |f: fn(&Headroom) -> Option<f64>| -> Vec<Option<f64>> {
        members.iter().map(|&i| judged[i].and_then(|h| f(&h)).map(|v| -v.min(0.0))).collect()
    };
    let combined = blend(&deficit(|h| h.ttft), &deficit(|h| h.tpot), ttft_weight);
    let weights: Vec<f64> = combined.iter().map(|c| (1.0 - c).max(MIN_WEIGHT)).collect();
    members[pick_weighted(&weights, rng).unwrap_or(0)]
}

/// Rank of a negative endpoint: 0 only TPOT short, 1 only TTFT short, 2 both.
fn deficit_group(h: &Headroom) -> Option<u8> {
    let short = |v: Option<f64>| v.is_some_and(|v| v < 0.0);
    match (short(h.ttft), short(h.tpot)) {
        (false, true) => Some(0),
        (true, false) => Some(1),
        (true, true) => Some(2),
        (false, false) => None,
    }
}

/// Requests without SLO routing: lowest predicted latency, or the composite.
fn default_profile(
    request: &RequestFeatures,
    endpoints: &[EndpointPrediction],
    config: &FilterConfig,
    rng: &mut Rng,
) -> Decision {
    match config.default_profile {
        DefaultProfile::Composite => {
            let states: Vec<&EndpointState> = endpoints.iter().map(|e| &e.state).collect();
            // The states are the predictor's, fresh for this request: nothing to add.
            let ranked = fallback::rank_composite(&states, &[], rng);
            let ranked = ranked.into_iter().take(1 + config.fallback_endpoints).collect();
            Decision::Route { ranked, source: RouteSource::Composite }
        }
        // A heuristic over the endpoint state, reported as composite (no prediction judged).
        DefaultProfile::PrefixLoad => {
            let mut ranked = crate::prefix_load::rank(request, endpoints, &config.prefix_load, rng);
            ranked.truncate(1 + config.fallback_endpoints);
            Decision::Route { ranked, source: RouteSource::Composite }
        }
        DefaultProfile::LowestLatency => {
            let predicted: Vec<usize> = (0..endpoints.len()).filter(|&i| endpoints[i].ttft_ms.is_some()).collect();
            let ttft: Vec<Option<f64>> = predicted.iter().map(|&i| endpoints[i].ttft_ms).collect();
            let tpot: Vec<Option<f64>> = predicted.iter().map(|&i| endpoints[i].tpot_ms).collect();
            let cost = blend(&ttft, &tpot, config.ttft_weight);
            // Lowest cost first; ties broken at random.
            let mut keyed: Vec<(f64, u64, usize)> =
                predicted.iter().zip(&cost).map(|(&i, &c)| (c, rng.next_u64(), i)).collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let order = keyed.into_iter().map(|(_, _, i)| i).collect();
            let ranked = with_fallbacks(order, endpoints, config.fallback_endpoints);
            Decision::Route { ranked, source: RouteSource::PredictedPositive }
        }
    }
}

/// `order` (choice first) extended by the other endpoints, fastest predicted
/// TTFT first, cut to the choice plus `fallbacks`.
fn with_fallbacks(mut order: Vec<usize>, endpoints: &[EndpointPrediction], fallbacks: usize) -> Vec<usize> {
    let mut rest: Vec<usize> = (0..endpoints.len()).filter(|i| !order.contains(i)).collect();
    rest.sort_by(|&a, &b| {
        let t = |i: usize| endpoints[i].ttft_ms.unwrap_or(f64::INFINITY);
        t(a).total_cmp(&t(b))
    });
    order.extend(rest);
    order.truncate(1 + fallbacks);
    order
}

/// TTFT and TPOT figures (headroom, deficit or latency) of each candidate, each min-max
/// normalised to 0..=1 (a missing value counts as the lowest), blended `ttft_weight` to
/// `1 - ttft_weight`. Only a figure that differs between the candidates is blended: one that
/// says nothing (absent, or equal everywhere: the TTFT deficit of candidates short only on
/// TPOT) would otherwise squeeze the other into part of the range. With the default weight
/// of 0.8 on TTFT, candidates that differed only in TPOT got weights of 0.8 to 1.0, a
/// near-uniform pick: on the azure trace held past the cliff, 5-16% of the interactive
/// requests went to the two A100s, predicted (rightly) at 1.6x the H100s' TPOT, and 82-99%
/// of those missed it (docs/notebook/flow-control.md, "When nothing is in time").
fn blend(ttft: &[Option<f64>], tpot: &[Option<f64>], ttft_weight: f64) -> Vec<f64> {
    match (min_max(ttft), min_max(tpot)) {
        (Some(a), Some(b)) => a.iter().zip(&b).map(|(a, b)| ttft_weight * a + (1.0 - ttft_weight) * b).collect(),
        (Some(only), None) | (None, Some(only)) => only,
        (None, None) => vec![0.0; ttft.len()],
    }
}

/// Min-max normalisation to 0..=1, missing values at 0; `None` when the present values do
/// not differ (or none is present): nothing to rank by.
fn min_max(values: &[Option<f64>]) -> Option<Vec<f64>> {
    let present = values.iter().flatten();
    let lo = present.clone().copied().fold(f64::INFINITY, f64::min);
    let hi = present.copied().fold(f64::NEG_INFINITY, f64::max);
    (hi > lo).then(|| values.iter().map(|v| v.map_or(0.0, |v| (v - lo) / (hi - lo))).collect())
}

/// `items` in weighted random order (A-Res keys, highest first): the first is a
/// weighted pick, the rest follow in the order further picks would come.
fn order_weighted(items: &[usize], weights: &[f64], rng: &mut Rng) -> Vec<usize> {
    let mut keyed: Vec<(f64, usize)> = items.iter().zip(weights).map(|(&i, &w)| (a_res_key(w, rng), i)).collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0));
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// A-Res key `ln(u) / w` (orders like `u^(1/w)` without underflow); weights
/// <= 0 get -inf, so they come last.
fn a_res_key(weight: f64, rng: &mut Rng) -> f64 {
    let u = rng.next_f64();
    if weight > 0.0 && weight.is_finite() {
        u.ln() / weight
    } else {
        f64::NEG_INFINITY
    }
}

/// Weighted random pick (A-Res: key = u^(1/w), highest key wins). Weights
/// <= 0 are never picked unless all are, then the pick is uniform.
pub fn pick_weighted(weights: &[f64], rng: &mut Rng) -> Option<usize> {
    if weights.is_empty() {
        return None;
    }
    if !weights.iter().any(|w| *w > 0.0 && w.is_finite()) {
        return Some((rng.next_u64() % weights.len() as u64) as usize);
    }
    let items: Vec<usize> = (0..weights.len()).collect();
    order_weighted(&items, weights, rng).first().copied()
}

#[cfg(test)]
mod tests;
