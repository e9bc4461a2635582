//! Predict calls coalesced: batches, what rides on them, and the predict stream.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The answer of a coalesced call: one prediction per request, each preferring `best`.
fn batch_answer(best: &[&str]) -> Vec<u8> {
    let answers = best
        .iter()
        .map(|b| {
            let other = if *b == "10.0.0.1:8000" { "10.0.0.2:8000" } else { "10.0.0.1:8000" };
            let one = predictions(&[(b, Some(100.0)), (other, Some(5000.0))]);
            codec::decode::<PredictResponse>(Format::MsgPack, &one).unwrap()
        })
        .collect();
    codec::encode(Format::MsgPack, &PredictBatchResponse { answers }).unwrap()
}

/// The requests a coalesced call carried.
fn carried(call: &Call) -> Vec<String> {
    assert_eq!(call.header(":path"), Some(paths::PREDICT_BATCH));
    let batch: PredictBatch = codec::decode(Format::MsgPack, &call.body).unwrap();
    batch.requests.into_iter().map(|r| r.request_id).collect()
}

#[test]
fn predict_calls_made_while_one_is_out_go_together_in_the_next() {
    let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
    let mut vm = vm(r#"{"flow_control":false,"debug_headers":true}"#);
    let (mut a, mut b, mut c) = (Flow::for_context(2), Flow::for_context(3), Flow::for_context(4));

    // An idle worker: the request wakes the root, which sends its call at once, alone.
    assert_eq!(send_request(&mut a, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    assert_eq!((host.wakes, host.calls.len()), (1, 0), "the call goes from the root, not the request");
    assert!(vm.on_wake(&mut host).is_empty());
    assert_eq!(carried(&host.calls[0]).len(), 1);

    // While it is out, two more arrive: no wake-up, no call; they wait for the answer.
    assert_eq!(send_request(&mut b, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    assert_eq!(send_request(&mut c, &mut host, &mut vm, &SLO, BODY), Step::Pause);
    assert_eq!((host.wakes, host.calls.len()), (1, 1));

    // The answer: a's share, and the next call sent with b and c together.
    let body = batch_answer(&["10.0.0.2:8000"]);
    let token = host.answer(200, &body);
    let deliveries = vm.on_predictions_answer(&mut host, token, body.len()).unwrap();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(host.calls.len(), 2);
    assert_eq!(carried(&host.calls[1]).len(), 2, "b and c share one call");
    let d = deliveries.into_iter().next().unwrap();
    assert_eq!(d.context, 2);
    assert_eq!(a.on_coalesced_answer(&mut host, &mut vm, d.answer), Step::Resume);
    assert_eq!(host.chosen().as_deref(), Some("10.0.0.2:8000"));
    assert!(host.has(Event::CoalescedCall { requests: 2, stream: false }));

    // Each of the next answer's shares goes to its own request, in order.
    let body = batch_answer(&["10.0.0.1:8000", "10.0.0.2:8000"]);
    let token = host.answer(200, &body);
    let deliveries = vm.on_predictions_answer(&mut host, token, body.len()).unwrap();
    assert_eq!(deliveries.iter().map(|d| d.context).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(host.calls.len(), 2, "nothing left to send");
    for ((d, flow), want) in deliveries.into_iter().zip([&mut b, &mut c]).zip(["10.0.0.1:8000", "10.0.0.2:8000"]) {
        assert_eq!(flow.on_coalesced_answer(&mut host, &mut vm, d.answer), Step::Resume);
        assert_eq!(host.chosen().as_deref(), Some(want));
    }
    // Both now placed by prediction; a share handed twice changes nothing.
    assert_eq!(host.events.iter().filter(|e| **e == Event::Routed(RouteSource::PredictedPositive)).count(), 3);
    assert_eq!(b.on_coalesced_answer(&mut host, &mut vm, Err(FallbackCause::Timeout)), Step::Continue);
}

#[test]
fn a_coalesced_call_that_fails_sends_each_of_its_requests_to_the_fallback() {
    for (status, body, cause) in [
        (504, Vec::new(), FallbackCause::Timeout),
        (503, Vec::new(), FallbackCause::Unavailable),
        (200, b"not msgpack".to_vec(), FallbackCause::BadAnswer),
        // One answer for two requests: which is whose cannot be known.
        (200, batch_answer(&["10.0.0.1:8000"]), FallbackCause::BadAnswer),
    ] {
        let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
        let mut vm = vm(r#"{"flow_control":false}"#);
        let (mut a, mut b) = (Flow::for_context(2), Flow::for_context(3));
        send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
        send_request(&mut b, &mut host, &mut vm, &SLO, BODY);
        vm.on_wake(&mut host);
        assert_eq!(carried(&host.calls[0]).len(), 2);
        let token = host.answer(status, &body);
        let deliveries = vm.on_predictions_answer(&mut host, token, body.len()).unwrap();
        assert_eq!(deliveries.len(), 2, "{cause:?}");
        for (d, flow) in deliveries.into_iter().zip([&mut a, &mut b]) {
            assert_eq!(d.answer.as_ref().err(), Some(&cause));
            assert_eq!(flow.on_coalesced_answer(&mut host, &mut vm, d.answer), Step::Resume, "{cause:?}");
        }
        assert_eq!(host.events.iter().filter(|e| **e == Event::Fallback(cause)).count(), 2, "{cause:?}");
    }
}

#[test]
fn a_request_that_ends_or_outwaits_the_call_ahead_of_it_is_not_left_waiting() {
    let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
    let mut vm = vm(r#"{"flow_control":false,"predictor_timeout_ms":50}"#);
    let (mut a, mut b, mut c) = (Flow::for_context(2), Flow::for_context(3), Flow::for_context(4));
    send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    send_request(&mut b, &mut host, &mut vm, &SLO, BODY);
    send_request(&mut c, &mut host, &mut vm, &SLO, BODY);
    // b's client leaves: it is not sent.
    b.on_log(&mut host, &mut vm);
    assert_eq!(vm.predictions.waiting(), 1);
    // The call ahead hangs: at the tick past the timeout, c falls back rather than wait for it.
    host.now_ns += 30 * MS;
    assert!(vm.on_tick(&mut host).is_empty(), "not yet");
    host.now_ns += 30 * MS;
    let expired = vm.on_tick(&mut host);
    assert_eq!(expired.iter().map(|d| d.context).collect::<Vec<_>>(), [4]);
    let d = expired.into_iter().next().unwrap();
    assert_eq!(c.on_coalesced_answer(&mut host, &mut vm, d.answer), Step::Resume);
    assert!(host.has(Event::Fallback(FallbackCause::Timeout)));
    // The hung call's answer still reaches a.
    let body = batch_answer(&["10.0.0.1:8000"]);
    let token = host.answer(200, &body);
    let d = vm.on_predictions_answer(&mut host, token, body.len()).unwrap();
    assert_eq!(d.iter().map(|d| d.context).collect::<Vec<_>>(), [2]);
    assert_eq!(host.calls.iter().filter(|c| c.header(":path") == Some(paths::PREDICT_BATCH)).count(), 1);
}

#[test]
fn requests_keep_their_own_call_when_the_host_cannot_wake_the_root_or_the_request_may_wait() {
    // No wake-up: one /v1/predict per request, from the request, as before.
    let mut host = FakeHost::new();
    let mut vm = vm("{}");
    assert_eq!(send_request(&mut Flow::for_context(2), &mut host, &mut vm, &SLO, BODY), Step::Pause);
    assert_eq!(host.calls[0].header(":path"), Some(paths::PREDICT));
    assert_eq!(vm.predictions.waiting(), 0);

    // Switched off.
    let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
    let mut vm_off = self::vm(r#"{"batch_predictions":false}"#);
    send_request(&mut Flow::for_context(2), &mut host, &mut vm_off, &SLO, BODY);
    assert_eq!((host.wakes, host.calls[0].header(":path")), (0, Some(paths::PREDICT)));

    // A request offered to wait in the flow-control queue is answered when it can go: alone.
    let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
    let mut vm_flow = self::vm(r#"{"flow_control":true}"#);
    send_request(&mut Flow::for_context(2), &mut host, &mut vm_flow, &SLO, BODY);
    assert_eq!((host.wakes, host.calls[0].header(":path")), (0, Some(paths::PREDICT)));
    let asked: PredictRequest = codec::decode(Format::MsgPack, &host.calls[0].body).unwrap();
    assert!(asked.flow.is_some());
}

/// A call that may wait in the flow queue gets `flow_max_wait_ms` of budget, so while the
/// predictor answers nothing for a second, new requests do not offer to wait: a frozen
/// predictor costs them the short budget. Its first answer ends that.
#[test]
fn while_the_predictor_answers_nothing_new_requests_do_not_offer_to_wait() {
    let mut host = FakeHost::new();
    let mut vm = vm(r#"{"flow_control":true,"predictor_timeout_ms":50,"flow_max_wait_ms":10000}"#);
    let asked = |host: &FakeHost, i: usize| -> (bool, Duration) {
        let call = &host.calls[i];
        (codec::decode::<PredictRequest>(Format::MsgPack, &call.body).unwrap().flow.is_some(), call.timeout)
    };
    let (mut a, mut b, mut c) = (Flow::new(), Flow::new(), Flow::new());
    send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
    assert_eq!(asked(&host, 0), (true, Duration::from_millis(10_050)), "offers to wait");
    host.now_ns += 999 * MS;
    send_request(&mut b, &mut host, &mut vm, &SLO, BODY);
    assert!(asked(&host, 1).0, "a queued call may rightly take a while");
    host.now_ns += MS;
    send_request(&mut c, &mut host, &mut vm, &SLO, BODY);
    assert_eq!(asked(&host, 2), (false, Duration::from_millis(50)), "a second of silence: the short budget");
    assert!(host.has(Event::FlowWithheld));
    // c's call is answered: the predictor is heard again, and the next request may wait.
    let body = predictions(&[("10.0.0.1:8000", Some(100.0))]);
    let token = host.answer(200, &body);
    assert_eq!(c.on_callout_answer(&mut host, &mut vm, token, body.len()), Step::Resume);
    send_request(&mut Flow::new(), &mut host, &mut vm, &SLO, BODY);
    assert!(asked(&host, 3).0);
}

#[test]
fn a_coalesced_call_that_cannot_start_falls_back_at_once_and_oversized_batches_split() {
    let mut host = FakeHost { can_wake: true, refuse_calls: true, ..FakeHost::new() };
    let mut vm = vm(r#"{"flow_control":false}"#);
    let mut a = Flow::for_context(2);
    send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
    let failed = vm.on_wake(&mut host);
    assert_eq!(failed.len(), 1);
    let d = failed.into_iter().next().unwrap();
    assert_eq!(a.on_coalesced_answer(&mut host, &mut vm, d.answer), Step::Resume);
    assert!(host.has(Event::Fallback(FallbackCause::CallFailed)));

    // Long prompts: a batch over max_batch_bytes goes in parts, nothing dropped.
    let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
    let mut vm = self::vm(r#"{"flow_control":false,"max_batch_bytes":4096}"#);
    let long = format!(r#"{{"model":"m","prompt":"{}","max_tokens":4}}"#, "lorem ipsum dolor sit amet ".repeat(400));
    let mut flows: Vec<Flow> = (2..6).map(Flow::for_context).collect();
    for f in &mut flows {
        send_request(f, &mut host, &mut vm, &SLO, &long);
    }
    let mut sent = 0;
    vm.on_wake(&mut host);
    while sent < host.calls.len() {
        let call = host.calls[sent].clone();
        sent += 1;
        assert!(call.body.len() <= 4096 || carried(&call).len() == 1);
        let n = carried(&call).len();
        let body = batch_answer(&vec!["10.0.0.1:8000"; n]);
        let token = host.answer(200, &body);
        vm.on_predictions_answer(&mut host, token, body.len());
    }
    let total: usize = host.calls.iter().map(|c| carried(c).len()).sum();
    assert_eq!(total, 4);
    assert!(host.calls.len() > 1, "split");
}

/// An idle worker's request, placed by a coalesced call of its own; returns its request id.
fn placed_alone(flow: &mut Flow, host: &mut FakeHost, vm: &mut Vm) -> String {
    send_request(flow, host, vm, &SLO, BODY);
    vm.on_wake(host);
    let call = host.calls.last().unwrap();
    let id = codec::decode::<PredictBatch>(Format::MsgPack, &call.body).unwrap().requests[0].request_id.clone();
    let body = batch_answer(&["10.0.0.1:8000"]);
    let token = host.answer(200, &body);
    let d = vm.on_predictions_answer(host, token, body.len()).unwrap().pop().unwrap();
    assert_eq!(flow.on_coalesced_answer(host, vm, d.answer), Step::Resume);
    id
}

#[test]
fn what_the_worker_owes_rides_on_its_next_predict_call_and_goes_back_to_the_outbox_if_it_fails() {
    let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
    let mut vm = vm(r#"{"flow_control":false}"#);
    let mut a = Flow::for_context(2);
    let a_id = placed_alone(&mut a, &mut host, &mut vm);
    host.upstream = Some("10.0.0.1:8000".into());
    stream_response(&mut a, &mut host, &mut vm, 50);

    // The next request's call carries a's dispatch, and a's first token and observation
    // after it in the same call (the predictor applies dispatches first).
    let mut b = Flow::for_context(3);
    send_request(&mut b, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    let call = host.calls.last().unwrap().clone();
    let carried: PredictBatch = codec::decode(Format::MsgPack, &call.body).unwrap();
    assert_eq!(carried.dispatches.iter().map(|d| d.request_id.as_str()).collect::<Vec<_>>(), [a_id.as_str()]);
    let reports = carried.reports.unwrap();
    assert_eq!((reports.first_tokens.len(), reports.reports.len()), (1, 1));
    assert_eq!(reports.reports[0].request_id, a_id);

    // While it is out, the tick sends no dispatch or report batch of its own.
    let before = host.calls.len();
    vm.on_tick(&mut host);
    assert_eq!(host.calls.len(), before);

    // It fails: b falls back, and what rode goes back to the outbox and is sent again.
    let token = host.answer(503, b"");
    let d = vm.on_predictions_answer(&mut host, token, 0).unwrap().pop().unwrap();
    assert_eq!(b.on_coalesced_answer(&mut host, &mut vm, d.answer), Step::Resume);
    deliver_all(&mut host, &mut vm, 200);
    let dispatched: Vec<String> = batches::<DispatchBatch>(&host, paths::DISPATCH)
        .into_iter()
        .flat_map(|b| b.dispatches.into_iter().map(|d| d.request_id))
        .collect();
    assert_eq!(dispatched.first(), Some(&a_id), "a's dispatch first, then b's: {dispatched:?}");
    assert_eq!(dispatched.len(), 2);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    assert_eq!(reported.iter().map(|r| r.reports.len()).sum::<usize>(), 1);
}

#[test]
fn a_ride_delivered_lets_the_reports_waiting_for_it_go() {
    let mut host = FakeHost { can_wake: true, ..FakeHost::new() };
    let mut vm = vm(r#"{"flow_control":false}"#);
    let mut a = Flow::for_context(2);
    placed_alone(&mut a, &mut host, &mut vm);
    // b's call carries a's dispatch; a's report arrives while it is out.
    let mut b = Flow::for_context(3);
    send_request(&mut b, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    host.upstream = Some("10.0.0.1:8000".into());
    stream_response(&mut a, &mut host, &mut vm, 50);
    let body = batch_answer(&["10.0.0.1:8000"]);
    let token = host.answer(200, &body);
    vm.on_predictions_answer(&mut host, token, body.len());
    // Delivered: the tick sends a's report, which no longer waits for its dispatch.
    vm.on_tick(&mut host);
    let reported: Vec<ReportBatch> = batches(&host, paths::REPORT);
    assert_eq!(reported.iter().map(|r| r.reports.len()).sum::<usize>(), 1);
    assert!(batches::<DispatchBatch>(&host, paths::DISPATCH).is_empty(), "a's dispatch went with b's call only");
}

/// The request ids a message on the predict stream carried.
fn carried_on_stream(message: &[u8]) -> Vec<String> {
    let batch: PredictBatch = codec::decode(Format::MsgPack, message).unwrap();
    batch.requests.into_iter().map(|r| r.request_id).collect()
}

/// The predictor's answer on the stream: `status`, and on 200 one answer per endpoint in `best`.
fn stream_answer(host: &mut FakeHost, status: u16, best: &[&str]) -> usize {
    let answers = codec::decode::<PredictBatchResponse>(Format::MsgPack, &batch_answer(best)).unwrap().answers;
    let answer = headroom_protocol::stream::StreamAnswer { status, answers, error: None };
    let bytes = codec::encode(Format::MsgPack, &answer).unwrap();
    host.buffers.insert(Buffer::StreamMessage, bytes.clone());
    bytes.len()
}

/// A VM whose predict stream is open (opened on a tick, its headers answered): its token.
fn open_stream(host: &mut FakeHost, vm: &mut Vm) -> u32 {
    vm.on_tick(host);
    let token = host.streams.last().expect("a stream was opened").0;
    vm.on_stream_headers(host, token);
    token
}

#[test]
fn coalesced_calls_go_on_the_stream_once_the_predictor_has_answered_its_headers() {
    let mut host = FakeHost { can_wake: true, can_stream: true, ..FakeHost::new() };
    let mut vm = vm(r#"{"flow_control":false,"predictor_token":"0123456789abcdef"}"#);

    // Opened from the tick, to the predictor cluster, with the token as metadata.
    vm.on_tick(&mut host);
    let (token, cluster, method, metadata) = host.streams[0].clone();
    assert_eq!((cluster.as_str(), method.as_str()), ("headroom_predictor", headroom_protocol::stream::PATH));
    assert_eq!(metadata, [("authorization".to_string(), "Bearer 0123456789abcdef".to_string())]);

    // Until the predictor answers its headers, calls go over HTTP: a stream nobody serves costs nothing.
    let mut a = Flow::for_context(2);
    send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    assert_eq!((host.calls.len(), host.sent.len()), (1, 0));
    let body = batch_answer(&["10.0.0.1:8000"]);
    let http = host.answer(200, &body);
    vm.on_predictions_answer(&mut host, http, body.len());

    // Open: the next calls are messages on it, one out at a time, each answered in turn.
    vm.on_stream_headers(&mut host, token);
    assert!(host.has(Event::PredictStream { open: true }));
    let (mut b, mut c, mut d) = (Flow::for_context(3), Flow::for_context(4), Flow::for_context(5));
    send_request(&mut b, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    send_request(&mut c, &mut host, &mut vm, &SLO, BODY);
    send_request(&mut d, &mut host, &mut vm, &SLO, BODY);
    assert_eq!((host.calls.len(), host.sent.len()), (1, 1), "no HTTP call; c and d wait for b's answer");
    assert_eq!(host.sent[0].0, token);
    assert_eq!(carried_on_stream(&host.sent[0].1).len(), 1);

    let size = stream_answer(&mut host, 200, &["10.0.0.2:8000"]);
    let shares = vm.on_stream_message(&mut host, token, size);
    assert_eq!(shares.iter().map(|s| s.context).collect::<Vec<_>>(), [3]);
    assert_eq!(carried_on_stream(&host.sent[1].1).len(), 2, "c and d together in the next message");
    assert!(host.has(Event::CoalescedCall { requests: 2, stream: true }));
    let share = shares.into_iter().next().unwrap();
    assert_eq!(b.on_coalesced_answer(&mut host, &mut vm, share.answer), Step::Resume);
    assert_eq!(host.chosen().as_deref(), Some("10.0.0.2:8000"));

    // An answer refused in the stream, or with the wrong count, sends its requests to the fallback.
    let size = stream_answer(&mut host, 404, &[]);
    let shares = vm.on_stream_message(&mut host, token, size);
    assert!(shares.iter().all(|s| s.answer.as_ref().err() == Some(&FallbackCause::Unavailable)), "{shares:?}");
    assert_eq!(shares.len(), 2);
    let mut e = Flow::for_context(6);
    send_request(&mut e, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    let size = stream_answer(&mut host, 200, &["10.0.0.1:8000", "10.0.0.2:8000"]);
    let shares = vm.on_stream_message(&mut host, token, size);
    assert_eq!(shares[0].answer.as_ref().err(), Some(&FallbackCause::BadAnswer));
    assert_eq!(host.calls.len(), 1, "every call after the headers went on the stream");
}

#[test]
fn a_stream_that_closes_or_stalls_sends_its_requests_to_the_fallback_and_is_reopened_later() {
    let mut host = FakeHost { can_wake: true, can_stream: true, ..FakeHost::new() };
    let mut vm = vm(r#"{"flow_control":false,"predictor_timeout_ms":50}"#);
    let token = open_stream(&mut host, &mut vm);

    // Closed with a call out (the predictor restarted): that call's request falls back.
    let mut a = Flow::for_context(2);
    send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    assert_eq!(host.sent.len(), 1);
    let shares = vm.on_stream_closed(&mut host, token, 14);
    assert_eq!(shares.len(), 1);
    assert_eq!(shares[0].answer.as_ref().err(), Some(&FallbackCause::Unavailable));
    assert!(host.has(Event::PredictStream { open: false }));

    // Meanwhile calls go over HTTP; the stream is reopened a second later, not at once.
    let mut b = Flow::for_context(3);
    send_request(&mut b, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    assert_eq!(host.calls.len(), 1);
    let body = batch_answer(&["10.0.0.1:8000"]);
    let http = host.answer(200, &body);
    vm.on_predictions_answer(&mut host, http, body.len());
    host.now_ns += 500 * MS;
    vm.on_tick(&mut host);
    assert_eq!(host.streams.len(), 1, "not yet");
    host.now_ns += 500 * MS;
    let token = open_stream(&mut host, &mut vm);
    assert_eq!(host.streams.len(), 2);

    // An answer overdue on the stream: its request falls back at the tick past the timeout,
    // the stream is reset, and a late answer on it is not taken for anyone's.
    let mut c = Flow::for_context(4);
    send_request(&mut c, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    host.now_ns += 30 * MS;
    assert!(vm.on_tick(&mut host).is_empty(), "not yet");
    host.now_ns += 30 * MS;
    let shares = vm.on_tick(&mut host);
    assert_eq!(shares.len(), 1);
    assert_eq!(shares[0].answer.as_ref().err(), Some(&FallbackCause::Timeout));
    assert_eq!(host.cancelled, [token]);
    let size = stream_answer(&mut host, 200, &["10.0.0.1:8000"]);
    assert!(vm.on_stream_message(&mut host, token, size).is_empty());
}

#[test]
fn a_stream_the_predictor_never_answers_costs_no_request_and_is_retried_ever_later() {
    let mut host = FakeHost { can_wake: true, can_stream: true, ..FakeHost::new() };
    let mut vm = vm(r#"{"flow_control":false}"#);
    let mut waits = Vec::new();
    let mut last_open = host.now_ns;
    for _ in 0..7 {
        // Opened on a tick, refused before its headers (a cluster without HTTP/2).
        while host.streams.len() == waits.len() {
            host.now_ns += 20 * MS;
            vm.on_tick(&mut host);
        }
        waits.push((host.now_ns - last_open) / MS);
        last_open = host.now_ns;
        let token = host.streams.last().unwrap().0;
        let mut a = Flow::for_context(2 + waits.len() as u32);
        send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
        vm.on_wake(&mut host);
        let body = batch_answer(&["10.0.0.1:8000"]);
        let http = host.answer(200, &body);
        assert!(vm.on_predictions_answer(&mut host, http, body.len()).unwrap()[0].answer.is_ok(), "over HTTP");
        // Every other time Envoy answers with headers and the close together (gRPC's
        // trailers-only reply): a stream that never carried an answer is refused all the same.
        if waits.len() % 2 == 0 {
            vm.on_stream_headers(&mut host, token);
        }
        assert!(vm.on_stream_closed(&mut host, token, 14).is_empty(), "no call was out on it");
    }
    assert!(host.sent.is_empty());
    assert_eq!(waits[1..], [1000, 2000, 4000, 8000, 16000, 30000], "{waits:?}");

    // A send the stream refuses goes over HTTP, and the stream is reset.
    let mut host = FakeHost { can_wake: true, can_stream: true, refuse_stream_sends: true, ..FakeHost::new() };
    let mut vm = self::vm(r#"{"flow_control":false}"#);
    let token = open_stream(&mut host, &mut vm);
    let mut a = Flow::for_context(2);
    send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
    assert!(vm.on_wake(&mut host).is_empty());
    assert_eq!((host.calls.len(), host.cancelled.as_slice()), (1, &[token][..]));

    // Switched off: no stream.
    let mut host = FakeHost { can_wake: true, can_stream: true, ..FakeHost::new() };
    let mut vm = self::vm(r#"{"flow_control":false,"predict_stream":false}"#);
    vm.on_tick(&mut host);
    assert!(host.streams.is_empty());

    // Switched off while a call is out on the stream: reset, and its request falls back at
    // once rather than at its timeout (the same for a stream reset on a replica's failover).
    let mut host = FakeHost { can_wake: true, can_stream: true, ..FakeHost::new() };
    let mut vm = self::vm(r#"{"flow_control":false}"#);
    let token = open_stream(&mut host, &mut vm);
    let mut a = Flow::for_context(2);
    send_request(&mut a, &mut host, &mut vm, &SLO, BODY);
    vm.on_wake(&mut host);
    assert_eq!(host.sent.len(), 1);
    vm.reconfigure(FilterConfig::parse(br#"{"predict_stream":false}"#).unwrap());
    let shares = vm.on_tick(&mut host);
    assert_eq!(host.cancelled, [token]);
    assert_eq!(shares.len(), 1);
    assert_eq!(shares[0].answer.as_ref().err(), Some(&FallbackCause::Unavailable));
}
