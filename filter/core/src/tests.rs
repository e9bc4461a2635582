//! The filter's flow end to end without Envoy: `Flow` and `Vm` driven through a
//! fake `Host`, callback by callback, the way Envoy drives them. Each test is one
//! path the e2e suite also takes through the real Envoy.

use std::cell::Cell;
use std::collections::HashMap;
use std::time::Duration;

use headroom_protocol::{
    codec, headers, paths, DispatchBatch, EndpointPrediction, EndpointState, FlowAnswer, FlowOutcome, Format,
    PredictBatch, PredictBatchResponse, PredictRequest, PredictResponse, ReportBatch, RequestFeatures, RouteSource,
    Slo,
};

use crate::flow::{Flow, Step};
use crate::header_map::HeaderMap;
use crate::host::{Buffer, Event, FallbackCause, Host, HostError, Level, Map};
use crate::vm::Vm;
use crate::FilterConfig;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const MS: u64 = 1_000_000;

/// A call the filter started.
#[derive(Debug, Clone)]
struct Call {
    token: u32,
    cluster: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Duration,
}

impl Call {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// A stream the filter opened: token, cluster, `/service/method`, metadata.
type Opened = (u32, String, String, Vec<(String, String)>);

/// Envoy as the flow sees it: header maps, bodies, a clock, and records of what the
/// filter did.
#[derive(Default)]
struct FakeHost {
    now_ns: u64,
    headers: HashMap<(Map, String), String>,
    buffers: HashMap<Buffer, Vec<u8>>,
    upstream: Option<String>,
    /// The gateway's subset hint (`Host::endpoint_subset`).
    subset: Option<Vec<String>>,
    /// `http_call` fails (as for a cluster Envoy does not have).
    refuse_calls: bool,
    calls: Vec<Call>,
    events: Vec<Event>,
    logs: Vec<(Level, String)>,
    /// The host can wake the root (`Host::wake`): predict calls are coalesced.
    can_wake: bool,
    wakes: u32,
    /// The host has gRPC streams (`Host::open_stream`).
    can_stream: bool,
    /// Streams opened.
    streams: Vec<Opened>,
    /// Messages sent on streams: token, message.
    sent: Vec<(u32, Vec<u8>)>,
    /// `send_stream` fails.
    refuse_stream_sends: bool,
    /// Streams reset.
    cancelled: Vec<u32>,
    /// Host calls on the request path: one name read of a stream's headers, a whole map
    /// read, `upstream.address` read, and the names removed.
    name_reads: Cell<u32>,
    map_reads: Cell<u32>,
    upstream_reads: Cell<u32>,
    removed: Vec<String>,
}

impl Host for FakeHost {
    fn now_ns(&self) -> u64 {
        self.now_ns
    }

    fn header(&self, map: Map, name: &str) -> Option<String> {
        if map != Map::CalloutHeaders {
            self.name_reads.set(self.name_reads.get() + 1);
        }
        self.headers.get(&(map, name.to_string())).cloned()
    }

    fn headers(&self, map: Map) -> HeaderMap {
        self.map_reads.set(self.map_reads.get() + 1);
        let mut pairs: Vec<(String, String)> =
            self.headers.iter().filter(|((m, _), _)| *m == map).map(|((_, n), v)| (n.clone(), v.clone())).collect();
        pairs.sort();
        HeaderMap::new(pairs)
    }

    fn set_header(&mut self, map: Map, name: &str, value: &str) -> Result<(), HostError> {
        self.headers.insert((map, name.to_string()), value.to_string());
        Ok(())
    }

    fn remove_header(&mut self, map: Map, name: &str) -> Result<(), HostError> {
        self.removed.push(name.to_string());
        self.headers.remove(&(map, name.to_string()));
        Ok(())
    }

    fn buffer(&self, buffer: Buffer, size: usize) -> Option<Vec<u8>> {
        self.buffers.get(&buffer).map(|b| b[..size.min(b.len())].to_vec())
    }

    fn upstream_address(&self) -> Option<String> {
        self.upstream_reads.set(self.upstream_reads.get() + 1);
        self.upstream.clone()
    }

    fn endpoint_subset(&self) -> Option<Vec<String>> {
        self.subset.clone()
    }

    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, HostError> {
        if self.refuse_calls {
            return Err(HostError(1));
        }
        let token = self.calls.len() as u32 + 100;
        self.calls.push(Call {
            token,
            cluster: cluster.to_string(),
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            body: body.to_vec(),
            timeout,
        });
        Ok(token)
    }

    fn open_stream(
        &mut self,
        cluster: &str,
        service: &str,
        method: &str,
        metadata: &[(&str, &str)],
    ) -> Result<u32, HostError> {
        if !self.can_stream {
            return Err(HostError(HostError::UNIMPLEMENTED));
        }
        let token = 1000 + self.streams.len() as u32;
        let metadata = metadata.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        self.streams.push((token, cluster.to_string(), format!("/{service}/{method}"), metadata));
        Ok(token)
    }

    fn send_stream(&mut self, stream: u32, message: &[u8]) -> Result<(), HostError> {
        if self.refuse_stream_sends {
            return Err(HostError(2));
        }
        self.sent.push((stream, message.to_vec()));
        Ok(())
    }

    fn cancel_stream(&mut self, stream: u32) {
        self.cancelled.push(stream);
    }

    fn wake(&mut self) -> Result<(), HostError> {
        if !self.can_wake {
            return Err(HostError(HostError::UNIMPLEMENTED));
        }
        self.wakes += 1;
        Ok(())
    }

    fn log(&mut self, level: Level, message: &str) {
        self.logs.push((level, message.to_string()));
    }

    fn record(&mut self, event: Event) {
        self.events.push(event);
    }
}

impl FakeHost {
    fn new() -> FakeHost {
        FakeHost { now_ns: 1_700_000_000_000 * MS, ..Default::default() }
    }

    fn request_header(&self, name: &str) -> Option<String> {
        self.header(Map::RequestHeaders, name)
    }

    /// The endpoint chosen: the first of the destination header's list.
    fn chosen(&self) -> Option<String> {
        self.request_header("x-gateway-destination-endpoint")
            .map(|d| d.split(',').next().unwrap_or_default().to_string())
    }

    fn has(&self, event: Event) -> bool {
        self.events.contains(&event)
    }

    /// The answer Envoy hands the filter for its last call.
    fn answer(&mut self, status: u16, body: &[u8]) -> u32 {
        self.headers.insert((Map::CalloutHeaders, ":status".into()), status.to_string());
        self.buffers.insert(Buffer::CalloutBody, body.to_vec());
        self.calls.last().map_or(0, |c| c.token)
    }

    /// A fresh stream: clears the previous one's headers and bodies.
    fn new_stream(&mut self, headers: &[(&str, &str)], body: &str) {
        self.headers.clear();
        self.buffers.clear();
        self.upstream = None;
        for (n, v) in [(":method", "POST"), (":path", "/v1/completions")].iter().chain(headers) {
            self.headers.insert((Map::RequestHeaders, n.to_string()), v.to_string());
        }
        self.buffers.insert(Buffer::RequestBody, body.as_bytes().to_vec());
    }
}

fn vm(config: &str) -> Vm {
    match FilterConfig::parse(config.as_bytes()) {
        Ok(c) => Vm::new(c, 7),
        Err(e) => panic!("test config: {e}"),
    }
}

const BODY: &str = r#"{"model":"m","prompt":"tell me a story about a gateway","max_tokens":16,"stream":true}"#;
const SLO: [(&str, &str); 2] = [("x-slo-ttft-ms", "500"), ("x-prediction-based-scheduling", "true")];

fn busy() -> EndpointState {
    EndpointState {
        running: 8,
        waiting: 2,
        kv_usage: 0.6,
        in_flight: 3,
        metrics_age_ms: Some(50),
        ..Default::default()
    }
}

fn predictions(endpoints: &[(&str, Option<f64>)]) -> Vec<u8> {
    predictions_after(endpoints, None)
}

/// An answer with flow control's part (`flow`).
fn predictions_after(endpoints: &[(&str, Option<f64>)], flow: Option<FlowAnswer>) -> Vec<u8> {
    let answer = PredictResponse {
        flow,
        pool: "default".into(),
        model_version: "test".into(),
        endpoints: endpoints
            .iter()
            .map(|(address, ttft)| EndpointPrediction {
                address: address.to_string(),
                ttft_ms: *ttft,
                tpot_ms: Some(10.0),
                state: busy(),
            })
            .collect(),
    };
    codec::encode(Format::MsgPack, &answer).unwrap_or_default()
}

/// Headers and body through the flow: the step after the body (a callout paused it).
fn send_request(flow: &mut Flow, host: &mut FakeHost, vm: &mut Vm, headers: &[(&str, &str)], body: &str) -> Step {
    host.new_stream(headers, body);
    let step = flow.on_request_headers(host, vm, false);
    if step != Step::Pause {
        return step;
    }
    assert_eq!(flow.on_request_body(host, vm, body.len() / 2, false), Step::Pause);
    flow.on_request_body(host, vm, body.len(), true)
}

/// A whole routed request: headers, body, the predictor's answer. Returns the step
/// after the answer.
fn routed(flow: &mut Flow, host: &mut FakeHost, vm: &mut Vm, status: u16, answer: &[u8]) -> Step {
    assert_eq!(send_request(flow, host, vm, &SLO, BODY), Step::Pause, "the callout holds the request");
    let token = host.answer(status, answer);
    flow.on_callout_answer(host, vm, token, answer.len())
}

/// A streamed 200 passing by at `ttft_ms`, then the stream's end.
fn stream_response(flow: &mut Flow, host: &mut FakeHost, vm: &mut Vm, ttft_ms: u64) {
    stream_until(flow, host, vm, ttft_ms, true);
}

/// Three tokens of a streamed 200 from `ttft_ms`, then `[DONE]` only when `complete`, then the log.
fn stream_until(flow: &mut Flow, host: &mut FakeHost, vm: &mut Vm, ttft_ms: u64, complete: bool) {
    host.headers.insert((Map::ResponseHeaders, ":status".into()), "200".into());
    host.headers.insert((Map::ResponseHeaders, "content-type".into()), "text/event-stream".into());
    assert_eq!(flow.on_response_headers(host, vm), Step::Continue);
    for (i, text) in ["a", "b", "c"].iter().enumerate() {
        host.now_ns += if i == 0 { ttft_ms * MS } else { 10 * MS };
        let chunk = format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{text}\"}}]}}\n\n");
        host.buffers.insert(Buffer::ResponseBody, chunk.clone().into_bytes());
        flow.on_response_body(host, vm, chunk.len());
    }
    if complete {
        let done = b"data: [DONE]\n\n".to_vec();
        host.buffers.insert(Buffer::ResponseBody, done.clone());
        flow.on_response_body(host, vm, done.len());
    }
    flow.on_log(host, vm);
}

/// Flushes and answers every batch call with `status`, until nothing is left to send.
fn deliver_all(host: &mut FakeHost, vm: &mut Vm, status: u16) {
    let mut answered = host.calls.len();
    vm.flush(host);
    while answered < host.calls.len() {
        let call = host.calls[answered].clone();
        answered += 1;
        host.headers.insert((Map::CalloutHeaders, ":status".into()), status.to_string());
        vm.on_batch_answer(host, call.token);
    }
}

fn batches<T: serde::de::DeserializeOwned>(host: &FakeHost, path: &str) -> Vec<T> {
    host.calls
        .iter()
        .filter(|c| c.header(":path") == Some(path))
        .filter_map(|c| codec::decode(Format::MsgPack, &c.body).ok())
        .collect()
}

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
    assert_eq!((terms.max_wait_ms, terms.tpot_buffer, terms.fairness_id.as_str()), (3000, 1.5, "team-a"));
    assert_eq!(terms.ttft_buffer, 0.85, "the predictor judges headroom with the filter's buffers");
    assert_eq!(terms.dispatch_horizon_ms, 90);
    assert_eq!(host.calls[0].timeout, Duration::from_millis(3050));

    // Without SLO routing there is no headroom to wait for: answered at once, as before.
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &[SLO[0]], BODY), Step::Pause);
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
        asked.flow.map(|f| f.fairness_id).unwrap_or_default()
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
        asked.flow.map(|f| f.fairness_id).unwrap_or_default()
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
    let plain = [("x-slo-ttft-ms", "500")];
    assert_eq!(send_request(&mut Flow::new(), &mut host, &mut vm, &plain, BODY), Step::Pause);
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
