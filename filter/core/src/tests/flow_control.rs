//! Flow control from the filter's side: offering to wait, tenants, released requests, shedding after the queue, callers that leave.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn a_sheddable_request_no_endpoint_can_serve_gets_429() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    let headers = [SLO[0], SLO[1], ("x-request-priority", "-1")];
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &headers, BODY), Step::Pause);
    let answer = predictions(&[("10.0.0.1:8000", Some(900.0)), ("10.0.0.2:8000", Some(800.0))]);
    let token = host.answer(200, &answer);
    let Step::Reply { status, headers, body } = flow.on_callout_answer(&mut host, &mut vm, token, answer.len()) else {
        panic!("expected a local reply");
    };
    assert_eq!(status, 429);
    assert!(headers.contains(&("retry-after", "1".to_string())));
    assert!(headers.contains(&(headers::DROPPED_REASON, "rejected-saturated".to_string())), "{headers:?}");
    assert!(String::from_utf8_lossy(&body).contains("x-request-priority"));
    assert!(host.has(Event::Shed));
    // A shed request is not a routed one: nothing dispatched or reported.
    flow.on_log(&mut host, &mut vm);
    deliver_all(&mut host, &mut vm, 200);
    assert_eq!(host.calls.len(), 1);
}

#[test]
fn with_flow_control_an_slo_request_offers_to_wait_and_the_call_waits_as_long() {
    let mut host = FakeHost::new();
    let mut vm = vm(
        r#"{"flow_control":true,"flow_max_wait_ms":3000,"tpot_buffer":1.5,"ttft_buffer":0.85,"flow_dispatch_horizon_ms":90}"#,
    );
    let headers = [SLO[0], SLO[1], ("x-llm-d-inference-fairness-id", "team-a")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &headers, BODY), Step::Pause);
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[0].body).unwrap();
    let terms = asked.flow.expect("flow terms sent");
    assert_eq!((terms.max_wait_ms, terms.tpot_buffer), (3000, 1.5));
    assert_eq!((asked.request.tenant.as_str(), terms.fairness_id.as_str()), ("team-a", ""), "the tenant said once");
    assert_eq!(terms.ttft_buffer, 0.85, "the predictor judges headroom with the filter's buffers");
    assert_eq!(terms.dispatch_horizon_ms, 90);
    assert_eq!(host.calls[0].timeout, Duration::from_millis(3050));

    // Opted out of SLO routing there is no headroom to wait for: answered at once.
    let opted_out = [SLO[0], ("x-prediction-based-scheduling", "false")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &opted_out, BODY), Step::Pause);
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[1].body).unwrap();
    assert_eq!((asked.flow, host.calls[1].timeout), (None, Duration::from_millis(50)));
}

/// With a trusted tenant header configured, a client cannot name its tenant, or claim
/// another's: only the trusted header counts, and without it the request is anonymous.
#[test]
fn a_trusted_tenant_header_is_the_only_source_of_the_tenant() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"flow_control":true,"trusted_fairness_header":"x-auth-tenant"}"#);
    let tenant_of = |host: &FakeHost, call: usize| {
        let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[call].body).unwrap();
        asked.request.tenant
    };
    let claimed = [SLO[0], SLO[1], ("x-llm-d-inference-fairness-id", "team-a"), ("x-auth-tenant", "team-b")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &claimed, BODY), Step::Pause);
    assert_eq!(tenant_of(&host, 0), "team-b");
    let unauthenticated = [SLO[0], SLO[1], ("x-llm-d-inference-fairness-id", "team-b")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &unauthenticated, BODY), Step::Pause);
    assert_eq!(tenant_of(&host, 1), "", "a client's own header names no tenant");
    let alias = [SLO[0], SLO[1], (headers::FAIRNESS_ID_ALIAS, "team-a")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &alias, BODY), Step::Pause);
    assert_eq!(tenant_of(&host, 2), "", "nor does its alias");
    // Trusted under the llm-d name itself: the client's alias still names nothing.
    let mut trusted = self::vm(r#"{"flow_control":true,"trusted_fairness_header":"x-llm-d-inference-fairness-id"}"#);
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut trusted, &alias, BODY), Step::Pause);
    assert_eq!(tenant_of(&host, 3), "", "a trusted header has no alias");
}

#[test]
fn the_tenant_header_has_the_gateway_api_alias() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"flow_control":true}"#);
    let tenant_of = |host: &FakeHost, call: usize| {
        let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[call].body).unwrap();
        asked.request.tenant
    };
    let alias = [SLO[0], SLO[1], (headers::FAIRNESS_ID_ALIAS, "team-a")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &alias, BODY), Step::Pause);
    assert_eq!(tenant_of(&host, 0), "team-a");
    let both = [SLO[0], SLO[1], (headers::FAIRNESS_ID, "team-b"), (headers::FAIRNESS_ID_ALIAS, "team-a")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &both, BODY), Step::Pause);
    assert_eq!(tenant_of(&host, 1), "team-b", "the llm-d name wins");
    let long = "t".repeat(headroom_protocol::limits::MAX_NAME_BYTES + 1);
    let too_long = [SLO[0], SLO[1], (headers::FAIRNESS_ID_ALIAS, long.as_str())];
    let Step::Reply { status: 400, body, .. } = send_request(&mut Flow::new(), &mut host, &mut vm, &too_long, BODY)
    else {
        panic!("a tenant too long is refused")
    };
    assert!(String::from_utf8_lossy(&body).contains(headers::FAIRNESS_ID_ALIAS), "the 400 names the header it read");
    // Another configured header has no alias.
    let mut other = self::vm(r#"{"flow_control":true,"fairness_header":"x-tenant"}"#);
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut other, &alias, BODY), Step::Pause);
    assert_eq!(tenant_of(&host, 2), "");
}

#[test]
fn a_released_request_is_judged_against_the_slo_left_after_its_wait() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"flow_control":true,"negative_tier_epsilon":0}"#);
    // 200 ms predicted against a 500 ms SLO: positive, unless 400 ms went by in the queue.
    let endpoints = [("10.0.0.1:8000", Some(200.0))];
    let fresh = predictions_after(
        &endpoints,
        Some(FlowAnswer { outcome: FlowOutcome::Released, waited_ms: 100.0, cleared: Vec::new() }),
    );
    assert_eq!(routed(&mut Flow::new(), &mut host, &mut vm, 200, &fresh), Step::Resume);
    assert!(host.has(Event::Routed(RouteSource::PredictedPositive)));
    assert!(host.has(Event::Flow { outcome: FlowOutcome::Released, waited_ms: 100 }));
    host.events.clear();
    let late = predictions_after(
        &endpoints,
        Some(FlowAnswer { outcome: FlowOutcome::Expired, waited_ms: 400.0, cleared: Vec::new() }),
    );
    assert_eq!(routed(&mut Flow::new(), &mut host, &mut vm, 200, &late), Step::Resume);
    assert!(host.has(Event::Routed(RouteSource::PredictedNegative)), "{:?}", host.events);
}

#[test]
fn a_sheddable_request_expired_or_refused_by_a_saturated_fleet_gets_429_even_with_an_idle_endpoint() {
    for outcome in [FlowOutcome::Expired, FlowOutcome::Saturated] {
        let mut host = FakeHost::new();
        let mut vm = vm(r#"{"flow_control":true}"#);
        let mut flow = Flow::new();
        let headers = [SLO[0], SLO[1], ("x-request-priority", "-1")];
        assert_eq!(send_request(&mut flow, &mut host, &mut vm, &headers, BODY), Step::Pause);
        let answer = predictions_after(
            &[("10.0.0.1:8000", Some(100.0))],
            Some(FlowAnswer { outcome, waited_ms: 480.0, cleared: Vec::new() }),
        );
        let token = host.answer(200, &answer);
        let step = flow.on_callout_answer(&mut host, &mut vm, token, answer.len());
        let Step::Reply { status: 429, headers, .. } = step else { panic!("{outcome:?}: {step:?}") };
        let reason = if outcome == FlowOutcome::Expired { "rejected-ttl-expired" } else { "rejected-saturated" };
        assert!(headers.contains(&(headers::DROPPED_REASON, reason.to_string())), "{outcome:?}: {headers:?}");
        assert!(host.has(Event::Shed));
    }
}

#[test]
fn a_429_after_the_queue_names_how_the_request_left_it_when_debug_headers_are_on() {
    // The benchmark's per-request log reads these from every response: without them on
    // the 429s, refusals at admission and after waiting could not be told apart.
    let reply = |config: &str, outcome: FlowOutcome| {
        let mut host = FakeHost::new();
        let mut vm = vm(config);
        let mut flow = Flow::new();
        let headers = [SLO[0], SLO[1], ("x-request-priority", "-1")];
        assert_eq!(send_request(&mut flow, &mut host, &mut vm, &headers, BODY), Step::Pause);
        // Released with room nowhere (900 ms against a 500 ms SLO): the tiers shed it.
        let predicted = if outcome == FlowOutcome::Released { 900.0 } else { 100.0 };
        let answer = predictions_after(
            &[("10.0.0.1:8000", Some(predicted))],
            Some(FlowAnswer { outcome, waited_ms: 480.0, cleared: Vec::new() }),
        );
        let token = host.answer(200, &answer);
        match flow.on_callout_answer(&mut host, &mut vm, token, answer.len()) {
            Step::Reply { status: 429, headers, .. } => headers,
            other => panic!("{outcome:?}: {other:?}"),
        }
    };
    let debug = r#"{"flow_control":true,"debug_headers":true}"#;
    for (outcome, name) in
        [(FlowOutcome::Saturated, "saturated"), (FlowOutcome::Expired, "expired"), (FlowOutcome::Released, "released")]
    {
        let headers = reply(debug, outcome);
        assert!(headers.contains(&(headers::DEBUG_FLOW, name.to_string())), "{outcome:?}: {headers:?}");
        assert!(headers.contains(&(headers::DEBUG_QUEUED, "480".to_string())), "{outcome:?}: {headers:?}");
    }
    let quiet = reply(r#"{"flow_control":true,"debug_headers":false}"#, FlowOutcome::Saturated);
    assert!(quiet.iter().all(|(h, _)| !h.starts_with("x-headroom-")), "debug headers off: {quiet:?}");
    // Why it was dropped is no debug header: every 429 says it.
    assert!(quiet.contains(&(headers::DROPPED_REASON, "rejected-saturated".to_string())), "{quiet:?}");
}

#[test]
fn a_request_whose_client_leaves_while_the_predictor_holds_it_is_reported_abandoned() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"flow_control":true}"#);
    let mut flow = Flow::new();
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[0].body).unwrap();
    // The client goes away: Envoy logs the stream with the call still under way.
    flow.on_log(&mut host, &mut vm);
    deliver_all(&mut host, &mut vm, 200);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0].abandoned.len(), 1);
    assert_eq!(reported[0].abandoned[0].request_id, asked.request_id);
    assert!(reported[0].reports.is_empty(), "never dispatched: nothing observed");
    // An answer arriving afterwards is for nobody.
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    let token = host.answer(200, &answer);
    assert_eq!(flow.on_callout_answer(&mut host, &mut vm, token, answer.len()), Step::Continue);
}
