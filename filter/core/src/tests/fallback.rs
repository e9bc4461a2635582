//! When the predictor fails: timeouts, garbage, broken states, replicas failing, and the fallback over the last fresh states.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn a_predictor_timeout_falls_back_to_the_last_fresh_states() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let answer = predictions(&[("10.0.0.1:8000", Some(200.0)), ("10.0.0.2:8000", Some(200.0))]);
    routed(&mut Flow::new(), &mut host, &mut vm, 200, &answer);

    host.now_ns += 100 * MS;
    let mut flow = Flow::new();
    assert_eq!(routed(&mut flow, &mut host, &mut vm, 504, b""), Step::Resume);
    assert!(host.has(Event::Fallback(FallbackCause::Timeout)));
    assert!(host.has(Event::Routed(RouteSource::Fallback)));
    let destination = host.request_header("x-gateway-destination-endpoint").unwrap_or_default();
    assert!(destination.starts_with("10.0.0."), "{destination}");
}

#[test]
fn while_the_predictor_is_down_the_fallback_spreads_requests_over_its_frozen_states() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    // One answer, then the predictor is gone: its states are all the fallback has, and the
    // first endpoint looks best in them every time.
    let endpoints = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];
    let answer = PredictResponse {
        flow: None,
        pool: "default".into(),
        model_version: "test".into(),
        endpoints: endpoints
            .iter()
            .zip([0.1, 0.2, 0.3])
            .map(|(address, kv_usage)| EndpointPrediction {
                address: address.to_string(),
                ttft_ms: Some(100.0),
                tpot_ms: Some(10.0),
                state: EndpointState { kv_usage, ..busy() },
            })
            .collect(),
    };
    let answer = codec::encode(Format::MsgPack, &answer).unwrap_or_default();
    let mut first = Flow::new();
    routed(&mut first, &mut host, &mut vm, 200, &answer);
    stream_response(&mut first, &mut host, &mut vm, 50);

    let mut open = Vec::new();
    for _ in 0..30 {
        let mut flow = Flow::new();
        assert_eq!(routed(&mut flow, &mut host, &mut vm, 504, b""), Step::Resume);
        let destination = host.chosen().unwrap_or_default();
        open.push((flow, destination));
    }
    let per_endpoint: Vec<usize> = endpoints.iter().map(|e| open.iter().filter(|(_, d)| d == e).count()).collect();
    assert!(per_endpoint.iter().all(|n| (5..=15).contains(n)), "spread over all three: {per_endpoint:?}");
    assert_eq!(vm.placed.at(endpoints[0]), per_endpoint[0] as u32, "each one counted where it went");
    // Ended, they count no more.
    for (mut flow, destination) in open {
        host.upstream = Some(destination);
        stream_response(&mut flow, &mut host, &mut vm, 50);
    }
    assert!(endpoints.iter().all(|e| vm.placed.at(e) == 0));
}

#[test]
fn without_fresh_states_a_fallback_leaves_the_choice_to_envoy() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    assert_eq!(routed(&mut flow, &mut host, &mut vm, 503, b""), Step::Resume);
    assert!(host.has(Event::Fallback(FallbackCause::Unavailable)));
    assert!(host.has(Event::Routed(RouteSource::Envoy)));
    assert_eq!(host.request_header("x-gateway-destination-endpoint"), None);
    // Nothing was dispatched, but the request is still reported (as Envoy's choice).
    host.upstream = Some("10.0.0.9:8000".into());
    stream_response(&mut flow, &mut host, &mut vm, 50);
    deliver_all(&mut host, &mut vm, 200);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    assert_eq!(reported[0].reports[0].source, RouteSource::Envoy);
    assert!(batches::<DispatchBatch>(&host, paths::DISPATCH).is_empty());
}

#[test]
fn a_garbage_answer_falls_back() {
    for garbage in [b"\xc1 not msgpack".to_vec(), predictions(&[(&"x".repeat(300), Some(1.0))]), predictions(&[])] {
        let mut host = FakeHost::new();
        let mut vm = vm("{}");
        assert_eq!(routed(&mut Flow::new(), &mut host, &mut vm, 200, &garbage), Step::Resume);
        assert!(host.has(Event::Fallback(FallbackCause::BadAnswer)), "{:?}", host.events);
    }
}

/// One endpoint whose state breaks a bound (a share of 7.5) is left out; the answer's other
/// endpoints still place the request. It used to send the whole request to the fallback.
#[test]
fn an_endpoint_with_a_broken_state_is_left_out_not_the_whole_answer() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut answer: PredictResponse =
        codec::decode(Format::MsgPack, &predictions(&[("10.0.0.1:8000", Some(50.0)), ("10.0.0.2:8000", Some(60.0))]))
            .unwrap();
    answer.endpoints[0].state.kv_usage = 7.5;
    let answer = codec::encode(Format::MsgPack, &answer).unwrap();
    assert_eq!(routed(&mut Flow::new(), &mut host, &mut vm, 200, &answer), Step::Resume);
    assert!(!host.events.iter().any(|e| matches!(e, Event::Fallback(_))), "{:?}", host.events);
    assert_eq!(host.request_header("x-gateway-destination-endpoint").as_deref(), Some("10.0.0.2:8000"));
}

#[test]
fn predictions_out_of_range_count_as_none() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let answer = predictions(&[("10.0.0.1:8000", Some(f64::NAN)), ("10.0.0.2:8000", Some(-3.0))]);
    assert_eq!(routed(&mut Flow::new(), &mut host, &mut vm, 200, &answer), Step::Resume);
    assert!(host.has(Event::Fallback(FallbackCause::NoPredictions)));
}

#[test]
fn a_callout_that_cannot_start_falls_back_at_once() {
    let mut host = FakeHost { refuse_calls: true, ..FakeHost::new() };
    let mut vm = vm("{}");
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &SLO, BODY), Step::Continue);
    assert!(host.has(Event::Fallback(FallbackCause::CallFailed)));
    assert!(host.has(Event::Routed(RouteSource::Envoy)));
}

#[test]
fn a_replica_failing_three_times_is_skipped_for_the_next() {
    // A 503, or a 401: a replica refusing the filter's token is of no use to it either.
    for status in [503, 401] {
        let mut host = FakeHost::new();
        let mut vm = vm(r#"{"predictor_shards":["p0","p1"]}"#);
        let first = vm.predictor_cluster(host.now_ms());
        for _ in 0..3 {
            routed(&mut Flow::new(), &mut host, &mut vm, status, b"");
        }
        assert!(host.has(Event::PredictorEjected), "{status}");
        assert!(host.logs.iter().any(|(l, m)| *l == Level::Warn && m.contains(&first)));
        routed(&mut Flow::new(), &mut host, &mut vm, 200, &predictions(&[("10.0.0.1:8000", Some(1.0))]));
        assert_ne!(host.calls.last().map(|c| c.cluster.clone()), Some(first));
    }
}

/// Failover, then failback: a request placed while the owner was skipped has its dispatch
/// on the other replica; the owner is back by the time the request ends, and its first
/// token and report go to the other replica all the same, which holds it in its books.
#[test]
fn a_report_follows_its_dispatch_across_a_failback() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"predictor_shards":["p0","p1"]}"#);
    let owner = vm.predictor_cluster(host.now_ms());
    for _ in 0..3 {
        routed(&mut Flow::new(), &mut host, &mut vm, 503, b"");
    }
    let other = vm.predictor_cluster(host.now_ms());
    assert_ne!(owner, other, "the owner is skipped");
    let mut flow = Flow::new();
    let answer = predictions(&[("10.0.0.1:8000", Some(200.0))]);
    assert_eq!(routed(&mut flow, &mut host, &mut vm, 200, &answer), Step::Resume);
    deliver_all(&mut host, &mut vm, 200);
    host.now_ns += (crate::shards::EJECT_MS + 1) * MS;
    assert_eq!(vm.predictor_cluster(host.now_ms()), owner, "the owner is back");
    host.upstream = Some("10.0.0.1:8000".into());
    stream_response(&mut flow, &mut host, &mut vm, 50);
    deliver_all(&mut host, &mut vm, 200);
    let to = |path: &str| -> Vec<String> {
        host.calls.iter().filter(|c| c.header(":path") == Some(path)).map(|c| c.cluster.clone()).collect()
    };
    assert_eq!(to(paths::DISPATCH), std::slice::from_ref(&other));
    assert!(!to(paths::REPORT).is_empty());
    assert!(to(paths::REPORT).iter().all(|c| *c == other), "{:?}", to(paths::REPORT));
}
