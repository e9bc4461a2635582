//! Token counts learned from usage blocks, and the context check they enable.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The model's own count of a prompt (`usage.prompt_tokens`) teaches the VM its bytes per
/// token: the next prompt to that model is estimated at it, in the features the predictor
/// and every token-load score read (real vLLM's tokenizer counted twice the approximation).
#[test]
fn the_usage_block_teaches_the_next_requests_token_count() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let prompt = "lorem ipsum dolor sit amet ".repeat(40); // 1,080 bytes
    let body = format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":4}}"#);
    let asked_tokens = |host: &FakeHost| -> u32 {
        let call = host.calls.iter().rev().find(|c| c.header(":path") == Some(paths::PREDICT)).unwrap();
        codec::decode::<PredictRequest>(Format::MsgPack, &call.body).unwrap().request.input_tokens
    };
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    for round in 0..3 {
        let mut flow = Flow::new();
        assert_eq!(send_request(&mut flow, &mut host, &mut vm, &SLO, &body), Step::Pause);
        let asked = asked_tokens(&host);
        match round {
            0 => assert_eq!(asked, 270, "the approximation before any answer: 1,080 bytes / 4"),
            1 => assert!((470..=540).contains(&asked), "one answer moves it most of the way: {asked}"),
            _ => assert!((500..=540).contains(&asked), "closer with the next: {asked}"),
        }
        let token = host.answer(200, &answer);
        assert_eq!(flow.on_callout_answer(&mut host, &mut vm, token, answer.len()), Step::Resume);
        host.headers.insert((Map::ResponseHeaders, ":status".into()), "200".into());
        host.headers.insert((Map::ResponseHeaders, "content-type".into()), "application/json".into());
        flow.on_response_headers(&mut host, &vm);
        // The model counted 540 tokens: 2 bytes a token.
        let reply = br#"{"choices":[{"text":"abcd"}],"usage":{"prompt_tokens":540,"completion_tokens":4}}"#;
        host.buffers.insert(Buffer::ResponseBody, reply.to_vec());
        flow.on_response_body(&mut host, &mut vm, reply.len());
        flow.on_log(&mut host, &mut vm);
    }
    // Three answers taught it; a model not seen yet starts from the pool's ratio.
    assert_eq!(vm.tokens.ratio(Some("m")).1, 3);
    assert!(vm.tokens.ratio(Some("never-seen")).0 < 2.1);
}

/// A request no server's context can hold is answered 400 by the gateway, naming why, once
/// the VM knows the model's token count; servers too small for it are left out while
/// another can take it; before any answer taught the count, the server is left to judge.
#[test]
fn a_request_past_every_servers_context_is_a_400_once_the_count_is_known() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let prompt = "lorem ipsum dolor sit amet ".repeat(200); // 5,400 bytes
    let body = format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":100}}"#);
    let answer = |contexts: &[u32]| {
        let a = PredictResponse {
            flow: None,
            pool: "default".into(),
            model_version: "test".into(),
            endpoints: contexts
                .iter()
                .enumerate()
                .map(|(i, &c)| EndpointPrediction {
                    address: format!("10.0.0.{}:8000", i + 1),
                    ttft_ms: Some(100.0),
                    tpot_ms: Some(10.0),
                    state: EndpointState { max_context_tokens: Some(c), ..busy() },
                })
                .collect(),
        };
        codec::encode(Format::MsgPack, &a).unwrap()
    };
    let ask = |host: &mut FakeHost, vm: &mut Vm, contexts: &[u32]| {
        let mut flow = Flow::new();
        assert_eq!(send_request(&mut flow, host, vm, &SLO, &body), Step::Pause);
        let reply = answer(contexts);
        let token = host.answer(200, &reply);
        (flow.on_callout_answer(host, vm, token, reply.len()), flow)
    };
    // Not yet taught: 1,350 tokens by the approximation, the model counts 2,700; a 2,048
    // context is not judged on a guess.
    let (step, _) = ask(&mut host, &mut vm, &[2048]);
    assert_eq!(step, Step::Resume);
    vm.tokens.learn("m", 5400, 2700);
    for _ in 0..20 {
        vm.tokens.learn("m", 5400, 2700);
    }
    match ask(&mut host, &mut vm, &[2048, 2048]).0 {
        Step::Reply { status: 400, body, .. } => {
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains("max_tokens") && text.contains("context"), "{text}");
        }
        other => panic!("expected a 400, got {other:?}"),
    }
    // One server with room: it takes the request.
    let (step, _) = ask(&mut host, &mut vm, &[2048, 4096]);
    assert_eq!(step, Step::Resume);
    assert_eq!(host.request_header("x-gateway-destination-endpoint").as_deref(), Some("10.0.0.2:8000"));
}
