//! `decide` on any predictions and states (NaN, infinities, huge, negative): it ranks
//! only endpoints that exist, each once, and never panics.
#![no_main]

use headroom_filter_core::{policy, FilterConfig};
use headroom_protocol::rng::Rng;
use headroom_protocol::{EndpointPrediction, EndpointState, RequestFeatures, Slo};
use libfuzzer_sys::fuzz_target;

fn number(bytes: &[u8]) -> Option<f64> {
    let b: [u8; 8] = bytes.try_into().ok()?;
    let v = f64::from_le_bytes(b);
    (b[0] & 3 != 0).then_some(v)
}

fuzz_target!(|data: &[u8]| {
    let mut chunks = data.chunks_exact(8);
    let mut next = || chunks.next().and_then(number);
    let slo = Slo { ttft_ms: next(), tpot_ms: next() };
    let priority = if next().is_some() { -1 } else { 0 };
    let request = RequestFeatures { slo, priority, streaming: next().is_some(), ..Default::default() };
    let waited = next().unwrap_or(0.0);
    let mut endpoints = Vec::new();
    for i in 0..8 {
        let (ttft_ms, tpot_ms) = (next(), next());
        let state = EndpointState {
            kv_usage: next().unwrap_or(0.5),
            prefix_match: next().unwrap_or(0.0),
            tightest_tpot_slo_ms: next(),
            running: next().map_or(0, |v| v as u32),
            in_flight: next().map_or(0, |v| v as u32),
            tighter_tpot_in_flight: next().map_or(0, |v| v as u32),
            ..Default::default()
        };
        endpoints.push(EndpointPrediction { address: format!("10.0.0.{i}:8000"), ttft_ms, tpot_ms, state });
    }
    let n = data.first().map_or(0, |b| usize::from(*b) % 9);
    endpoints.truncate(n);
    let config = FilterConfig { fallback_endpoints: 3, ..FilterConfig::default() };
    let seed = data.len() as u64;
    for slo_routing in [true, false] {
        if let policy::Decision::Route { ranked, .. } =
            policy::decide(&request, &endpoints, slo_routing, waited, &config, &mut Rng::new(seed))
        {
            assert!(!ranked.is_empty() && ranked.iter().all(|&i| i < endpoints.len()));
            let mut unique = ranked.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), ranked.len());
        }
    }
});
