//! Which predictor replica a pool's calls go to.
//!
//! With several predictor replicas, every proxy worker and every gateway pod must send
//! one pool's predictions, dispatches and reports to the *same* replica, or each replica
//! sees only part of the requests in flight. The owner is chosen by rendezvous hashing
//! of the pool name over the replica clusters: every filter with the same configuration
//! agrees without talking to the others, and removing a replica moves only its pools.
//! A replica that fails [`EJECT_AFTER_FAILURES`] calls in a row is skipped for
//! [`EJECT_MS`]; all filters then fail over to the same next replica in the pool's order.

/// Consecutive failed calls (no answer, 5xx, timeout) after which a replica is skipped.
pub const EJECT_AFTER_FAILURES: u32 = 3;
/// How long a failing replica is skipped before it is tried again.
pub const EJECT_MS: u64 = 5_000;

/// 64-bit FNV-1a, then a SplitMix64 finaliser so close strings score far apart.
fn score(cluster: &str, pool: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in cluster.bytes().chain([0u8]).chain(pool.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// `clusters` in the order `pool` prefers them (owner first). Ties cannot reorder:
/// equal scores keep configuration order.
pub fn preference(clusters: &[String], pool: &str) -> Vec<usize> {
    let mut order: Vec<usize> = (0..clusters.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(score(&clusters[i], pool)));
    order
}

/// The replicas of one pool, in preference order, with their recent health.
#[derive(Debug, Clone)]
pub struct Shards {
    clusters: Vec<String>,
    order: Vec<usize>,
    failures: Vec<u32>,
    down_until_ms: Vec<u64>,
}

impl Shards {
    /// `clusters` must not be empty (the configuration guarantees one).
    pub fn new(clusters: Vec<String>, pool: &str) -> Shards {
        let order = preference(&clusters, pool);
        let n = clusters.len();
        Shards { clusters, order, failures: vec![0; n], down_until_ms: vec![0; n] }
    }

    /// The cluster to call now: the first in preference order not skipped; the owner
    /// when every replica is skipped (something must be tried).
    pub fn current(&self, now_ms: u64) -> &str {
        let first_up = self.order.iter().find(|&&i| self.down_until_ms[i] <= now_ms);
        let i = first_up.or(self.order.first()).copied().unwrap_or(0);
        self.clusters.get(i).map_or("", String::as_str)
    }

    /// Where an item belonging to replica `home` goes now: there while it is one of these
    /// replicas and not skipped, else the current replica (`None`: the current one).
    pub fn route<'a>(&'a self, home: Option<&'a str>, now_ms: u64) -> &'a str {
        let up = |h: &&str| self.clusters.iter().position(|c| c == h).is_some_and(|i| self.down_until_ms[i] <= now_ms);
        match home.filter(up) {
            Some(h) => h,
            None => self.current(now_ms),
        }
    }

    /// Records the outcome of a call to `cluster`. Returns true when this call made
    /// the replica skipped.
    pub fn record(&mut self, cluster: &str, ok: bool, now_ms: u64) -> bool {
        let Some(i) = self.clusters.iter().position(|c| c == cluster) else { return false };
        if ok {
            self.failures[i] = 0;
            self.down_until_ms[i] = 0;
            return false;
        }
        self.failures[i] += 1;
        if self.failures[i] < EJECT_AFTER_FAILURES {
            return false;
        }
        self.failures[i] = 0;
        self.down_until_ms[i] = now_ms.saturating_add(EJECT_MS);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn clusters(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("headroom_predictor_{i}")).collect()
    }

    #[test]
    fn every_filter_agrees_on_the_owner() {
        let c = clusters(3);
        let a = Shards::new(c.clone(), "llama");
        let b = Shards::new(c, "llama");
        assert_eq!(a.current(0), b.current(0));
    }

    #[test]
    fn pools_spread_over_replicas() {
        let c = clusters(4);
        let mut owned = [0usize; 4];
        for p in 0..400 {
            owned[preference(&c, &format!("pool-{p}"))[0]] += 1;
        }
        assert!(owned.iter().all(|&n| (60..=140).contains(&n)), "{owned:?}");
    }

    #[test]
    fn removing_a_replica_moves_only_its_pools() {
        let four = clusters(4);
        let three: Vec<String> = four[..3].to_vec();
        for p in 0..200 {
            let pool = format!("pool-{p}");
            let before = &four[preference(&four, &pool)[0]];
            let after = &three[preference(&three, &pool)[0]];
            if before != "headroom_predictor_3" {
                assert_eq!(before, after, "{pool} moved although its owner stayed");
            }
        }
    }

    #[test]
    fn a_failing_owner_is_skipped_then_retried() {
        let mut s = Shards::new(clusters(2), "llama");
        let owner = s.current(0).to_string();
        assert!(!s.record(&owner, false, 10));
        assert!(!s.record(&owner, false, 20));
        assert_eq!(s.current(20), owner, "two failures are not enough");
        assert!(s.record(&owner, false, 30));
        let next = s.current(31).to_string();
        assert_ne!(next, owner);
        assert_eq!(s.current(30 + EJECT_MS), owner, "tried again after the pause");
        // A success in between clears the count.
        s.record(&owner, false, 40_000);
        s.record(&owner, true, 40_001);
        s.record(&owner, false, 40_002);
        s.record(&owner, false, 40_003);
        assert_eq!(s.current(40_004), owner);
    }

    #[test]
    fn all_down_still_tries_the_owner_and_one_replica_is_trivial() {
        let mut s = Shards::new(clusters(2), "p");
        let owner = s.current(0).to_string();
        for c in clusters(2) {
            for _ in 0..EJECT_AFTER_FAILURES {
                s.record(&c, false, 0);
            }
        }
        assert_eq!(s.current(1), owner);
        let single = Shards::new(vec!["headroom_predictor".into()], "p");
        assert_eq!(single.current(0), "headroom_predictor");
    }
}
