//! Hardware profiles: the constants of the step-time model.
//!
//! ```text
//! N      = decodes + sum(prefill chunk tokens)
//! T_step = t0 + max(T_w, N * c_lin) + sum(decode contexts) * k_kv
//!          + sum over chunks of p * (k + p/2) * k_attn + t_req * (decodes + chunks)
//! ```
//! p = chunk tokens, k = tokens of that prompt already in KV. Constants for
//! Llama-3.1-8B in bf16 on one GPU, from public profiling data (see
//! `docs/simulator.md`).

/// The engine-bound model's tokens per simulator token: 4 bytes against its tokenizer's 2.08.
pub const MODEL_TOKENS_PER_TOKEN: f64 = 4.0 / 2.08;

/// What a step's cost depends on, as the engine planned it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// Tokens computed this step: one per decode plus every prefill chunk's tokens (N).
    pub batched_tokens: u32,
    /// Sequences in the step: decodes plus prefill chunks.
    pub sequences: u32,
    /// Context tokens the decodes read: sum over decodes of tokens already in KV.
    pub decode_context_tokens: f64,
    /// Causal query-key pairs of the prefill chunks: sum of p * (k + p/2).
    pub attention_pairs: f64,
}

/// One GPU type's engine constants.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    /// Fixed cost per step (ms).
    pub t0_ms: f64,
    /// Weight-streaming floor per step (ms).
    pub weight_floor_ms: f64,
    /// Cost per batched token (ms).
    pub per_token_ms: f64,
    /// Cost per context token read by a decode (ms).
    pub per_context_token_ms: f64,
    /// Cost per causal query-key pair of a prefill chunk (ms).
    pub per_attention_pair_ms: f64,
    /// Cost per sequence in the step (ms).
    pub per_sequence_ms: f64,
    /// Token budget of one step (`max_num_batched_tokens`).
    pub max_batched_tokens: u32,
    /// Most sequences in one step (`max_num_seqs`).
    pub max_num_seqs: u32,
    /// KV-cache capacity in tokens.
    pub kv_capacity_tokens: u32,
    /// Context limit (prompt + output tokens).
    pub max_model_len: u32,
    /// Per-request API overhead before the engine sees the request (ms).
    pub api_overhead_ms: f64,
}

impl Profile {
    /// Duration of one step of `shape` in ms: the formula at the top of this module.
    pub fn step_ms(&self, shape: &StepShape) -> f64 {
        self.t0_ms
            + self.weight_floor_ms.max(f64::from(shape.batched_tokens) * self.per_token_ms)
            + shape.decode_context_tokens * self.per_context_token_ms
            + shape.attention_pairs * self.per_attention_pair_ms
            + self.per_sequence_ms * f64::from(shape.sequences)
    }

    /// Llama-3.1-8B on one H100 80GB.
    pub fn h100() -> Profile {
        Profile {
            name: "h100",
            t0_ms: 0.8,
            weight_floor_ms: 6.0,
            per_token_ms: 0.024,
            per_context_token_ms: 65e-6,
            per_attention_pair_ms: 1.3e-6,
            per_sequence_ms: 4.4e-3,
            max_batched_tokens: 8192,
            max_num_seqs: 1024,
            kv_capacity_tokens: 400_000,
            max_model_len: 32_768,
            api_overhead_ms: 8.0,
        }
    }

    /// Llama-3.1-8B on one A100 80GB.
    pub fn a100() -> Profile {
        Profile {
            name: "a100",
            t0_ms: 0.8,
            weight_floor_ms: 10.5,
            per_token_ms: 0.065,
            per_context_token_ms: 100e-6,
            per_attention_pair_ms: 3.1e-6,
            per_sequence_ms: 4.4e-3,
            max_batched_tokens: 2048,
            max_num_seqs: 256,
            kv_capacity_tokens: 400_000,
            max_model_len: 32_768,
            api_overhead_ms: 8.0,
        }
    }

    /// The engine-bound local model (`make setup-vllm`'s 107.5M-parameter Llama) served by
    /// vLLM's CPU build on one core of the reference host, idle, with 1 GiB of KV cache: the
    /// real engine that queues (docs/real-engine.md). Fitted to `headroom-profile`'s sweep of
    /// it (docs/simulator.md, "The engine-bound profile"): TTFT 25 / 153 / 625 / 1,486 / 2,514
    /// ms at 16 / 256 / 1,024 / 2,048 / 3,072 model tokens, TPOT 13.7 ms alone and 250 ms
    /// for 32 streams of 1,024 tokens each. Its tokenizer counts 2.08 bytes a token, where the
    /// simulator counts 4 (`headroom_protocol::tokens`), so every per-token constant is the
    /// model's times [`MODEL_TOKENS_PER_TOKEN`] (its square for query-key pairs), and the
    /// token limits are the model's divided by it: the same text costs the same time.
    pub fn engine_bound() -> Profile {
        let k = MODEL_TOKENS_PER_TOKEN;
        Profile {
            name: "engine-bound",
            t0_ms: 1.5,
            weight_floor_ms: 12.0,
            per_token_ms: 0.5 * k,
            per_context_token_ms: 6.5e-3 * k,
            per_attention_pair_ms: 2.0e-4 * k * k,
            per_sequence_ms: 0.3,
            max_batched_tokens: (2048.0 / k) as u32,
            max_num_seqs: 32,
            // 1 GiB at 32 KiB a model token (8 layers x 1,024 x K and V in bf16).
            kv_capacity_tokens: (32_768.0 / k) as u32,
            max_model_len: (4096.0 / k) as u32,
            api_overhead_ms: 8.0,
        }
    }

    /// Names [`Profile::by_name`] knows.
    pub const NAMES: [&'static str; 3] = ["h100", "a100", "engine-bound"];

    /// A profile by name (one of [`Profile::NAMES`]).
    pub fn by_name(name: &str) -> Option<Profile> {
        match name.to_ascii_lowercase().as_str() {
            "h100" => Some(Profile::h100()),
            "a100" => Some(Profile::a100()),
            "engine-bound" => Some(Profile::engine_bound()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_steps_pay_the_weight_floor_and_large_ones_per_token() {
        let p = Profile::h100();
        let one = StepShape { batched_tokens: 1, sequences: 1, ..StepShape::default() };
        assert!((p.step_ms(&one) - (0.8 + 6.0 + 4.4e-3)).abs() < 1e-9);
        let big = StepShape { batched_tokens: 8192, sequences: 1, attention_pairs: 8192.0 * 4096.0, ..one };
        let expected = 0.8 + 8192.0 * 0.024 + 8192.0 * 4096.0 * 1.3e-6 + 4.4e-3;
        assert!((p.step_ms(&big) - expected).abs() < 1e-9);
        let reads = StepShape { decode_context_tokens: 1e6, ..one };
        assert!((p.step_ms(&reads) - p.step_ms(&one) - 65.0).abs() < 1e-9);
    }

    /// The engine-bound profile keeps the measured prefill curve, in the model's tokens.
    #[test]
    fn the_engine_bound_profile_prefills_as_the_local_model_measured() {
        let p = Profile::engine_bound();
        for (model_tokens, measured_ms) in [(256.0, 153.0), (1024.0, 625.0), (2048.0, 1486.0)] {
            let n = model_tokens / MODEL_TOKENS_PER_TOKEN;
            let one = StepShape {
                batched_tokens: n as u32,
                sequences: 1,
                attention_pairs: n * n / 2.0,
                ..StepShape::default()
            };
            let ttft = p.api_overhead_ms + p.step_ms(&one);
            assert!(
                (ttft / measured_ms - 1.0).abs() < 0.1,
                "{model_tokens} model tokens: {ttft:.0} ms against {measured_ms}"
            );
        }
        assert!(Profile::NAMES.iter().all(|n| Profile::by_name(n).is_some_and(|p| p.name == *n)));
    }
}
