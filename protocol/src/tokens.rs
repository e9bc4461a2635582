//! The one token approximation every headroom component uses.
//!
//! headroom never sees a tokenizer. The simulated model server and the load
//! generator count prompt tokens with [`estimate_tokens`], so that the counts they
//! exchange agree exactly: one token per [`BYTES_PER_TOKEN`] bytes of UTF-8, rounded
//! up (about right for English with BPE tokenizers). The filter starts from the same
//! ratio and learns each model's own from its responses (`filter/core`'s `token_count`).
//! Prefix-cache blocks are [`BLOCK_TOKENS`] tokens, i.e. [`BLOCK_BYTES`] bytes.

/// UTF-8 bytes counted as one token.
pub const BYTES_PER_TOKEN: usize = 4;
/// Tokens per prefix-cache block (vLLM's default block size).
pub const BLOCK_TOKENS: usize = 16;
/// Bytes of prompt text per prefix-cache block.
pub const BLOCK_BYTES: usize = BYTES_PER_TOKEN * BLOCK_TOKENS;

/// Estimated token count of `text`: `ceil(bytes / 4)`.
pub fn estimate_tokens(text: &str) -> u32 {
    tokens_of_bytes(text.len() as u64)
}

/// Estimated token count of `bytes` bytes of text: `ceil(bytes / 4)`.
pub fn tokens_of_bytes(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(BYTES_PER_TOKEN as u64)).unwrap_or(u32::MAX)
}

/// Chained hashes of the full [`BLOCK_BYTES`]-byte blocks of `text`, at most
/// `max_blocks` of them. Block `i`'s hash covers blocks `0..=i`, so two prompts
/// share hash `i` exactly when they share their first `i + 1` blocks.
///
/// A block is read as eight little-endian 64-bit words, each folded into the chain by
/// [`mix`]: the same value on every platform (the filter's Wasm and the predictor agree),
/// and eight multiplications a block where a byte-at-a-time hash (FNV-1a) takes sixty-four
/// in one dependent chain, which made hashing a long prompt a visible part of the
/// filter's body callback.
pub fn prefix_block_hashes(text: &str, max_blocks: usize) -> Vec<u64> {
    let mut hashes = Vec::with_capacity((text.len() / BLOCK_BYTES).min(max_blocks));
    let mut chain = SEED;
    for block in text.as_bytes().chunks_exact(BLOCK_BYTES).take(max_blocks) {
        for word in block.chunks_exact(8) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(word);
            chain = mix(chain, u64::from_le_bytes(bytes));
        }
        hashes.push(chain);
    }
    hashes
}

/// FNV's 64-bit offset basis, as a start that is not zero.
const SEED: u64 = 0xcbf2_9ce4_8422_2325;
/// An odd multiplier with well-spread bits (the 64-bit golden ratio).
const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// One word into the chain: xor, multiply, and fold the high half down. Each step is a
/// bijection of `hash ^ word`, so two chains that differ stay different; the fold
/// carries the multiply's high bits, which see every input bit, into the low ones,
/// which otherwise would depend on the low input bits alone.
fn mix(hash: u64, word: u64) -> u64 {
    let h = (hash ^ word).wrapping_mul(MULTIPLIER);
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_up() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("a"), 1);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
        assert_eq!(estimate_tokens(&"x".repeat(8000)), 2000);
    }

    #[test]
    fn a_blocks_hash_is_the_contracts_value_and_sees_every_byte() {
        // Pinned: the filter (Wasm) and the predictor read the same prompt's hashes, and
        // a predictor's prefix caches outlive a filter's upgrade.
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(2);
        assert_eq!(prefix_block_hashes(&text, 1), [0x95fb_bf52_e5ce_4dfe]);
        let block = "x".repeat(BLOCK_BYTES);
        let first = prefix_block_hashes(&block, 1)[0];
        for i in 0..BLOCK_BYTES {
            let mut other = block.clone().into_bytes();
            other[i] = b'y';
            let other = String::from_utf8(other).unwrap_or_default();
            assert_ne!(prefix_block_hashes(&other, 1)[0], first, "byte {i} of the block");
        }
    }

    #[test]
    fn shared_prefix_shares_hashes() {
        let system = "s".repeat(BLOCK_BYTES * 3);
        let a = prefix_block_hashes(&format!("{system}{}", "a".repeat(BLOCK_BYTES)), 100);
        let b = prefix_block_hashes(&format!("{system}{}", "b".repeat(BLOCK_BYTES)), 100);
        assert_eq!(a.len(), 4);
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
    }

    #[test]
    fn hashes_are_chained_and_capped() {
        let same_block_twice = "q".repeat(BLOCK_BYTES * 2);
        let h = prefix_block_hashes(&same_block_twice, 100);
        assert_ne!(h[0], h[1], "block hash must depend on the blocks before it");
        assert_eq!(prefix_block_hashes(&"q".repeat(BLOCK_BYTES * 10), 4).len(), 4);
        assert!(prefix_block_hashes("short", 10).is_empty());
    }
}
