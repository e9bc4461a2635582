//! The SLO and priority header parsers: any values give hints within bounds or a
//! refusal naming a header.
#![no_main]

use headroom_filter_core::config::{FilterConfig, SloFloorAction};
use headroom_filter_core::headers::parse_hints;
use headroom_protocol::limits::MAX_MS;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\n');
    let values: Vec<(&str, Option<String>)> =
        ["x-slo-ttft-ms", "x-llm-d-slo-tpot-ms", "x-request-priority", "x-prediction-based-scheduling"]
            .into_iter()
            .map(|name| (name, parts.next().map(str::to_string)))
            .collect();
    let get = |name: &str| values.iter().find(|(n, _)| *n == name).and_then(|(_, v)| v.clone());
    for action in [SloFloorAction::Clamp, SloFloorAction::Reject] {
        let config = FilterConfig { slo_floor_action: action, ..FilterConfig::default() };
        match parse_hints(get, &config) {
            Ok(h) => {
                for v in [h.slo.ttft_ms, h.slo.tpot_ms].into_iter().flatten() {
                    assert!(v.is_finite() && v > 0.0 && v <= MAX_MS, "{v}");
                }
            }
            Err(e) => assert!(!e.header.is_empty()),
        }
    }
});
