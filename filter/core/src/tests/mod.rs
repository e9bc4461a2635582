//! The filter's flow end to end without Envoy: `Flow` and `Vm` driven through a
//! fake `Host`, callback by callback, the way Envoy drives them. Each test is one
//! path the e2e suite also takes through the real Envoy. This file is the fake host and
//! the steps the tests share; the tests are grouped by what they exercise, one file each.

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

mod coalescing;
mod fallback;
mod flow_control;
mod health;
mod input;
mod phases;
mod routing;
mod tokens;
