//! An LRU set of prefix block hashes ([`crate::tokens::prefix_block_hashes`]).
//!
//! The simulated server keeps its prefix cache in one; predictor-svc keeps one
//! per endpoint to estimate what that server's cache holds (it cannot see it,
//! so it remembers the blocks of the requests dispatched there).

use std::collections::{HashMap, VecDeque};

/// An LRU set of prefix block hashes.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    capacity: usize,
    clock: u64,
    /// Keyed with foldhash, seeded at random per cache: the keys are already hashes, and a
    /// lookup per block per endpoint per prediction made std's SipHash a seventh of the
    /// simulated bench's CPU; random seeds keep the resistance to keys chosen to collide
    /// (the blocks come from clients' prompts).
    last_use: HashMap<u64, u64, foldhash::fast::RandomState>,
    /// (hash, use time) in use order; entries superseded by a later use are skipped on eviction.
    order: VecDeque<(u64, u64)>,
}

impl PrefixCache {
    pub fn new(capacity: usize) -> Self {
        PrefixCache { capacity: capacity.max(1), clock: 0, last_use: HashMap::default(), order: VecDeque::new() }
    }

    /// Records these blocks as held and most recently used.
    pub fn insert(&mut self, hashes: &[u64]) {
        for h in hashes {
            self.clock += 1;
            self.last_use.insert(*h, self.clock);
            self.order.push_back((*h, self.clock));
        }
        self.shrink_to(self.capacity);
    }

    /// Evicts least recently used blocks until at most `blocks` remain.
    pub fn shrink_to(&mut self, blocks: usize) {
        while self.last_use.len() > blocks {
            let Some((h, t)) = self.order.pop_front() else { break };
            if self.last_use.get(&h) == Some(&t) {
                self.last_use.remove(&h);
            }
        }
        if self.order.len() > 2 * self.capacity {
            let live = &self.last_use;
            self.order.retain(|(h, t)| live.get(h) == Some(t));
        }
    }

    /// How many of `hashes`, from the first, are held without a gap.
    pub fn matched_blocks(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.last_use.contains_key(h)).count()
    }

    /// Share of `hashes` held as an unbroken prefix (0 when `hashes` is empty).
    pub fn match_fraction(&self, hashes: &[u64]) -> f64 {
        if hashes.is_empty() {
            return 0.0;
        }
        self.matched_blocks(hashes) as f64 / hashes.len() as f64
    }

    /// Blocks remembered.
    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_match_counts_leading_blocks() {
        let mut p = PrefixCache::new(100);
        p.insert(&[1, 2, 3]);
        assert_eq!(p.match_fraction(&[1, 2, 3, 4]), 0.75);
        assert_eq!(p.match_fraction(&[9, 2, 3]), 0.0);
        assert_eq!(p.match_fraction(&[]), 0.0);
    }

    #[test]
    fn evicts_least_recently_used() {
        let mut p = PrefixCache::new(3);
        p.insert(&[1, 2, 3]);
        p.insert(&[1]); // 1 is fresh again
        p.insert(&[4]); // evicts 2
        assert_eq!(p.len(), 3);
        assert_eq!(p.match_fraction(&[1]), 1.0);
        assert_eq!(p.match_fraction(&[2]), 0.0);
        for i in 0..1000 {
            p.insert(&[i % 5]);
        }
        assert!(p.order.len() <= 6 + 1);
    }

    #[test]
    fn shrink_keeps_the_newest() {
        let mut p = PrefixCache::new(10);
        p.insert(&[1, 2, 3, 4]);
        p.shrink_to(2);
        assert_eq!(p.matched_blocks(&[3, 4]), 2);
        assert_eq!(p.matched_blocks(&[1]), 0);
        assert_eq!(p.len(), 2);
    }
}
