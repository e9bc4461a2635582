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
    let tokens = text.len().div_ceil(BYTES_PER_TOKEN);
    u32::try_from(tokens).unwrap_or(u32::MAX)
}

/// Chained hashes of the full [`BLOCK_BYTES`]-byte blocks of `text`, at most
/// `max_blocks` of them. Block `i`'s hash covers blocks `0..=i`, so two prompts
/// share hash `i` exactly when they share their first `i + 1` blocks.
pub fn prefix_block_hashes(text: &str, max_blocks: usize) -> Vec<u64> {
    let mut hashes = Vec::with_capacity((text.len() / BLOCK_BYTES).min(max_blocks));
    let mut chain = FNV_OFFSET;
    for block in text.as_bytes().chunks_exact(BLOCK_BYTES).take(max_blocks) {
        chain = fnv1a(chain, block);
        hashes.push(chain);
    }
    hashes
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
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
