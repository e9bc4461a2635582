//! Bad input: each a clear status naming the field, and nothing of it reaching the server.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn a_body_over_max_body_bytes_is_a_413_naming_body() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"max_body_bytes": 1024}"#);
    let big = format!(r#"{{"model":"m","prompt":"{}","max_tokens":4}}"#, "x".repeat(2000));
    let step = send_request(&mut Flow::new(), &mut host, &mut vm, &SLO, &big);
    let Step::Reply { status, body, .. } = step else { panic!("expected a 413, got {step:?}") };
    assert_eq!(status, 413);
    assert!(String::from_utf8_lossy(&body).contains("\"body\""), "{}", String::from_utf8_lossy(&body));
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &SLO, BODY), Step::Pause, "a small body goes on");
}

#[test]
fn a_tenant_name_longer_than_the_contract_allows_is_a_400_naming_the_header() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"flow_control":true}"#);
    let long = "t".repeat(300);
    let headers = [SLO[0], SLO[1], ("x-llm-d-inference-fairness-id", long.as_str())];
    let step = send_request(&mut Flow::new(), &mut host, &mut vm, &headers, BODY);
    let Step::Reply { status, body, .. } = step else { panic!("expected a 400, got {step:?}") };
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("x-llm-d-inference-fairness-id"));
}

#[test]
fn an_invalid_slo_header_is_a_400_naming_it_and_hints_never_reach_the_server() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    host.new_stream(&[("x-slo-ttft-ms", "soon"), ("x-request-priority", "1")], BODY);
    let Step::Reply { status, body, .. } = flow.on_request_headers(&mut host, &mut vm, false) else {
        panic!("expected a local reply");
    };
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("x-slo-ttft-ms"));
    assert!(host.has(Event::BadRequest));
    assert_eq!(host.request_header("x-request-priority"), None);
    assert!(host.calls.is_empty());
}

#[test]
fn a_body_that_is_not_an_inference_request_is_a_400_naming_the_field() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    for (body, field) in [("{not json", "body"), (r#"{"model":"m"}"#, "prompt")] {
        let Step::Reply { status, body, .. } = send_request(&mut Flow::new(), &mut host, &mut vm, &SLO, body) else {
            panic!("expected a local reply for {body}");
        };
        assert_eq!(status, 400);
        assert!(String::from_utf8_lossy(&body).contains(field), "{}", String::from_utf8_lossy(&body));
    }
    // Headers that end the stream: no body at all.
    host.new_stream(&SLO, "");
    assert!(matches!(Flow::new().on_request_headers(&mut host, &mut vm, true), Step::Reply { status: 400, .. }));
    assert!(host.calls.is_empty());
}

/// `n`, `best_of` and a list's prompts are sequences the engine runs: the predictor is told
/// how many, and past `max_sequences` the gateway refuses, naming `n`. Whether a request is
/// placed by its goals goes along too: only then does its TPOT goal hold others.
#[test]
fn the_sequences_a_request_asks_are_counted_or_refused() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"max_sequences":8}"#);
    let body = r#"{"model":"m","prompt":["a story","another"],"n":3,"max_tokens":16,"stream":true}"#;
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &SLO, body), Step::Pause);
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[0].body).unwrap();
    assert_eq!((asked.request.sequences, asked.request.prediction_based), (6, true));
    let opted_out = [("x-slo-ttft-ms", "500"), ("x-prediction-based-scheduling", "false")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &opted_out, BODY), Step::Pause);
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[1].body).unwrap();
    assert_eq!((asked.request.sequences, asked.request.prediction_based), (1, false));
    let greedy = r#"{"model":"m","prompt":"x","n":3,"best_of":9}"#;
    let Step::Reply { status, body, .. } = send_request(&mut Flow::new(), &mut host, &mut vm, &SLO, greedy) else {
        panic!("expected a local reply");
    };
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 400);
    assert!(body.contains("\"n\"") && body.contains("9 sequences"), "{body}");
    assert_eq!(host.calls.len(), 2, "refused before any predict call");
}
