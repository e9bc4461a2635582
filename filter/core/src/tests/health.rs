//! Endpoint health: servers failing fast ejected and probed again, retries counted, and what ejects nobody.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The server answers `status` at once with a JSON error, served where the destination's
/// first endpoint is (`served`: elsewhere, as after Envoy's retry), then the log.
fn answered_at_once(flow: &mut Flow, host: &mut FakeHost, vm: &mut Vm, status: u16, served: Option<&str>) -> String {
    let destination = host.request_header("x-gateway-destination-endpoint").unwrap_or_default();
    let first = destination.split(',').next().unwrap_or_default().to_string();
    host.upstream = Some(served.map_or(first.clone(), str::to_string));
    host.headers.insert((Map::ResponseHeaders, ":status".into()), status.to_string());
    host.headers.insert((Map::ResponseHeaders, "content-type".into()), "application/json".into());
    assert_eq!(flow.on_response_headers(host, vm), Step::Continue);
    let body = br#"{"error":{"message":"boom"}}"#.to_vec();
    host.buffers.insert(Buffer::ResponseBody, body.clone());
    flow.on_response_body(host, vm, body.len());
    flow.on_log(host, vm);
    first
}

#[test]
fn a_server_failing_fast_is_ejected_from_every_choice_then_probed_again() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let (bad, good) = ("10.0.0.1:8000", "10.0.0.2:8000");
    // Its metrics look idle: predicted far faster than the other, so it is favoured.
    let answer = predictions(&[(bad, Some(10.0)), (good, Some(450.0))]);
    let mut failures = 0;
    let mut chosen = Vec::new();
    for _ in 0..40 {
        let mut flow = Flow::new();
        routed(&mut flow, &mut host, &mut vm, 200, &answer);
        let destination = host.request_header("x-gateway-destination-endpoint").unwrap_or_default();
        let first = destination.split(',').next().unwrap_or_default().to_string();
        let status = if first == bad { 500 } else { 200 };
        failures += usize::from(status == 500);
        answered_at_once(&mut flow, &mut host, &mut vm, status, None);
        chosen.push(first);
        host.now_ns += 10 * MS;
    }
    assert_eq!(failures, 3, "three failures in a row eject it: {chosen:?}");
    assert!(vm.health.is_ejected(bad, host.now_ms()));
    assert!(host.has(Event::EndpointFailed { ejected: true }));
    // The destination lists the next best after the choice, for Envoy's retry.
    let mut flow = Flow::new();
    routed(&mut flow, &mut host, &mut vm, 200, &answer);
    assert_eq!(
        host.request_header("x-gateway-destination-endpoint").as_deref(),
        Some(good),
        "the ejected one is not even a fallback"
    );
    answered_at_once(&mut flow, &mut host, &mut vm, 200, None);
    // The fallback (the predictor timing out) keeps off it too.
    for _ in 0..20 {
        let mut flow = Flow::new();
        assert_eq!(routed(&mut flow, &mut host, &mut vm, 504, b""), Step::Resume);
        assert!(host.has(Event::Routed(RouteSource::Fallback)));
        assert_eq!(answered_at_once(&mut flow, &mut host, &mut vm, 200, None), good);
    }
    // When the term ends it is probed; one more failure ejects it at once, for twice as long.
    host.now_ns += 5_000 * MS;
    let mut probes = 0;
    for _ in 0..40 {
        let mut flow = Flow::new();
        routed(&mut flow, &mut host, &mut vm, 200, &answer);
        let destination = host.request_header("x-gateway-destination-endpoint").unwrap_or_default();
        let status = if destination.starts_with(bad) { 500 } else { 200 };
        probes += usize::from(status == 500);
        answered_at_once(&mut flow, &mut host, &mut vm, status, None);
        host.now_ns += 10 * MS;
    }
    assert_eq!(probes, 1, "probed once when its term ended, then ejected again");
    assert!(vm.health.is_ejected(bad, host.now_ms() + 9_000), "the second term is 10 s");
}

/// A hung server's failure is known only when its request times out: on probation it takes
/// its one probe and nothing else until that probe's outcome comes.
#[test]
fn on_probation_an_endpoint_takes_one_probe_until_its_outcome() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let (bad, good) = ("10.0.0.1:8000", "10.0.0.2:8000");
    let answer = predictions(&[(bad, Some(10.0)), (good, Some(450.0))]);
    for _ in 0..3 {
        let mut flow = Flow::new();
        routed(&mut flow, &mut host, &mut vm, 200, &answer);
        answered_at_once(&mut flow, &mut host, &mut vm, 500, None);
    }
    assert!(vm.health.is_ejected(bad, host.now_ms()));
    host.now_ns += 5_000 * MS;
    // The probe goes, and hangs: the requests after it while it is out go elsewhere.
    let mut probe = Flow::new();
    routed(&mut probe, &mut host, &mut vm, 200, &answer);
    assert_eq!(host.chosen().as_deref(), Some(bad), "the term ended: probed");
    for _ in 0..10 {
        host.now_ns += 100 * MS;
        let mut flow = Flow::new();
        routed(&mut flow, &mut host, &mut vm, 200, &answer);
        assert_eq!(answered_at_once(&mut flow, &mut host, &mut vm, 200, None), good, "one probe at a time");
    }
    // It times out (Envoy's 504): ejected again.
    answered_at_once(&mut probe, &mut host, &mut vm, 504, Some(bad));
    assert!(vm.health.is_ejected(bad, host.now_ms() + 9_000), "the second term is 10 s");
}

#[test]
fn a_choice_that_envoy_retried_elsewhere_counts_against_it_and_the_report_says_where() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let (bad, good) = ("10.0.0.1:8000", "10.0.0.2:8000");
    // Only the bad one is positive: each request goes there first, and Envoy's retry serves
    // it at the other (the client sees a 200).
    let answer = predictions(&[(bad, Some(100.0)), (good, Some(900.0))]);
    for _ in 0..3 {
        let mut flow = Flow::new();
        routed(&mut flow, &mut host, &mut vm, 200, &answer);
        let destination = host.request_header("x-gateway-destination-endpoint").unwrap_or_default();
        assert_eq!(destination, format!("{bad},{good}"), "the choice, then the next best");
        answered_at_once(&mut flow, &mut host, &mut vm, 200, Some(good));
    }
    assert!(vm.health.is_ejected(bad, host.now_ms()), "three retries away from it eject it");
    assert!(!vm.health.is_ejected(good, host.now_ms()));
    deliver_all(&mut host, &mut vm, 200);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    let o = &reported[0].reports[0];
    assert_eq!((o.endpoint.as_str(), o.failed_at.as_deref(), o.status), (good, Some(bad), 200));
    // Now the request goes to the healthy one, negative tier or not.
    let mut flow = Flow::new();
    routed(&mut flow, &mut host, &mut vm, 200, &answer);
    assert_eq!(host.request_header("x-gateway-destination-endpoint").as_deref(), Some(good));
}

#[test]
fn client_errors_and_cut_streams_eject_nobody() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    for status in [400, 404, 429, 400, 400] {
        let mut flow = Flow::new();
        routed(&mut flow, &mut host, &mut vm, 200, &answer);
        answered_at_once(&mut flow, &mut host, &mut vm, status, None);
    }
    for _ in 0..5 {
        let mut flow = Flow::new();
        routed(&mut flow, &mut host, &mut vm, 200, &answer);
        host.upstream = Some("10.0.0.1:8000".into());
        stream_until(&mut flow, &mut host, &mut vm, 30, false);
    }
    assert!(!host.has(Event::EndpointFailed { ejected: false }));
    assert!(!vm.health.is_ejected("10.0.0.1:8000", host.now_ms()));
}

#[test]
fn a_stream_cut_off_by_its_server_is_reported_with_status_0() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    routed(&mut flow, &mut host, &mut vm, 200, &answer);
    host.upstream = Some("10.0.0.1:8000".into());
    stream_until(&mut flow, &mut host, &mut vm, 30, false);
    assert!(host.has(Event::CutOff));
    deliver_all(&mut host, &mut vm, 200);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    let o = &reported[0].reports[0];
    assert_eq!((o.status, o.endpoint.as_str()), (0, "10.0.0.1:8000"), "tracking ends, nothing is learnt");
}

#[test]
fn a_batch_failing_with_5xx_is_sent_again_and_one_refused_with_4xx_is_dropped() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    routed(&mut flow, &mut host, &mut vm, 200, &predictions(&[("10.0.0.1:8000", Some(100.0))]));
    host.upstream = Some("10.0.0.1:8000".into());
    stream_response(&mut flow, &mut host, &mut vm, 30);

    // 5xx: the dispatch batch goes back to the front and is sent again, unchanged;
    // the report waits behind it.
    deliver_all(&mut host, &mut vm, 503);
    deliver_all(&mut host, &mut vm, 503);
    let sent: Vec<&Call> = host.calls.iter().filter(|c| c.header(":path") == Some(paths::DISPATCH)).collect();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].body, sent[1].body);
    assert_eq!(sent[0].timeout, crate::vm::FLUSH_TIMEOUT);
    assert!(batches::<ReportBatch>(&host, paths::REPORT).is_empty());
    assert!(host.has(Event::Outbox(crate::outbox::Counts { failed: 1, ..Default::default() })));

    // 4xx: refused for good; dropped and counted, never sent again. The reports then go
    // (the first-token event and the observation, refused too).
    deliver_all(&mut host, &mut vm, 400);
    let calls = host.calls.len();
    assert_eq!(batches::<ReportBatch>(&host, paths::REPORT).len(), 1);
    deliver_all(&mut host, &mut vm, 200);
    assert_eq!(host.calls.len(), calls, "nothing left to send");
    let refused: u64 = host.events.iter().map(|e| if let Event::Outbox(c) = e { c.refused } else { 0 }).sum();
    assert_eq!(refused, 3);
}
