//! Prompt tokens as each model counts them, learned from the responses.
//!
//! The filter has no tokenizer. It starts from the shared approximation
//! (`headroom_protocol::tokens`: one token per 4 bytes) and learns each model's bytes per
//! token from the `usage.prompt_tokens` of the answers it relays: a tokenizer that packs
//! 2 bytes a token (code, other languages, filler text) would otherwise make every prompt
//! read half its size, and with it every token feature, in-flight book and token-load score
//! (measured on real vLLM: prompts counted as ~2,100 tokens were over 4,096 to the model).
//!
//! Per model, the ratio is total prompt bytes over total prompt tokens of the recent
//! responses (each older one weighing [`DECAY`] less per response), started from
//! [`PRIOR_TOKENS`] tokens' worth of the approximation, so one answer moves it most of the way
//! and an odd one cannot swing it. A pool-wide ratio answers for models not seen yet and for
//! header-only routing, which knows no model. Ratios are held to [`RATIO_BOUNDS`]; at most
//! [`MAX_MODELS`] models are tracked, so a client inventing model names cannot grow the map.
//!
//! Where the engine is the simulator, which counts with the approximation itself, the ratio
//! learned is the approximation's and nothing changes.

use std::collections::HashMap;

use headroom_protocol::limits;
use headroom_protocol::tokens::BYTES_PER_TOKEN;

/// Weight of a response against the one after it: about the last 50 responses count.
pub const DECAY: f64 = 0.98;
/// Tokens' worth of the approximation a ratio starts with (a short prompt's worth: the first
/// real answer of a few hundred tokens outweighs it).
pub const PRIOR_TOKENS: f64 = 64.0;
/// Bytes per token a learned ratio is held within.
pub const RATIO_BOUNDS: (f64, f64) = (0.5, 16.0);
/// Prompts shorter than this teach nothing: a chat template's fixed tokens dominate them.
pub const MIN_LEARN_BYTES: usize = 64;
/// Models tracked apart; past this, new models use the pool-wide ratio.
pub const MAX_MODELS: usize = 64;

/// Decayed sums of prompt bytes and the tokens the model counted for them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ratio {
    bytes: f64,
    tokens: f64,
    learned: u32,
}

impl Default for Ratio {
    fn default() -> Self {
        Ratio { bytes: PRIOR_TOKENS * BYTES_PER_TOKEN as f64, tokens: PRIOR_TOKENS, learned: 0 }
    }
}

impl Ratio {
    fn learn(&mut self, bytes: f64, tokens: f64) {
        self.bytes = self.bytes * DECAY + bytes;
        self.tokens = self.tokens * DECAY + tokens;
        self.learned = self.learned.saturating_add(1);
    }

    fn bytes_per_token(&self) -> f64 {
        (self.bytes / self.tokens.max(1e-9)).clamp(RATIO_BOUNDS.0, RATIO_BOUNDS.1)
    }
}

/// One VM's learned bytes per token, per model and pool-wide.
#[derive(Debug, Clone, Default)]
pub struct TokenCounts {
    models: HashMap<String, Ratio>,
    pool: Ratio,
}

impl TokenCounts {
    /// Prompt tokens of `bytes` bytes of prompt text sent to `model` (`None`: unknown, as in
    /// header-only routing), rounded up and held to the contract's bound.
    pub fn estimate(&self, model: Option<&str>, bytes: u64) -> u32 {
        let ratio = model.and_then(|m| self.models.get(m)).unwrap_or(&self.pool).bytes_per_token();
        let tokens = (bytes as f64 / ratio).ceil();
        if tokens >= f64::from(limits::MAX_TOKENS) {
            limits::MAX_TOKENS
        } else {
            tokens as u32
        }
    }

    /// A response of `model` counted `tokens` prompt tokens for a prompt of `bytes` bytes.
    pub fn learn(&mut self, model: &str, bytes: usize, tokens: u32) {
        if bytes < MIN_LEARN_BYTES || tokens == 0 {
            return;
        }
        // One token per byte and more, or 64 bytes a token: a count that is not of this prompt
        // (a server that counts its template alone, a bug) teaches nothing.
        let ratio = bytes as f64 / f64::from(tokens);
        if !(RATIO_BOUNDS.0..=RATIO_BOUNDS.1 * 4.0).contains(&ratio) {
            return;
        }
        let (bytes, tokens) = (bytes as f64, f64::from(tokens));
        self.pool.learn(bytes, tokens);
        if let Some(r) = self.models.get_mut(model) {
            r.learn(bytes, tokens);
        } else if self.models.len() < MAX_MODELS {
            let mut r = Ratio::default();
            r.learn(bytes, tokens);
            self.models.insert(model.to_string(), r);
        }
    }

    /// The bytes per token used for `model` now, and how many responses taught it.
    pub fn ratio(&self, model: Option<&str>) -> (f64, u32) {
        let r = model.and_then(|m| self.models.get(m)).unwrap_or(&self.pool);
        (r.bytes_per_token(), r.learned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn starts_at_the_approximation() {
        let t = TokenCounts::default();
        assert_eq!(t.estimate(Some("m"), 8000), 2000);
        assert_eq!(t.estimate(None, 5), 2);
        assert_eq!(t.ratio(Some("m")), (4.0, 0));
    }

    #[test]
    fn learns_a_models_ratio_from_its_answers() {
        let mut t = TokenCounts::default();
        // A tokenizer at 2 bytes a token: 8,400 bytes are 4,200 tokens.
        t.learn("small", 8400, 4200);
        let (ratio, n) = t.ratio(Some("small"));
        assert_eq!(n, 1);
        assert!(ratio < 2.1, "one long answer moves it most of the way: {ratio}");
        for _ in 0..20 {
            t.learn("small", 8400, 4200);
        }
        // What is left of the 4-byte start weighs less with every answer.
        let est = t.estimate(Some("small"), 8400);
        assert!((4180..=4200).contains(&est), "{est}");
        // Another model keeps its own; an unseen one takes the pool's.
        t.learn("other", 4000, 1000);
        assert!((t.ratio(Some("other")).0 - 4.0).abs() < 1e-9);
        assert!(t.ratio(Some("unseen")).0 < 2.2);
        assert!(t.ratio(None).0 < 2.2);
    }

    #[test]
    fn the_approximations_own_counts_change_nothing() {
        let mut t = TokenCounts::default();
        for bytes in [64usize, 400, 8000, 30_000] {
            t.learn("sim", bytes, bytes.div_ceil(4) as u32);
        }
        assert_eq!(t.estimate(Some("sim"), 8000), 2000);
    }

    #[test]
    fn odd_counts_and_short_prompts_teach_nothing() {
        let mut t = TokenCounts::default();
        t.learn("m", 10, 1); // too short
        t.learn("m", 8000, 0); // no count
        t.learn("m", 8000, 1); // 8,000 bytes a token
        t.learn("m", 100, 400); // four tokens a byte
        assert_eq!(t.ratio(Some("m")), (4.0, 0));
    }

    #[test]
    fn invented_model_names_cannot_grow_the_map() {
        let mut t = TokenCounts::default();
        for i in 0..(MAX_MODELS + 50) {
            t.learn(&format!("m{i}"), 800, 400);
        }
        assert_eq!(t.models.len(), MAX_MODELS);
        assert_eq!(t.ratio(Some("m9999")).1, (MAX_MODELS + 50) as u32, "the pool learned from all");
    }

    #[test]
    fn estimates_stay_within_the_contract() {
        let mut t = TokenCounts::default();
        for _ in 0..200 {
            t.learn("tiny", 1000, 1000);
        }
        assert_eq!(t.estimate(Some("tiny"), u64::MAX), limits::MAX_TOKENS);
        assert!(t.ratio(Some("tiny")).0 >= RATIO_BOUNDS.0);
    }
}
