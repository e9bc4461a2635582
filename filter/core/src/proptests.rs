//! Property tests of everything the filter reads from outside: headers, bodies,
//! its configuration, the response stream, the predictor's answers. Bounded (a few
//! hundred cases each, seconds in all) so they run in `make test`; `make fuzz` runs
//! the same entry points for minutes under libFuzzer (`fuzz/`). Native only:
//! proptest does not target wasm32.

use headroom_protocol::{
    limits, openai, EndpointPrediction, EndpointState, FlowAnswer, FlowOutcome, RequestFeatures, Slo,
};
use proptest::prelude::*;

use crate::config::FilterConfig;
use crate::{fallback, header_map, headers, policy};
use headroom_protocol::meter::ResponseMeter;
use headroom_protocol::rng::Rng;

/// Every OpenAI API a body may be for.
const API: [openai::Api; 3] = [openai::Api::Completions, openai::Api::Chat, openai::Api::Responses];

/// Any f64 a hostile or broken peer could send, specials over-represented.
fn any_number() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        Just(1e300),
        Just(-1e300),
        Just(f64::MIN_POSITIVE),
        any::<f64>(),
        0.0..10_000.0f64,
    ]
}

fn any_state() -> impl Strategy<Value = EndpointState> {
    (
        any::<u32>(),
        any::<u32>(),
        any_number(),
        any_number(),
        proptest::option::of(any_number()),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(running, waiting, kv_usage, prefix_match, tightest, in_flight, tokens)| EndpointState {
            running,
            waiting,
            kv_usage,
            prefix_match,
            tightest_tpot_slo_ms: tightest,
            tighter_tpot_in_flight: in_flight / 2,
            in_flight,
            uncached_tokens_in_flight: tokens / 2,
            prefill_backlog_tokens: Some(tokens / 4),
            tokens_in_flight: tokens,
            metrics_age_ms: Some(0),
            hardware_class: 0,
            recent_tpot_ms: tightest,
            prefill_tokens_per_s: kv_usage.abs(),
            // Any context, fitting the request or not: a refusal is a 400, never a panic.
            max_context_tokens: Some(in_flight),
            prefill_ms_per_token: tightest,
        })
}

fn any_endpoint() -> impl Strategy<Value = EndpointPrediction> {
    (proptest::option::of(any_number()), proptest::option::of(any_number()), any_state()).prop_map(
        |(ttft_ms, tpot_ms, state)| EndpointPrediction { address: "10.0.0.1:8000".into(), ttft_ms, tpot_ms, state },
    )
}

/// An SSE stream of `events` text events, then a usage block and `[DONE]`.
fn sse(events: &[String], completion_tokens: u32) -> Vec<u8> {
    let mut out = String::new();
    for text in events {
        let event = serde_json::json!({"choices": [{"index": 0, "text": text}]});
        out.push_str(&format!("data: {event}\n\n"));
    }
    let usage = serde_json::json!({"choices": [], "usage": {"completion_tokens": completion_tokens,
        "prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 1}}});
    out.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
    out.into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn decide_never_panics_and_ranks_only_real_endpoints(
        endpoints in proptest::collection::vec(any_endpoint(), 0..12),
        ttft in proptest::option::of(any_number()),
        tpot in proptest::option::of(any_number()),
        priority in -2i32..3,
        streaming in any::<bool>(),
        slo_routing in any::<bool>(),
        waited in any_number(),
        cleared in proptest::collection::vec(0usize..8, 0..4),
        seed in any::<u64>(),
    ) {
        let request = RequestFeatures { slo: Slo { ttft_ms: ttft, tpot_ms: tpot }, priority, streaming, ..Default::default() };
        let config = FilterConfig { fallback_endpoints: 3, ..FilterConfig::default() };
        let flow = FlowAnswer { outcome: FlowOutcome::Released, waited_ms: waited, cleared: cleared.into_iter().filter_map(|i| endpoints.get(i).map(|e| e.address.clone())).collect() };
        let decision = policy::decide(&request, &endpoints, slo_routing, Some(&flow), &config, &mut Rng::new(seed));
        if let policy::Decision::Route { ranked, .. } = decision {
            prop_assert!(!ranked.is_empty());
            prop_assert!(ranked.iter().all(|&i| i < endpoints.len()), "{ranked:?} of {}", endpoints.len());
            let mut unique = ranked.clone();
            unique.sort_unstable();
            unique.dedup();
            prop_assert_eq!(unique.len(), ranked.len());
        }
    }

    #[test]
    fn the_fallback_ranks_any_states(
        states in proptest::collection::vec(any_state(), 0..12),
        placed in proptest::collection::vec(any::<u32>(), 0..14),
        seed in any::<u64>(),
    ) {
        let refs: Vec<&EndpointState> = states.iter().collect();
        let mut ranked = fallback::rank_composite(&refs, &placed, &mut Rng::new(seed));
        ranked.sort_unstable();
        prop_assert_eq!(ranked, (0..states.len()).collect::<Vec<_>>());
    }

    #[test]
    fn slo_headers_are_bounded_or_refused(ttft in ".{0,40}", tpot in ".{0,40}", priority in ".{0,20}", clamp in any::<bool>()) {
        let mut config = FilterConfig::default();
        if !clamp {
            config.slo_floor_action = crate::config::SloFloorAction::Reject;
        }
        let values = [("x-slo-ttft-ms", ttft), ("x-llm-d-slo-tpot-ms", tpot), ("x-request-priority", priority)];
        let get = |name: &str| values.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        if let Ok(h) = headers::parse_hints(get, &config) {
            for (v, floor) in [(h.slo.ttft_ms, config.min_ttft_slo_ms), (h.slo.tpot_ms, config.min_tpot_slo_ms)] {
                if let Some(v) = v {
                    prop_assert!(v.is_finite() && v >= floor && v <= limits::MAX_MS, "{v}");
                }
            }
        }
    }

    #[test]
    fn slo_headers_of_numbers_are_bounded(ttft in any_number()) {
        let text = ttft.to_string();
        let get = |name: &str| (name == "x-slo-ttft-ms").then(|| text.clone());
        if let Ok(h) = headers::parse_hints(get, &FilterConfig::default()) {
            let v = h.slo.ttft_ms.unwrap_or(f64::NAN);
            prop_assert!((10.0..=limits::MAX_MS).contains(&v), "{ttft} became {v}");
        }
    }

    #[test]
    fn any_configuration_bytes_parse_or_name_a_field(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Err(e) = FilterConfig::parse(&bytes) {
            prop_assert!(!e.field.is_empty());
        }
    }

    #[test]
    fn any_json_configuration_parses_or_names_a_field(
        key in prop_oneof![
            prop::sample::select(vec!["max_batch_bytes", "min_tpot_slo_ms", "predictor_token", "tpot_buffer", "pool",
                "max_prefix_blocks", "inference_paths"]).prop_map(String::from),
            ".{0,12}",
        ],
        value in prop_oneof![any::<i64>().prop_map(|v| serde_json::json!(v)), any_number().prop_map(|v| serde_json::json!(v)),
            ".{0,30}".prop_map(|v| serde_json::json!(v)), Just(serde_json::json!([])), Just(serde_json::json!(null))],
    ) {
        let text = serde_json::json!({ key: value }).to_string();
        if let Err(e) = FilterConfig::parse(text.as_bytes()) {
            prop_assert!(!e.field.is_empty());
        }
    }

    #[test]
    fn openai_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), api in 0usize..3) {
        let _ = openai::parse_inference_body(&bytes, API[api]);
    }

    #[test]
    fn openai_json_bodies_never_panic(
        prompt in prop_oneof![".{0,50}".prop_map(|p| serde_json::json!(p)), Just(serde_json::json!([1, 2, 3])),
            Just(serde_json::json!([["a"]])), Just(serde_json::json!({"x": 1}))],
        max_tokens in prop_oneof![any::<i64>().prop_map(|v| serde_json::json!(v)), any_number().prop_map(|v| serde_json::json!(v))],
        api in 0usize..3,
    ) {
        let body = match API[api] {
            openai::Api::Chat => serde_json::json!({"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}),
            openai::Api::Completions => serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": true}),
            openai::Api::Responses => serde_json::json!({"model": "m", "input": [{"role": "user", "content": prompt}], "max_output_tokens": max_tokens}),
        };
        let _ = openai::parse_inference_body(body.to_string().as_bytes(), API[api]);
    }

    #[test]
    fn the_meter_does_not_depend_on_how_the_stream_is_chunked(
        events in proptest::collection::vec("[a-z \\n\"]{1,12}", 1..20),
        tokens in 1u32..500,
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let body = sse(&events, tokens);
        let mut whole = ResponseMeter::new(true, 0, 1 << 20);
        whole.on_chunk(&body, 5_000_000);
        let whole = whole.finish(9_000_000);
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(body.len())).collect();
        points.push(body.len());
        points.sort_unstable();
        let mut split = ResponseMeter::new(true, 0, 1 << 20);
        let mut from = 0;
        for to in points {
            split.on_chunk(&body[from..to], 5_000_000);
            from = to;
        }
        prop_assert_eq!(split.finish(9_000_000), whole);
        prop_assert_eq!(whole.output_tokens, Some(tokens));
    }

    #[test]
    fn the_meter_takes_any_bytes(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..20), streaming in any::<bool>()) {
        let mut meter = ResponseMeter::new(streaming, 0, 256);
        for (i, c) in chunks.iter().enumerate() {
            meter.on_chunk(c, i as u64 * 1_000_000);
        }
        let m = meter.finish(100_000_000);
        prop_assert!(m.e2e_ms.is_finite() && m.e2e_ms >= 0.0);
        prop_assert!(m.ttft_ms.is_none_or(|v| v.is_finite() && v >= 0.0));
        prop_assert!(m.tpot_ms.is_none_or(|v| v.is_finite() && v >= 0.0));
    }

    #[test]
    fn header_maps_decode_any_bytes_and_round_trip(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        pairs in proptest::collection::vec(("[a-z:-]{0,12}", "[ -~]{0,20}"), 0..8),
    ) {
        let _ = header_map::decode(&bytes);
        let refs: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let decoded = header_map::decode(&header_map::encode(&refs));
        prop_assert_eq!(decoded.as_ref().map(|m| m.pairs()), Some(&pairs[..]));
    }

    #[test]
    fn paths_normalise_without_panicking(path in "[/a-z%0-9.]{0,40}") {
        let normal = crate::config::normalize_path(&path);
        prop_assert!(normal.starts_with('/'));
        prop_assert!(!normal.contains("//"));
    }
}
