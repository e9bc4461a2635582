//! Routing without predictions: a composite of the last endpoint state seen.
//!
//! score = (free KV + relative queue + prefix match) / 3, where relative queue
//! is `(max_waiting - waiting) / max_waiting` across the candidates. The
//! highest score wins; ties are broken at random.

use std::collections::HashMap;

use headroom_protocol::EndpointState;

use headroom_protocol::rng::Rng;

/// The last endpoint states a VM saw of each pool, with when it saw them.
#[derive(Debug, Clone, Default)]
pub struct StateCache {
    pools: HashMap<String, (Vec<(String, EndpointState)>, u64)>,
}

impl StateCache {
    /// Remembers the states of a predict answer for `pool` seen at `now_ms`.
    pub fn update(&mut self, pool: &str, endpoints: Vec<(String, EndpointState)>, now_ms: u64) {
        if endpoints.is_empty() {
            return;
        }
        match self.pools.get_mut(pool) {
            Some(seen) => *seen = (endpoints, now_ms),
            None => {
                self.pools.insert(pool.to_string(), (endpoints, now_ms));
            }
        }
    }

    /// The remembered states of `pool` if younger than `max_age_ms`.
    pub fn fresh(&self, pool: &str, now_ms: u64, max_age_ms: u64) -> Option<&[(String, EndpointState)]> {
        let (endpoints, seen_at_ms) = self.pools.get(pool)?;
        let fresh = !endpoints.is_empty() && now_ms.saturating_sub(*seen_at_ms) <= max_age_ms;
        fresh.then_some(endpoints.as_slice())
    }
}

/// Every endpoint's index, best composite score first, ties in random order. The queue
/// term counts each endpoint's waiting requests plus `placed[i]` (requests placed there
/// since the states were taken; missing entries count 0).
pub fn rank_composite(states: &[&EndpointState], placed: &[u32], rng: &mut Rng) -> Vec<usize> {
    let queued: Vec<f64> = states
        .iter()
        .enumerate()
        .map(|(i, s)| f64::from(s.waiting) + f64::from(placed.get(i).copied().unwrap_or(0)))
        .collect();
    let max_queued = queued.iter().copied().fold(0.0, f64::max);
    let scores: Vec<f64> = states
        .iter()
        .zip(&queued)
        .map(|(s, &q)| {
            let free_kv = 1.0 - s.kv_usage.clamp(0.0, 1.0);
            let queue = if max_queued > 0.0 { (max_queued - q) / max_queued } else { 1.0 };
            (free_kv + queue + s.prefix_match.clamp(0.0, 1.0)) / 3.0
        })
        .collect();
    let mut keyed: Vec<(f64, u64, usize)> = scores.iter().enumerate().map(|(i, &s)| (s, rng.next_u64(), i)).collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn st(kv: f64, waiting: u32, prefix: f64) -> EndpointState {
        EndpointState { kv_usage: kv, waiting, prefix_match: prefix, ..Default::default() }
    }

    #[test]
    fn prefers_free_kv_short_queue_and_prefix() {
        let mut rng = Rng::new(1);
        let a = st(0.9, 5, 0.0);
        let b = st(0.2, 0, 0.0);
        let best = |states: &[&EndpointState], rng: &mut Rng| rank_composite(states, &[], rng).first().copied();
        assert_eq!(best(&[&a, &b], &mut rng), Some(1));
        let c = st(0.2, 0, 1.0);
        assert_eq!(best(&[&a, &b, &c], &mut rng), Some(2));
        assert_eq!(best(&[], &mut rng), None);
        assert_eq!(rank_composite(&[&a, &b, &c], &[], &mut rng), vec![2, 1, 0]);
    }

    #[test]
    fn ties_spread() {
        let mut rng = Rng::new(2);
        let s = st(0.1, 0, 0.0);
        let picks: Vec<usize> =
            (0..300).filter_map(|_| rank_composite(&[&s, &s, &s], &[], &mut rng).first().copied()).collect();
        for i in 0..3 {
            assert!(picks.iter().filter(|p| **p == i).count() > 60);
        }
    }

    #[test]
    fn requests_placed_since_the_states_were_taken_spread_the_next_ones() {
        // Frozen states (the predictor is gone): the same endpoint would win every time.
        let (a, b, c) = (st(0.10, 0, 0.0), st(0.20, 0, 0.0), st(0.30, 0, 0.0));
        let states = [&a, &b, &c];
        let mut rng = Rng::new(3);
        let mut placed = [0u32; 3];
        for _ in 0..30 {
            let first = rank_composite(&states, &placed, &mut rng)[0];
            placed[first] += 1;
        }
        assert!(placed.iter().all(|&n| (5..=15).contains(&n)), "spread over all three: {placed:?}");
        // Without them, the least loaded endpoint takes everything.
        assert!((0..30).all(|_| rank_composite(&states, &[], &mut rng)[0] == 0));
    }

    #[test]
    fn stale_state_is_not_used_nor_another_pools() {
        let mut cache = StateCache::default();
        assert!(cache.fresh("p", 0, 1000).is_none());
        cache.update("p", vec![("a".into(), st(0.1, 0, 0.0))], 10_000);
        assert!(cache.fresh("p", 10_500, 1000).is_some());
        assert!(cache.fresh("q", 10_500, 1000).is_none(), "pool q was never seen");
        assert!(cache.fresh("p", 11_001, 1000).is_none());
    }
}
