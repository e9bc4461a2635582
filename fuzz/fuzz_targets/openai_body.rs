//! The OpenAI body parser (completions, chat and responses) on any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    use headroom_protocol::openai::{parse_inference_body, Api};
    let api = [Api::Completions, Api::Chat, Api::Responses][usize::from(selector % 3)];
    if let Ok(parsed) = parse_inference_body(body, api) {
        assert!(!parsed.model.is_empty());
        let _ = headroom_protocol::tokens::prefix_block_hashes(&parsed.prompt_text, 256);
    }
});
