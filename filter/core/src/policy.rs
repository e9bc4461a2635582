//! Choosing an endpoint from the predictor's answer.
//!
//! Headroom is the slack between a stated SLO and the prediction:
//! `ttft = slo_ttft - predicted_ttft`, and for streaming requests with a TPOT
//! SLO `tpot = min(slo_tpot, tightest TPOT SLO running there) * buffer -
//! predicted_tpot`. Only the SLOs the request stated are judged. Endpoints
//! where every judged headroom is >= 0 form the positive tier; the rest (and
//! endpoints without a prediction) the negative tier.

use headroom_protocol::{EndpointPrediction, RequestFeatures, RouteSource};

use crate::config::FilterConfig;
use crate::rng::Rng;

/// KV usage under which an endpoint counts as cold (has room to absorb a request).
pub const COLD_KV_USAGE: f64 = 0.02;
/// Smallest weight an eligible endpoint gets, so none is starved outright.
const MIN_WEIGHT: f64 = 0.01;

/// What the policy decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Route to `endpoints[index]`.
    Route { index: usize, source: RouteSource },
    /// Reject with 429: sheddable and no endpoint can serve it in time.
    Shed,
    /// No endpoint has a prediction: the caller falls back.
    NoPrediction,
}

/// Per-endpoint headroom of one request (`None`: that SLO is not judged).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headroom {
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
}

impl Headroom {
    fn is_positive(&self) -> bool {
        self.ttft.is_none_or(|h| h >= 0.0) && self.tpot.is_none_or(|h| h >= 0.0)
    }
}

/// Headroom of `request` on one endpoint; `None` when a judged SLO has no prediction.
pub fn headroom(request: &RequestFeatures, endpoint: &EndpointPrediction, tpot_buffer: f64) -> Option<Headroom> {
    let ttft = match request.slo.ttft_ms {
        Some(slo) => Some(slo - endpoint.ttft_ms?),
        None => None,
    };
    // A non-streaming caller never sees tokens one by one: TPOT is not judged.
    let tpot = match request.slo.tpot_ms {
        Some(slo) if request.streaming => {
            let target = match endpoint.state.tightest_tpot_slo_ms {
                Some(running) if running > 0.0 => slo.min(running),
                _ => slo,
            };
            Some(target * tpot_buffer - endpoint.tpot_ms?)
        }
        _ => None,
    };
    Some(Headroom { ttft, tpot })
}

/// Decides where `request` goes among `endpoints`.
///
/// `slo_routing` is true when the caller asked for prediction-based
/// scheduling; otherwise the lowest predicted latency wins.
pub fn decide(
    request: &RequestFeatures,
    endpoints: &[EndpointPrediction],
    slo_routing: bool,
    config: &FilterConfig,
    rng: &mut Rng,
) -> Decision {
    if !endpoints.iter().any(|e| e.ttft_ms.is_some()) {
        return Decision::NoPrediction;
    }
    if !(slo_routing && request.slo.is_set()) {
        return lowest_latency(endpoints, config.ttft_weight, rng);
    }
    let judged: Vec<Option<Headroom>> = endpoints.iter().map(|e| headroom(request, e, config.tpot_buffer)).collect();
    let positive: Vec<usize> = (0..endpoints.len()).filter(|&i| judged[i].is_some_and(|h| h.is_positive())).collect();
    let negative: Vec<usize> = (0..endpoints.len()).filter(|i| !positive.contains(i)).collect();

    let explore = !negative.is_empty() && rng.next_f64() < config.negative_tier_epsilon;
    if !positive.is_empty() && !explore {
        let index = pick_least_headroom(&positive, &judged, config.ttft_weight, rng);
        return Decision::Route { index, source: RouteSource::PredictedPositive };
    }
    if request.priority < 0 && positive.is_empty() && !has_idle_or_cold(endpoints) {
        return Decision::Shed;
    }
    let index = pick_negative(&negative, &judged, endpoints, config.ttft_weight, rng);
    Decision::Route { index, source: RouteSource::PredictedNegative }
}

fn is_idle(e: &EndpointPrediction) -> bool {
    e.state.in_flight == 0 && e.state.running == 0 && e.state.waiting == 0
}

fn has_idle_or_cold(endpoints: &[EndpointPrediction]) -> bool {
    endpoints.iter().any(|e| is_idle(e) || e.state.kv_usage < COLD_KV_USAGE)
}

/// Bin-packing within the positive tier: the least headroom gets the most
/// weight, so slack stays free on other endpoints for tighter requests.
fn pick_least_headroom(tier: &[usize], judged: &[Option<Headroom>], ttft_weight: f64, rng: &mut Rng) -> usize {
    let ttft: Vec<Option<f64>> = tier.iter().map(|&i| judged[i].and_then(|h| h.ttft)).collect();
    let tpot: Vec<Option<f64>> = tier.iter().map(|&i| judged[i].and_then(|h| h.tpot)).collect();
    let combined = combine(&min_max(&ttft), &min_max(&tpot), ttft_weight);
    let weights: Vec<f64> = combined.iter().map(|c| (1.0 - c).max(MIN_WEIGHT)).collect();
    tier[pick_weighted(&weights, rng).unwrap_or(0)]
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
    let idle: Vec<usize> = tier.iter().copied().filter(|&i| is_idle(&endpoints[i])).collect();
    if !idle.is_empty() {
        return idle[(rng.next_u64() % idle.len() as u64) as usize];
    }
    // The first non-empty group wins: only TPOT short, only TTFT short, both short.
    let group_of = |i: usize| judged[i].and_then(|h| deficit_group(&h));
    let Some(best) = tier.iter().filter_map(|&i| group_of(i)).min() else {
        return tier[(rng.next_u64() % tier.len().max(1) as u64) as usize];
    };
    let members: Vec<usize> = tier.iter().copied().filter(|&i| group_of(i) == Some(best)).collect();
    let deficit = |f: fn(&Headroom) -> Option<f64>| -> Vec<Option<f64>> {
        members.iter().map(|&i| judged[i].and_then(|h| f(&h)).map(|v| -v.min(0.0))).collect()
    };
    let combined = combine(&min_max(&deficit(|h| h.ttft)), &min_max(&deficit(|h| h.tpot)), ttft_weight);
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

/// The default profile: lowest predicted latency (weighted TTFT and TPOT), ties at random.
fn lowest_latency(endpoints: &[EndpointPrediction], ttft_weight: f64, rng: &mut Rng) -> Decision {
    let predicted: Vec<usize> = (0..endpoints.len()).filter(|&i| endpoints[i].ttft_ms.is_some()).collect();
    let ttft: Vec<Option<f64>> = predicted.iter().map(|&i| endpoints[i].ttft_ms).collect();
    let tpot: Vec<Option<f64>> = predicted.iter().map(|&i| endpoints[i].tpot_ms).collect();
    let cost = combine(&min_max(&ttft), &min_max(&tpot), ttft_weight);
    let best = cost.iter().copied().fold(f64::INFINITY, f64::min);
    let ties: Vec<usize> = predicted.iter().zip(&cost).filter(|(_, c)| **c <= best + 1e-12).map(|(i, _)| *i).collect();
    let index = ties[(rng.next_u64() % ties.len().max(1) as u64) as usize];
    Decision::Route { index, source: RouteSource::PredictedPositive }
}

/// Min-max normalisation to 0..=1; missing values and a zero range give 0.
fn min_max(values: &[Option<f64>]) -> Vec<f64> {
    let present = values.iter().flatten();
    let lo = present.clone().copied().fold(f64::INFINITY, f64::min);
    let hi = present.copied().fold(f64::NEG_INFINITY, f64::max);
    values
        .iter()
        .map(|v| match v {
            Some(v) if hi > lo => (v - lo) / (hi - lo),
            _ => 0.0,
        })
        .collect()
}

fn combine(ttft: &[f64], tpot: &[f64], ttft_weight: f64) -> Vec<f64> {
    ttft.iter().zip(tpot).map(|(a, b)| ttft_weight * a + (1.0 - ttft_weight) * b).collect()
}

/// Weighted random pick (A-Res: key = u^(1/w), highest key wins). Weights
/// <= 0 are never picked unless all are, then the pick is uniform.
pub fn pick_weighted(weights: &[f64], rng: &mut Rng) -> Option<usize> {
    if weights.is_empty() {
        return None;
    }
    if !weights.iter().any(|w| *w > 0.0) {
        return Some((rng.next_u64() % weights.len() as u64) as usize);
    }
    let mut best = None;
    let mut best_key = f64::NEG_INFINITY;
    for (i, w) in weights.iter().enumerate() {
        if *w <= 0.0 || !w.is_finite() {
            continue;
        }
        // ln(u)/w orders the same as u^(1/w) and does not underflow.
        let key = rng.next_f64().ln() / w;
        if key > best_key {
            best_key = key;
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::{EndpointState, Slo};

    fn ep(addr: &str, ttft: Option<f64>, tpot: Option<f64>) -> EndpointPrediction {
        EndpointPrediction {
            address: addr.into(),
            ttft_ms: ttft,
            tpot_ms: tpot,
            state: EndpointState { running: 4, in_flight: 4, kv_usage: 0.5, ..Default::default() },
        }
    }

    fn req(ttft: Option<f64>, tpot: Option<f64>, streaming: bool, priority: i32) -> RequestFeatures {
        RequestFeatures { slo: Slo { ttft_ms: ttft, tpot_ms: tpot }, streaming, priority, ..Default::default() }
    }

    fn cfg() -> FilterConfig {
        FilterConfig { negative_tier_epsilon: 0.0, ..FilterConfig::default() }
    }

    fn shares(request: &RequestFeatures, endpoints: &[EndpointPrediction], draws: usize) -> Vec<f64> {
        let mut rng = Rng::new(42);
        let mut counts = vec![0usize; endpoints.len()];
        for _ in 0..draws {
            if let Decision::Route { index, .. } = decide(request, endpoints, true, &cfg(), &mut rng) {
                counts[index] += 1;
            }
        }
        counts.iter().map(|c| *c as f64 / draws as f64).collect()
    }

    #[test]
    fn only_positive_tier_is_used() {
        let eps =
            [ep("a", Some(500.0), Some(10.0)), ep("b", Some(100.0), Some(10.0)), ep("c", Some(150.0), Some(10.0))];
        let s = shares(&req(Some(200.0), None, true, 0), &eps, 2000);
        assert_eq!(s[0], 0.0, "a misses the TTFT SLO");
        assert!(s[1] > 0.0 && s[2] > 0.0);
        assert!(s[2] > s[1], "bin-packing favours the smaller headroom: {s:?}");
    }

    #[test]
    fn tpot_not_judged_without_stream_or_slo() {
        let r = req(Some(200.0), Some(5.0), false, 0);
        let h = headroom(&r, &ep("a", Some(100.0), Some(50.0)), 1.0).unwrap();
        assert_eq!(h.tpot, None, "non-streaming requests are not judged on TPOT");
        let r = req(Some(200.0), None, true, 0);
        assert_eq!(headroom(&r, &ep("a", Some(100.0), Some(50.0)), 1.0).unwrap().tpot, None);
    }

    #[test]
    fn tpot_uses_tightest_running_slo() {
        let mut e = ep("a", Some(10.0), Some(20.0));
        e.state.tightest_tpot_slo_ms = Some(15.0);
        let h = headroom(&req(None, Some(50.0), true, 0), &e, 1.0).unwrap();
        assert_eq!(h.tpot, Some(-5.0));
    }

    #[test]
    fn sheddable_shed_only_when_nothing_can_serve() {
        let eps = [ep("a", Some(500.0), Some(10.0)), ep("b", Some(400.0), Some(10.0))];
        let mut rng = Rng::new(1);
        assert_eq!(decide(&req(Some(100.0), None, true, -1), &eps, true, &cfg(), &mut rng), Decision::Shed);
        assert!(matches!(
            decide(&req(Some(100.0), None, true, 0), &eps, true, &cfg(), &mut rng),
            Decision::Route { .. }
        ));
        let mut idle = eps.clone();
        idle[1].state = EndpointState::default();
        assert_eq!(
            decide(&req(Some(100.0), None, true, -1), &idle, true, &cfg(), &mut rng),
            Decision::Route { index: 1, source: RouteSource::PredictedNegative }
        );
    }

    #[test]
    fn missing_predictions_never_shed() {
        let eps = [ep("a", None, None), ep("b", None, None)];
        let mut rng = Rng::new(1);
        assert_eq!(decide(&req(Some(100.0), None, true, -1), &eps, true, &cfg(), &mut rng), Decision::NoPrediction);
    }

    #[test]
    fn without_slo_lowest_latency_wins() {
        let eps = [ep("a", Some(300.0), Some(10.0)), ep("b", Some(100.0), Some(10.0))];
        let mut rng = Rng::new(3);
        for _ in 0..50 {
            assert_eq!(
                decide(&req(None, None, true, 0), &eps, true, &cfg(), &mut rng),
                Decision::Route { index: 1, source: RouteSource::PredictedPositive }
            );
        }
    }

    #[test]
    fn exploration_rate_matches_epsilon() {
        let eps = [ep("a", Some(500.0), Some(10.0)), ep("b", Some(100.0), Some(10.0))];
        let config = FilterConfig { negative_tier_epsilon: 0.1, ..FilterConfig::default() };
        let mut rng = Rng::new(9);
        let n = 20_000;
        let negative = (0..n)
            .filter(|_| {
                decide(&req(Some(200.0), None, true, 0), &eps, true, &config, &mut rng)
                    == Decision::Route { index: 0, source: RouteSource::PredictedNegative }
            })
            .count();
        let rate = negative as f64 / n as f64;
        assert!((rate - 0.1).abs() < 0.01, "exploration rate {rate}");
    }

    #[test]
    fn weighted_pick_follows_weights() {
        let weights = [1.0, 2.0, 3.0, 0.0];
        let mut rng = Rng::new(5);
        let mut counts = [0usize; 4];
        let n = 60_000;
        for _ in 0..n {
            counts[pick_weighted(&weights, &mut rng).unwrap()] += 1;
        }
        for (i, w) in weights.iter().enumerate() {
            let share = counts[i] as f64 / n as f64;
            assert!((share - w / 6.0).abs() < 0.01, "endpoint {i}: share {share}, weight {w}");
        }
        assert_eq!(pick_weighted(&[], &mut rng), None);
        let uniform: Vec<usize> = (0..3000).map(|_| pick_weighted(&[0.0, 0.0, 0.0], &mut rng).unwrap()).collect();
        for i in 0..3 {
            assert!(uniform.iter().filter(|x| **x == i).count() > 800);
        }
    }
}
