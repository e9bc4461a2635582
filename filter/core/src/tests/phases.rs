//! The request's life as a state machine (`flow::Phase`): each transition, one test, from
//! the phase it leaves to the phase it reaches, with the step the adapter carries out.

use super::*;
use crate::flow::{Asking, Phase};

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn is_asking_call(flow: &Flow, offered: bool) -> bool {
    matches!(flow.phase(), Phase::Asking(Asking::Call { offered_wait, .. }) if *offered_wait == offered)
}

fn is_forwarded(flow: &Flow) -> bool {
    matches!(flow.phase(), Phase::Forwarded(_))
}

#[test]
fn passing_stays_passing_for_what_is_not_an_inference_request() {
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm("{}"), Flow::new());
    host.new_stream(&[(":method", "GET")], "");
    assert_eq!(flow.on_request_headers(&mut host, &mut vm, true), Step::Continue);
    assert!(matches!(flow.phase(), Phase::Passing));
    flow.on_log(&mut host, &mut vm);
    assert!(matches!(flow.phase(), Phase::Passing));
}

#[test]
fn passing_to_reading_on_an_inference_requests_headers() {
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm("{}"), Flow::new());
    host.new_stream(&SLO, BODY);
    assert_eq!(flow.on_request_headers(&mut host, &mut vm, false), Step::Pause);
    assert!(matches!(flow.phase(), Phase::Reading));
    // Part of the body: still reading.
    assert_eq!(flow.on_request_body(&mut host, &mut vm, BODY.len() / 2, false), Step::Pause);
    assert!(matches!(flow.phase(), Phase::Reading));
}

#[test]
fn passing_to_answered_on_an_invalid_hint() {
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm("{}"), Flow::new());
    host.new_stream(&[("x-slo-ttft-ms", "soon")], BODY);
    assert!(matches!(flow.on_request_headers(&mut host, &mut vm, false), Step::Reply { status: 400, .. }));
    assert!(matches!(flow.phase(), Phase::Answered));
}

#[test]
fn reading_to_answered_on_a_body_too_large_or_not_an_inference_request() {
    let (mut host, mut vm) = (FakeHost::new(), vm(r#"{"max_body_bytes":1024}"#));
    let mut flow = Flow::new();
    host.new_stream(&SLO, BODY);
    assert_eq!(flow.on_request_headers(&mut host, &mut vm, false), Step::Pause);
    assert!(matches!(flow.on_request_body(&mut host, &mut vm, 1025, false), Step::Reply { status: 413, .. }));
    assert!(matches!(flow.phase(), Phase::Answered));
    // An answered request's later body and log pass without a report.
    assert_eq!(flow.on_request_body(&mut host, &mut vm, 1100, true), Step::Continue);
    flow.on_log(&mut host, &mut vm);
    deliver_all(&mut host, &mut vm, 200);
    assert!(batches::<ReportBatch>(&host, paths::REPORT).is_empty());

    let mut flow = Flow::new();
    let step = send_request(&mut flow, &mut host, &mut vm, &SLO, r#"{"model":"m"}"#);
    assert!(matches!(step, Step::Reply { status: 400, .. }), "{step:?}");
    assert!(matches!(flow.phase(), Phase::Answered));
}

#[test]
fn reading_to_asking_when_the_body_is_whole() {
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm_without_flow_control(), Flow::new());
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    assert!(is_asking_call(&flow, false), "{:?}", flow.phase());
    // With flow control, the call offers to wait.
    let mut waiting = vm_with_flow_control();
    let mut flow = Flow::new();
    assert_eq!(send_request(&mut flow, &mut host, &mut waiting, &SLO, BODY), Step::Pause);
    assert!(is_asking_call(&flow, true), "{:?}", flow.phase());
}

fn vm_with_flow_control() -> Vm {
    vm(r#"{"flow_control":true}"#)
}

fn vm_without_flow_control() -> Vm {
    vm(r#"{"flow_control":false}"#)
}

#[test]
fn passing_to_asking_on_the_headers_when_routing_by_headers_alone() {
    let (mut host, mut vm, mut flow) =
        (FakeHost::new(), vm(r#"{"read_body":false,"flow_control":false}"#), Flow::new());
    host.new_stream(&[SLO[0], SLO[1], ("content-length", "80")], BODY);
    assert_eq!(flow.on_request_headers(&mut host, &mut vm, false), Step::Pause);
    assert!(is_asking_call(&flow, false), "{:?}", flow.phase());
}

#[test]
fn asking_stays_asking_on_an_answer_to_another_call() {
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm_without_flow_control(), Flow::new());
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    let token = host.answer(200, &answer);
    assert_eq!(flow.on_callout_answer(&mut host, &mut vm, token + 1, answer.len()), Step::Continue);
    assert!(is_asking_call(&flow, false));
    assert_eq!(flow.on_coalesced_answer(&mut host, &mut vm, Err(FallbackCause::CallFailed)), Step::Continue);
    assert!(is_asking_call(&flow, false), "a coalesced answer is not this call's");
}

#[test]
fn asking_to_forwarded_on_the_answer_or_on_a_failure() {
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm("{}"), Flow::new());
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    assert_eq!(routed(&mut flow, &mut host, &mut vm, 200, &answer), Step::Resume);
    assert!(is_forwarded(&flow));
    // A failed call: forwarded all the same, by the fallback.
    let mut flow = Flow::new();
    assert_eq!(routed(&mut flow, &mut host, &mut vm, 503, b""), Step::Resume);
    assert!(is_forwarded(&flow));
    assert!(host.has(Event::Fallback(FallbackCause::Unavailable)), "{:?}", host.events);
}

#[test]
fn asking_to_answered_when_a_sheddable_request_is_shed() {
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm("{}"), Flow::new());
    let headers = [SLO[0], SLO[1], ("x-request-priority", "-1")];
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &headers, BODY), Step::Pause);
    let answer = predictions(&[("10.0.0.1:8000", Some(900.0))]);
    let token = host.answer(200, &answer);
    assert!(matches!(flow.on_callout_answer(&mut host, &mut vm, token, answer.len()), Step::Reply { status: 429, .. }));
    assert!(matches!(flow.phase(), Phase::Answered));
}

#[test]
fn asking_ended_by_the_client_is_reported_abandoned_only_when_it_offered_to_wait() {
    let mut host = FakeHost::new();
    let mut waiting = vm_with_flow_control();
    let mut flow = Flow::new();
    assert_eq!(send_request(&mut flow, &mut host, &mut waiting, &SLO, BODY), Step::Pause);
    flow.on_log(&mut host, &mut waiting);
    assert!(matches!(flow.phase(), Phase::Passing), "the log ends every phase");
    deliver_all(&mut host, &mut waiting, 200);
    let reports = batches::<ReportBatch>(&host, paths::REPORT);
    assert_eq!(reports.iter().map(|r| r.abandoned.len()).sum::<usize>(), 1, "{reports:?}");

    // Without flow control the predictor holds nothing: nothing to tell it.
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm_without_flow_control(), Flow::new());
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    flow.on_log(&mut host, &mut vm);
    deliver_all(&mut host, &mut vm, 200);
    assert!(batches::<ReportBatch>(&host, paths::REPORT).is_empty());
}

#[test]
fn forwarded_measures_its_response_and_the_log_reports_it() {
    let (mut host, mut vm, mut flow) = (FakeHost::new(), vm("{}"), Flow::new());
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    assert_eq!(routed(&mut flow, &mut host, &mut vm, 200, &answer), Step::Resume);
    stream_response(&mut flow, &mut host, &mut vm, 80);
    assert!(matches!(flow.phase(), Phase::Passing), "the log ends every phase");
    deliver_all(&mut host, &mut vm, 200);
    let reports: Vec<headroom_protocol::Report> =
        batches::<ReportBatch>(&host, paths::REPORT).into_iter().flat_map(|b| b.reports).collect();
    assert_eq!(reports.len(), 1);
    assert_eq!((reports[0].status, reports[0].ttft_ms.map(|t| t.round())), (200, Some(80.0)));
}

#[test]
fn asking_for_a_share_of_a_coalesced_call_until_its_answer_or_the_log() {
    let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
    let mut vm = vm_without_flow_control();
    let mut flow = Flow::for_context(2);
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    assert!(matches!(flow.phase(), Phase::Asking(Asking::Coalesced { .. })), "{:?}", flow.phase());
    // Its own call's answer is not what it waits for.
    assert_eq!(flow.on_callout_answer(&mut host, &mut vm, 1, 0), Step::Continue);
    assert!(matches!(flow.phase(), Phase::Asking(Asking::Coalesced { .. })));
    // Its share: forwarded.
    let answer = PredictResponse {
        pool: "default".into(),
        model_version: "test".into(),
        endpoints: vec![EndpointPrediction {
            address: "10.0.0.2:8000".into(),
            ttft_ms: Some(100.0),
            tpot_ms: Some(10.0),
            state: busy(),
        }],
        flow: None,
    };
    assert_eq!(flow.on_coalesced_answer(&mut host, &mut vm, Ok(answer)), Step::Resume);
    assert!(is_forwarded(&flow));
    // Ended while waiting for its share: it leaves the batch, no report.
    let mut gone = Flow::for_context(3);
    assert_eq!(send_request(&mut gone, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    assert!(matches!(gone.phase(), Phase::Asking(Asking::Coalesced { .. })));
    gone.on_log(&mut host, &mut vm);
    assert!(matches!(gone.phase(), Phase::Passing));
}
