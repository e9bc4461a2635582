//! The OpenAI body parser (completions and chat) on any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    if let Ok(parsed) = headroom_protocol::openai::parse_inference_body(body, selector & 1 == 1) {
        assert!(!parsed.model.is_empty());
        let _ = headroom_protocol::tokens::prefix_block_hashes(&parsed.prompt_text, 256);
    }
});
