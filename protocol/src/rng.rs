//! The one pseudo-random generator of the house (xorshift64*, its seed scrambled by
//! SplitMix64): the filter's weighted picks and exploration, the simulator's replayed
//! futures and the tests that walk random histories all draw from it, so a seed means the
//! same stream everywhere and nothing needs host entropy (the filter runs in a Wasm VM).

/// Seeded pseudo-random numbers: the same seed, the same stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; zero is remapped).
    pub fn new(seed: u64) -> Self {
        // SplitMix64 scramble so nearby seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Rng(if z == 0 { 0x2545_f491_4f6c_dd1d } else { z })
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in the open interval (0, 1).
    pub fn next_f64(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Uniform below `n` (0 for `n` of 0 or 1); the modulo bias is below 2^-40 for any
    /// `n` under 2^24, far under what a test or a simulated draw can see.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64().checked_rem(n).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn uniform_in_open_unit_interval() {
        let mut rng = Rng::new(0);
        let mut sum = 0.0;
        for _ in 0..100_000 {
            let x = rng.next_f64();
            assert!(x > 0.0 && x < 1.0);
            sum += x;
        }
        assert!((sum / 100_000.0 - 0.5).abs() < 0.01);
    }

    #[test]
    fn seeds_give_different_streams() {
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
        assert_eq!(Rng::new(7).next_u64(), Rng::new(7).next_u64());
    }

    #[test]
    fn below_stays_under_its_bound_and_reaches_every_value() {
        let mut rng = Rng::new(3);
        let mut seen = [false; 7];
        for _ in 0..1_000 {
            let x = rng.below(7);
            assert!(x < 7);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
    }
}
