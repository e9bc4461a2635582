//! The vLLM `/metrics` parser on any text: values in range or nothing.
#![no_main]

use headroom_predictor::scrape::parse_engine_metrics;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(m) = parse_engine_metrics(&String::from_utf8_lossy(data)) {
        assert!((0.0..=1.0).contains(&m.kv_usage));
    }
});
