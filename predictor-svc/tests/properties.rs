//! Property tests of what the predictor reads from outside: scraped metrics, dispatch
//! and report sequences, restored files, the prior on any state. Bounded so they run
//! in `make test`; `make fuzz` drives the same entry points for minutes (`fuzz/`).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use headroom_predictor_core::engine_metrics::parse_engine_metrics;
use headroom_predictor_core::model::features;
use headroom_predictor_core::model::prior::AnalyticPrior;
use headroom_predictor_core::model::sampler::Samples;
use headroom_predictor_core::pool::Pool;
use headroom_protocol::{limits, Dispatch, EndpointState, RequestFeatures, Slo};
use proptest::prelude::*;

fn any_number() -> impl Strategy<Value = f64> {
    prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-1.0), Just(1e300), any::<f64>(), 0.0..1e4f64]
}

#[derive(Debug, Clone)]
enum Op {
    Dispatch { id: u8, endpoint: u8, ttft: Option<f64>, tokens: u32, tpot: Option<f64> },
    Finish { id: u8 },
    Expire { after_s: u16 },
    Discover { endpoints: Vec<u8> },
    States,
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u8>(), 0u8..5, proptest::option::of(any_number()), any::<u32>(), proptest::option::of(1.0..100.0f64))
            .prop_map(|(id, endpoint, ttft, tokens, tpot)| Op::Dispatch { id, endpoint, ttft, tokens, tpot }),
        any::<u8>().prop_map(|id| Op::Finish { id }),
        any::<u16>().prop_map(|after_s| Op::Expire { after_s }),
        proptest::collection::vec(0u8..5, 0..4).prop_map(|endpoints| Op::Discover { endpoints }),
        Just(Op::States),
    ]
}

fn address(i: u8) -> String {
    format!("10.0.0.{i}:8000")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn scraped_metrics_of_any_text_parse_in_range(text in ".{0,400}") {
        if let Some(m) = parse_engine_metrics(&text) {
            prop_assert!((0.0..=1.0).contains(&m.kv_usage));
        }
    }

    #[test]
    fn scraped_metrics_of_any_values_parse_in_range(values in proptest::collection::vec(any_number(), 1..6)) {
        let text: String = values.iter().enumerate().map(|(i, v)| {
            let name = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"][i % 3];
            format!("{name}{{engine=\"{i}\"}} {v}\n")
        }).collect();
        if let Some(m) = parse_engine_metrics(&text) {
            prop_assert!((0.0..=1.0).contains(&m.kv_usage));
        }
    }

    #[test]
    fn any_sequence_of_dispatches_and_reports_keeps_tracking_bounded(ops in proptest::collection::vec(any_op(), 0..60)) {
        let mut pool = Pool::new("p", &[address(0), address(1)], 64).with_max_in_flight(20);
        let start = Instant::now();
        let mut now = start;
        for op in ops {
            match op {
                Op::Dispatch { id, endpoint, ttft, tokens, tpot } => {
                    let d = Dispatch {
                        pool: "p".into(),
                        request_id: format!("r{id}"),
                        endpoint: address(endpoint),
                        request: RequestFeatures {
                            input_tokens: tokens,
                            max_tokens: Some(tokens),
                            prefix_hashes: vec![u64::from(id); 3],
                            streaming: true,
                            slo: Slo { ttft_ms: None, tpot_ms: tpot },
                            ..Default::default()
                        },
                    };
                    // Predicted here first (its record), or placed without an answer.
                    if ttft.is_some() {
                        let answered: Vec<_> = pool
                            .endpoints
                            .iter()
                            .map(|e| if e.address == d.endpoint { (ttft, None) } else { (None, None) })
                            .collect();
                        let states = vec![EndpointState::default(); answered.len()];
                        pool.remember(&d.request_id, &d.request, &states, &answered, now);
                    }
                    pool.dispatch(&d, now);
                }
                Op::Finish { id } => {
                    pool.finish(&format!("r{id}"), now);
                }
                Op::Expire { after_s } => {
                    now += Duration::from_secs(u64::from(after_s));
                    pool.expire(now);
                }
                Op::Discover { endpoints } => {
                    pool.set_discovered(0, endpoints.into_iter().map(|e| (address(e), 0)).collect());
                }
                Op::States => {
                    let states = pool.states_for(&RequestFeatures::default(), now);
                    prop_assert_eq!(states.len(), pool.endpoints.len());
                }
            }
            let (in_flight, finished) = pool.tracked();
            prop_assert!(in_flight <= 20 && finished <= 20, "{in_flight} / {finished}");
        }
    }

    #[test]
    fn restored_samples_of_any_bytes_are_refused_or_usable(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(restored) = rmp_serde::from_slice::<Samples>(&bytes) {
            let s = Samples::rehome(restored, 10, 10);
            prop_assert!(s.train.samples().chain(s.holdout.samples()).all(|x| x.row.iter().all(|v| v.is_finite())));
            prop_assert!(s.new_since_training <= s.train.len());
        }
    }

    #[test]
    fn the_prior_on_any_state_is_in_range_or_read_as_unknown(
        kv in any_number(), prefix in any_number(), running in any::<u32>(), tokens in any::<u64>(), input in any::<u32>(),
        class in any::<u32>(),
    ) {
        let state = EndpointState {
            kv_usage: kv, prefix_match: prefix, running, waiting: running / 3, in_flight: running,
            tokens_in_flight: tokens, uncached_tokens_in_flight: tokens / 2, hardware_class: class, ..Default::default()
        };
        let prior = AnalyticPrior::default();
        let row = features::row(&RequestFeatures { input_tokens: input, ..Default::default() }, &state, &prior);
        prop_assert!(row[features::PRIOR_LOG_TTFT].is_finite() && row[features::PRIOR_LOG_TPOT].is_finite(), "the prior columns are finite: {row:?}");
        let (ttft, tpot) = prior.predict(&row);
        for v in [ttft, tpot] {
            // What the API answers: a usable number or nothing, never NaN or a negative.
            prop_assert!(limits::ms_or_none(Some(v)).is_none_or(|v| (0.0..=limits::MAX_MS).contains(&v)));
        }
    }
}
