//! Routing end to end: a request routed where it meets its SLO and reported, pools, subsets, requests that pass untouched, header-only routing, the per-try timeout.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Each header read or removal is a crossing into Envoy (docs/performance.md, "One read
/// of the header map"): a routed request reads each header map once, removes only the
/// hint headers it carries, and asks where it runs once.
#[test]
fn a_routed_request_reads_each_header_map_once_and_removes_only_what_it_carries() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    let answer = predictions(&[("10.0.0.1:8000", Some(200.0))]);
    assert_eq!(routed(&mut flow, &mut host, &mut vm, 200, &answer), Step::Resume);
    host.upstream = Some("10.0.0.1:8000".into());
    stream_response(&mut flow, &mut host, &mut vm, 50);
    assert!(host.has(Event::Routed(RouteSource::PredictedPositive)));
    assert_eq!(host.name_reads.get(), 0, "no header read by name");
    assert_eq!(host.map_reads.get(), 2, "the request's map, then the response's");
    assert_eq!(host.upstream_reads.get(), 1, "asked at the first token, remembered for the log");
    let mut removed = host.removed.clone();
    removed.sort();
    assert_eq!(removed, ["x-prediction-based-scheduling", "x-slo-ttft-ms"], "the hints it carried, nothing else");

    // A client's own destination is still removed, and a request that is not ours costs one read.
    let (mut host, mut flow) = (FakeHost::new(), Flow::new());
    host.new_stream(&[(":method", "GET"), ("x-gateway-destination-endpoint", "10.9.9.9:80")], "");
    assert_eq!(flow.on_request_headers(&mut host, &mut vm, true), Step::Continue);
    assert_eq!((host.name_reads.get(), host.map_reads.get()), (0, 1), "one map read");
    assert_eq!(host.removed, ["x-gateway-destination-endpoint"]);
    assert_eq!(host.request_header("x-gateway-destination-endpoint"), None);
}

#[test]
fn routes_to_an_endpoint_predicted_to_meet_the_slo_and_reports_what_happened() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"predictor_token":"0123456789abcdef-token","debug_headers":true,"fallback_endpoints":1}"#);
    let mut flow = Flow::new();
    let answer = predictions(&[("10.0.0.1:8000", Some(900.0)), ("10.0.0.2:8000", Some(200.0))]);
    assert_eq!(routed(&mut flow, &mut host, &mut vm, 200, &answer), Step::Resume);

    let call = &host.calls[0];
    assert_eq!(call.cluster, "headroom_predictor");
    assert_eq!(call.header(":path"), Some(paths::PREDICT));
    assert_eq!(call.header("authorization"), Some("Bearer 0123456789abcdef-token"));
    let asked: PredictRequest = codec::decode(Format::MsgPack, &call.body).unwrap();
    assert!(asked.request.input_tokens > 0 && asked.request.streaming);
    assert_eq!(asked.request.slo.ttft_ms, Some(500.0));
    assert!(!asked.request_id.is_empty());
    assert_eq!(host.request_header("x-gateway-destination-endpoint").as_deref(), Some("10.0.0.2:8000,10.0.0.1:8000"));
    assert!(host.has(Event::Routed(RouteSource::PredictedPositive)));
    assert!(host.events.iter().any(|e| matches!(e, Event::PredictorCallMs(_))));
    // A stream's try may wait three times its TTFT goal for its response to begin.
    assert_eq!(host.request_header("x-envoy-upstream-rq-per-try-timeout-ms").as_deref(), Some("1500"));

    host.upstream = Some("10.0.0.2:8000".into());
    stream_response(&mut flow, &mut host, &mut vm, 120);
    assert_eq!(host.header(Map::ResponseHeaders, "x-headroom-tier").as_deref(), Some("positive"));
    assert!(!host.events.iter().any(|e| matches!(e, Event::SloViolation { .. })));

    deliver_all(&mut host, &mut vm, 200);
    let dispatched: Vec<DispatchBatch> = batches(&host, paths::DISPATCH);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    assert_eq!(dispatched.len(), 1);
    // The dispatch names the request and the endpoint (the predictor's record has the
    // rest), and the report carries only what the gateway measured, and where.
    let d = &dispatched[0].dispatches[0];
    assert_eq!((d.request_id.as_str(), d.endpoint.as_str()), (asked.request_id.as_str(), "10.0.0.2:8000"));
    assert!(d.request.is_unset(), "{d:?}");
    let o = &reported[0].reports[0];
    assert_eq!((o.endpoint.as_str(), o.request_id.as_str()), ("10.0.0.2:8000", asked.request_id.as_str()));
    assert_eq!(
        (o.status, o.source, o.ttft_ms, o.failed_at.as_deref()),
        (200, RouteSource::PredictedPositive, Some(120.0), None)
    );
    vm.flush(&mut host); // the next tick counts what was delivered
    assert!(host.has(Event::Outbox(crate::outbox::Counts { reported: 1, ..Default::default() })));
}

/// One gateway, two models: each request is predicted, placed and reported in the pool its
/// model maps to, and a fallback ranks only the states of its own pool.
#[test]
fn a_mapped_model_is_routed_in_its_own_pool() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"model_pools":{"big":"big-pool"}}"#);
    let big = BODY.replace(r#""model":"m""#, r#""model":"big""#);
    let mut flow = Flow::new();
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &SLO, &big), Step::Pause);
    let answer = predictions(&[("10.0.9.1:8000", Some(200.0))]);
    let token = host.answer(200, &answer);
    assert_eq!(flow.on_callout_answer(&mut host, &mut vm, token, answer.len()), Step::Resume);
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[0].body).unwrap();
    assert_eq!((asked.pool.as_str(), asked.request.model.as_str()), ("big-pool", "big"));
    host.upstream = Some("10.0.9.1:8000".into());
    stream_response(&mut flow, &mut host, &mut vm, 100);
    deliver_all(&mut host, &mut vm, 200);
    let dispatched: Vec<DispatchBatch> = batches(&host, paths::DISPATCH);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    assert_eq!(dispatched[0].dispatches[0].pool, "big-pool");
    assert_eq!(reported[0].reports[0].pool, "big-pool");

    // The default model's request times out: big-pool's fresh states are not its to use.
    host.now_ns += 10 * MS;
    let mut other = Flow::new();
    assert_eq!(routed(&mut other, &mut host, &mut vm, 504, b""), Step::Resume);
    let last_predict = host.calls.iter().rev().find(|c| c.header(":path") == Some(paths::PREDICT)).unwrap();
    let asked_default: PredictRequest = codec::decode(Format::MsgPack, &last_predict.body).unwrap();
    assert_eq!(asked_default.pool, "default");
    assert!(host.has(Event::Routed(RouteSource::Envoy)), "no state of its own pool: Envoy balances");
    assert_ne!(host.request_header("x-gateway-destination-endpoint").as_deref(), Some("10.0.9.1:8000"));
}

#[test]
fn a_subset_hint_keeps_the_pick_among_the_endpoints_the_gateway_allows() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"negative_tier_epsilon": 0.0}"#);
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0)), ("10.0.0.2:8000", Some(5000.0))]);
    assert_eq!(routed(&mut Flow::new(), &mut host, &mut vm, 200, &answer), Step::Resume);
    assert_eq!(host.chosen().as_deref(), Some("10.0.0.1:8000"));
    // Only the endpoint predicted to miss is allowed: it gets the request, in the negative tier.
    host.subset = Some(vec!["10.0.0.2:8000".into()]);
    assert_eq!(routed(&mut Flow::new(), &mut host, &mut vm, 200, &answer), Step::Resume);
    assert_eq!(host.chosen().as_deref(), Some("10.0.0.2:8000"));
    assert!(host.has(Event::Routed(RouteSource::PredictedNegative)));
}

#[test]
fn a_subset_hint_naming_no_known_endpoint_is_a_503_saying_so() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    host.subset = Some(vec!["10.9.9.9:8000".into()]);
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    let Step::Reply { status, headers, body } = routed(&mut Flow::new(), &mut host, &mut vm, 200, &answer) else {
        panic!("expected a local reply");
    };
    assert_eq!(status, 503);
    assert!(headers.contains(&(headers::DROPPED_REASON, "rejected-no-endpoints".to_string())), "{headers:?}");
    assert!(String::from_utf8_lossy(&body).contains("subset"));
    assert!(host.has(Event::NoEndpoints));
    // An empty subset allows nothing: refused before any call.
    host.subset = Some(Vec::new());
    let calls = host.calls.len();
    let step = send_request(&mut Flow::new(), &mut host, &mut vm, &SLO, BODY);
    assert!(matches!(step, Step::Reply { status: 503, .. }), "{step:?}");
    assert_eq!(host.calls.len(), calls);
}

#[test]
fn a_fallback_keeps_to_the_subset_even_without_states() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"fallback_endpoints": 1}"#);
    let allowed = ["10.0.0.7:8000", "10.0.0.8:8000"];
    let mut picked = Vec::new();
    for _ in 0..20 {
        host.subset = Some(allowed.iter().map(|a| a.to_string()).collect());
        assert_eq!(routed(&mut Flow::new(), &mut host, &mut vm, 503, b""), Step::Resume);
        let destination = host.request_header("x-gateway-destination-endpoint").unwrap_or_default();
        let (first, next) = destination.split_once(',').unwrap_or_default();
        assert!(allowed.contains(&first) && allowed.contains(&next) && first != next, "{destination}");
        picked.push(first.to_string());
    }
    assert!(allowed.iter().all(|a| picked.iter().any(|p| p == a)), "both picked in turn: {picked:?}");
    assert!(host.has(Event::Routed(RouteSource::Fallback)));
}

#[test]
fn a_request_served_elsewhere_is_reported_where_it_ran_without_the_chosen_prediction() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    routed(&mut flow, &mut host, &mut vm, 200, &answer);
    host.upstream = Some("10.0.0.7:8000".into());
    stream_response(&mut flow, &mut host, &mut vm, 30);
    assert!(host.has(Event::ServedElsewhere));
    deliver_all(&mut host, &mut vm, 200);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    let o = &reported[0].reports[0];
    assert_eq!((o.endpoint.as_str(), o.failed_at.as_deref()), ("10.0.0.7:8000", Some("10.0.0.1:8000")));
}

#[test]
fn other_requests_pass_untouched_but_never_choose_their_endpoint() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    for (method, path) in [("GET", "/v1/models"), ("POST", "/v1/embeddings")] {
        host.new_stream(&[("x-gateway-destination-endpoint", "10.6.6.6:80")], "");
        host.headers.insert((Map::RequestHeaders, ":method".into()), method.into());
        host.headers.insert((Map::RequestHeaders, ":path".into()), path.into());
        let mut flow = Flow::new();
        assert_eq!(flow.on_request_headers(&mut host, &mut vm, true), Step::Continue);
        assert_eq!(host.request_header("x-gateway-destination-endpoint"), None);
        assert_eq!(flow.on_request_body(&mut host, &mut vm, 0, true), Step::Continue);
        flow.on_log(&mut host, &mut vm);
    }
    vm.flush(&mut host);
    assert!(host.calls.is_empty() && host.events.iter().all(|e| matches!(e, Event::Outbox(_))));
}

#[test]
fn header_only_routing_calls_out_on_the_headers() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"read_body":false}"#);
    let mut flow = Flow::new();
    host.new_stream(&[SLO[0], SLO[1], ("content-length", "4000"), ("x-slo-tpot-ms", "50")], "");
    assert_eq!(flow.on_request_headers(&mut host, &mut vm, false), Step::Pause);
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[0].body).unwrap();
    assert!(asked.request.input_tokens >= 500 && asked.request.streaming);
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    let token = host.answer(200, &answer);
    assert_eq!(flow.on_callout_answer(&mut host, &mut vm, token, answer.len()), Step::Resume);
    // The body passes once the decision is made.
    assert_eq!(flow.on_request_body(&mut host, &mut vm, 10, true), Step::Continue);
}

/// Header-only routing: `content-length` is a client's claim. It is held to
/// `max_claimed_body_bytes`, and the predictor books only what the body then carried: a
/// request claiming 64 MiB and sending nothing books nothing (docs/reliability.md).
#[test]
fn a_claimed_size_is_bounded_and_booked_only_as_far_as_the_body_bears_it_out() {
    let dispatched_tokens = |host: &FakeHost| -> Vec<u32> {
        batches::<DispatchBatch>(host, paths::DISPATCH)
            .iter()
            .flat_map(|b| b.dispatches.iter().map(|d| d.request.input_tokens))
            .collect()
    };
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"read_body":false}"#);
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    // 64 MiB claimed: the prediction asks for the bound's worth, not 2^24 tokens.
    let mut liar = Flow::new();
    host.new_stream(&[SLO[0], SLO[1], ("content-length", "67108864")], "");
    assert_eq!(liar.on_request_headers(&mut host, &mut vm, false), Step::Pause);
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[0].body).unwrap();
    let bound = vm.tokens.estimate(None, 1 << 20);
    assert_eq!(asked.request.input_tokens, bound);
    let token = host.answer(200, &answer);
    assert_eq!(liar.on_callout_answer(&mut host, &mut vm, token, answer.len()), Step::Resume);
    // Routed, but no body yet: nothing is dispatched on the claim.
    deliver_all(&mut host, &mut vm, 200);
    assert!(dispatched_tokens(&host).is_empty(), "dispatched on the claim alone");
    // An honest request sends its body: booked at what passed, never above the claim.
    let mut honest = Flow::new();
    host.new_stream(&[SLO[0], SLO[1], ("content-length", "4000")], "");
    assert_eq!(honest.on_request_headers(&mut host, &mut vm, false), Step::Pause);
    let token = host.answer(200, &answer);
    assert_eq!(honest.on_callout_answer(&mut host, &mut vm, token, answer.len()), Step::Resume);
    assert_eq!(honest.on_request_body(&mut host, &mut vm, 3000, false), Step::Continue);
    assert_eq!(honest.on_request_body(&mut host, &mut vm, 1000, true), Step::Continue);
    deliver_all(&mut host, &mut vm, 200);
    assert_eq!(dispatched_tokens(&host), vec![vm.tokens.estimate(None, 4000)]);
    // The liar gives up having sent 400 bytes: dispatched at those, then reported.
    assert_eq!(liar.on_request_body(&mut host, &mut vm, 400, false), Step::Continue);
    liar.on_log(&mut host, &mut vm);
    deliver_all(&mut host, &mut vm, 200);
    assert_eq!(dispatched_tokens(&host), vec![vm.tokens.estimate(None, 4000), vm.tokens.estimate(None, 400)]);
}

#[test]
fn an_answer_to_another_call_is_ignored() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    assert_eq!(send_request(&mut flow, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    let answer = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    let token = host.answer(200, &answer);
    assert_eq!(flow.on_callout_answer(&mut host, &mut vm, token + 1, answer.len()), Step::Continue);
    assert_eq!(host.request_header("x-gateway-destination-endpoint"), None);
    assert_eq!(flow.on_callout_answer(&mut host, &mut vm, token, answer.len()), Step::Resume);
}

#[test]
fn missed_slos_are_counted() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    let mut flow = Flow::new();
    routed(&mut flow, &mut host, &mut vm, 200, &predictions(&[("10.0.0.1:8000", Some(100.0))]));
    host.upstream = Some("10.0.0.1:8000".into());
    stream_response(&mut flow, &mut host, &mut vm, 800);
    assert!(host.has(Event::SloViolation { ttft: true, tpot: false }));
}

#[test]
fn a_reconfigure_keeps_what_is_queued() {
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    routed(&mut Flow::new(), &mut host, &mut vm, 200, &predictions(&[("10.0.0.1:8000", Some(100.0))]));
    vm.reconfigure(FilterConfig::parse(br#"{"predictor_cluster":"other"}"#).unwrap());
    deliver_all(&mut host, &mut vm, 200);
    let last = host.calls.last().unwrap();
    assert_eq!((last.cluster.as_str(), last.header(":path")), ("other", Some(paths::DISPATCH)));
}

#[test]
fn the_first_token_is_reported_as_it_passes_and_not_when_switched_off() {
    for on in [true, false] {
        let mut host = FakeHost::new();
        let mut vm = vm(&format!(r#"{{"first_token_events":{on}}}"#));
        let mut flow = Flow::new();
        routed(&mut flow, &mut host, &mut vm, 200, &predictions(&[("10.0.0.1:8000", Some(100.0))]));
        host.upstream = Some("10.0.0.1:8000".into());
        host.headers.insert((Map::ResponseHeaders, ":status".into()), "200".into());
        host.headers.insert((Map::ResponseHeaders, "content-type".into()), "text/event-stream".into());
        flow.on_response_headers(&mut host, &vm);
        host.now_ns += 42 * MS;
        let chunk = "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n";
        host.buffers.insert(Buffer::ResponseBody, chunk.as_bytes().to_vec());
        flow.on_response_body(&mut host, &mut vm, chunk.len());
        flow.on_response_body(&mut host, &mut vm, chunk.len()); // a second token: still one event
                                                                // Mid-stream, on the tick: the dispatch, then the first token.
        deliver_all(&mut host, &mut vm, 200);
        let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
        let firsts: Vec<_> = reported.iter().flat_map(|b| b.first_tokens.clone()).collect();
        if on {
            assert_eq!(firsts.len(), 1);
            assert_eq!((firsts[0].endpoint.as_str(), firsts[0].ttft_ms), ("10.0.0.1:8000", 42.0));
            assert!(reported.iter().all(|b| b.reports.is_empty()), "the stream is still open");
        } else {
            assert!(firsts.is_empty());
        }
    }
}

/// Llumnix's SLO dispatch threshold: with `ttft_buffer` 0.85 an endpoint predicted at 450 ms
/// for a 500 ms TTFT SLO is not in the positive tier (it would need 425), where at 1 it is.
#[test]
fn a_ttft_buffer_under_one_asks_for_a_margin_under_the_slo() {
    for (config, positive) in [("{}", true), (r#"{"ttft_buffer":0.85}"#, false)] {
        let mut host = FakeHost::new();
        let mut vm = vm(config);
        let mut flow = Flow::new();
        let answer = predictions(&[("10.0.0.1:8000", Some(450.0))]);
        assert_eq!(routed(&mut flow, &mut host, &mut vm, 200, &answer), Step::Resume);
        assert_eq!(host.has(Event::Routed(RouteSource::PredictedPositive)), positive, "{config}");
    }
}

/// A hung server holds a request no longer than its goals allow: the per-try timeout
/// Envoy retries past is the TTFT goal (a stream's headers come as it starts) or the whole
/// answer's (TTFT plus `max_tokens` TPOTs), times the factor, never under the floor.
#[test]
fn the_per_try_timeout_follows_the_request_goals() {
    use crate::flow::try_timeout_ms;
    let config = FilterConfig::default();
    let request = |ttft: Option<f64>, tpot: Option<f64>, streaming: bool, max_tokens: Option<u32>| RequestFeatures {
        slo: Slo { ttft_ms: ttft, tpot_ms: tpot },
        streaming,
        max_tokens,
        ..Default::default()
    };
    assert_eq!(try_timeout_ms(&request(Some(800.0), Some(50.0), true, Some(100)), &config), Some(2400));
    assert_eq!(try_timeout_ms(&request(Some(800.0), Some(50.0), false, Some(100)), &config), Some(17_400));
    assert_eq!(try_timeout_ms(&request(Some(100.0), None, true, None), &config), Some(1000), "the floor");
    assert_eq!(try_timeout_ms(&request(None, Some(50.0), true, Some(100)), &config), None, "no TTFT goal");
    assert_eq!(try_timeout_ms(&request(Some(800.0), None, false, Some(100)), &config), None, "no TPOT goal");
    assert_eq!(try_timeout_ms(&request(Some(800.0), Some(50.0), false, None), &config), None, "no length");
    let off = FilterConfig { try_timeout_slo_factor: 0.0, ..FilterConfig::default() };
    assert_eq!(try_timeout_ms(&request(Some(800.0), Some(50.0), true, Some(100)), &off), None);
    let huge = request(Some(3_600_000.0), Some(3_600_000.0), false, Some(1 << 24));
    assert_eq!(try_timeout_ms(&huge, &config), Some(3_600_000), "held to an hour");
}

/// An llm-d client sends its goals and nothing else: it is routed by them (tiers, flow
/// control, its goal booked as a claim), as llm-d's router does. `x-prediction-based-
/// scheduling: false` opts a request out; `true` opts in one that states no goal.
#[test]
fn slo_headers_alone_route_by_the_slo_and_the_header_still_opts_out() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"flow_control":true}"#);
    let asked = |host: &FakeHost, call: usize| -> PredictRequest {
        codec::decode(Format::MsgPack, &host.calls[call].body).unwrap()
    };
    let llm_d = [("x-llm-d-slo-ttft-ms", "500"), ("x-llm-d-slo-tpot-ms", "50")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &llm_d, BODY), Step::Pause);
    let call = asked(&host, 0);
    assert!(call.request.prediction_based, "placed by its goals");
    assert!(call.flow.is_some(), "and may wait for headroom");
    let out = [llm_d[0], llm_d[1], ("x-prediction-based-scheduling", "false")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &out, BODY), Step::Pause);
    let call = asked(&host, 1);
    assert!(!call.request.prediction_based && call.flow.is_none(), "opted out");
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &[], BODY), Step::Pause);
    assert!(!asked(&host, 2).request.prediction_based, "no goal, no header: lowest latency");
    let asked_in = [("x-prediction-based-scheduling", "true")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &asked_in, BODY), Step::Pause);
    assert!(asked(&host, 3).request.prediction_based, "opted in without a goal");
}
