//! The filter configuration: any bytes parse, or are refused naming a field.
#![no_main]

use headroom_filter_core::FilterConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = FilterConfig::parse(data) {
        assert!(!e.field.is_empty());
    }
});
