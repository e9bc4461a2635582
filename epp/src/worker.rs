//! A worker: one `filter/core` VM and the ext_proc streams given to it, on one thread, as
//! one Envoy worker runs one Wasm VM. Envoy's messages, the predictor's answers and the
//! VM's tick and wake-ups arrive in one queue and are handled in order; the decisions are
//! the flow's and the VM's, carried out here as ext_proc answers.
//!
//! How a flow's step becomes an answer: Envoy waits for an answer to each message (in
//! `BUFFERED` and `STREAMED` body modes), so a message whose step is `Pause` (the callout
//! under way) keeps its answer owed until the flow resumes or replies. The one pause that
//! is not for the callout is on the request headers when the body is still to be read
//! (`read_body`): Envoy sends the body only once the headers are answered, so they are
//! answered at once, and the destination goes with the body's answer, whose header changes
//! Envoy applies in `BUFFERED` mode. In `FULL_DUPLEX_STREAMED` mode the body comes without
//! that answer: the headers' answer is held until the decision, then the body is handed
//! back whole.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_filter_core::coalesce::Delivery;
use headroom_filter_core::flow::{Flow, Step};
use headroom_filter_core::vm::Vm;
use headroom_filter_core::FilterConfig;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};

use crate::calls::Calls;
use crate::host::{set, EppHost, Io};
use crate::inbox::{Answer, Input};
use crate::proto::processing_request::Request;
use crate::proto::processing_response::Response;
use crate::proto::{
    body_mutation, BodyMutation, BodyResponse, BodySendMode, CommonResponse, HeaderMutation, HeadersResponse,
    HttpStatus, ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse, Struct,
    TrailersResponse, Value,
};
use crate::stats::Stats;

/// The dynamic metadata namespace Envoy's `override_host` reads the pick from (GIE's protocol).
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The attribute that names the upstream that served a request (`response_attributes`).
pub const UPSTREAM_ADDRESS: &str = "upstream.address";
/// The metadata namespace and key of the endpoints the gateway allows a request (GIE's
/// subset hint), which Envoy forwards when told to (`metadata_options`).
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";

/// The message of a stream whose answer is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    RequestHeaders,
    RequestBody,
    /// `FULL_DUPLEX_STREAMED`: the headers' answer, then the whole body handed back (and
    /// the trailers', when they ended it).
    HeadersAndBody,
    /// The request's trailers, which ended its body.
    Trailers,
}

/// One ext_proc stream: one HTTP request.
struct Stream {
    flow: Flow,
    io: Io,
    out: UnboundedSender<ProcessingResponse>,
    owed: Option<Owed>,
    /// The flow's `on_log` ran.
    logged: bool,
    /// Full duplex: trailers ended the held body, and their answer follows the body's.
    trailers_owed: bool,
}

pub struct Worker {
    index: usize,
    vm: Vm,
    /// The VM's seed; a restart after a panic adds one.
    seed: u64,
    streams: HashMap<u32, Stream>,
    calls: Calls,
    stats: Arc<Stats>,
    origin: Instant,
}

/// Starts worker `index` on a thread of its own; feed it through the returned sender.
pub fn spawn(
    index: usize,
    config: FilterConfig,
    clusters: Arc<HashMap<String, String>>,
    stats: Arc<Stats>,
    seed: u64,
) -> std::io::Result<UnboundedSender<Input>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let inbox = tx.clone();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name(format!("epp-worker-{index}")).spawn(move || {
        runtime.block_on(async move {
            // The predictor speaks HTTP/1.1 and h2c; the pool keeps connections warm.
            let client = reqwest::Client::builder().pool_idle_timeout(Duration::from_secs(90)).build();
            let client = match client {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("headroom-epp: worker {index} has no HTTP client: {e}");
                    return;
                }
            };
            let tick = Duration::from_millis(config.flush_interval_ms);
            let worker = Worker {
                index,
                vm: Vm::new(config, seed),
                seed,
                streams: HashMap::new(),
                calls: Calls::new(clusters, client, inbox),
                stats,
                origin: Instant::now(),
            };
            worker.run(rx, tick).await;
        });
    })?;
    Ok(tx)
}

impl Worker {
    async fn run(mut self, mut rx: UnboundedReceiver<Input>, tick: Duration) {
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                input = rx.recv() => match input {
                    Some(input) => self.guarded(|w| w.handle(input)),
                    None => break,
                },
                _ = ticks.tick() => self.guarded(Worker::tick),
            }
        }
    }

    /// Runs one step of the worker; a panic in it (a bug: the core is fuzzed not to) costs
    /// this worker's streams and VM, not the worker: each open stream ends (its gRPC stream
    /// closes, and Envoy applies `failure_mode_allow` to it as to a picker that is down), the
    /// VM starts afresh, and `headroom_epp_worker_restarts` counts it. Without this the
    /// thread would die and every stream it was given later would find no one to answer.
    fn guarded(&mut self, step: impl FnOnce(&mut Worker)) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(self))).is_ok() {
            return;
        }
        tracing::error!(worker = self.index, streams = self.streams.len(),
            "headroom-epp: a worker step panicked (a bug: please report it with this log); its streams end and its VM restarts");
        for _ in self.streams.drain() {
            self.stats.stream(false);
        }
        self.seed = self.seed.wrapping_add(1);
        self.vm = Vm::new((*self.vm.config).clone(), self.seed);
        self.stats.worker_restarted();
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Open { stream, out } => {
                let io = Io::new(&self.vm.config.destination_header);
                let flow = Flow::for_context(stream);
                let s = Stream { flow, io, out, owed: None, logged: false, trailers_owed: false };
                self.streams.insert(stream, s);
                self.stats.stream(true);
            }
            Input::Message { stream, message } => self.message(stream, *message),
            Input::Closed { stream } => {
                if let Some(mut s) = self.streams.remove(&stream) {
                    self.stats.stream(false);
                    if !s.logged {
                        let mut host = host(self.origin, Some(&mut s.io), None, &mut self.calls, &self.stats, stream);
                        s.flow.on_log(&mut host, &mut self.vm);
                    }
                }
            }
            Input::Answer { token, answer } => self.answer(token, &answer),
            Input::Wake => {
                self.calls.woke();
                let mut host = host(self.origin, None, None, &mut self.calls, &self.stats, 0);
                let deliveries = self.vm.on_wake(&mut host);
                self.deliver(deliveries);
            }
        }
    }

    fn tick(&mut self) {
        let mut host = host(self.origin, None, None, &mut self.calls, &self.stats, 0);
        let deliveries = self.vm.on_tick(&mut host);
        self.deliver(deliveries);
    }

    /// One of Envoy's messages on stream `id`.
    fn message(&mut self, id: u32, message: ProcessingRequest) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        // Envoy sends its protocol configuration with a stream's first message only.
        if let Some(p) = &message.protocol_config {
            s.io.request_body_mode = BodySendMode::try_from(p.request_body_mode).unwrap_or(BodySendMode::Buffered);
            s.io.response_body_mode = BodySendMode::try_from(p.response_body_mode).unwrap_or(BodySendMode::Streamed);
        }
        let upstream = message.attributes.values().find_map(|attrs| attrs.fields.get(UPSTREAM_ADDRESS));
        if let Some(address) = upstream.and_then(Value::as_str) {
            s.io.upstream = Some(address.to_string());
        }
        let hint = message.metadata_context.as_ref().and_then(|m| m.filter_metadata.get(SUBSET_NAMESPACE));
        if let Some(subset) = hint.and_then(|h| h.fields.get(SUBSET_KEY)).and_then(Value::strings) {
            s.io.subset = Some(subset);
        }
        let Some(request) = message.request else { return };
        let duplex = s.io.request_body_mode == BodySendMode::FullDuplexStreamed;
        let read_body = self.vm.config.read_body;
        let mut host = host(self.origin, Some(&mut s.io), None, &mut self.calls, &self.stats, id);
        match request {
            Request::RequestHeaders(h) => {
                let end = h.end_of_stream;
                if let Some(io) = host.io.as_mut() {
                    io.request_headers = pairs(h.headers);
                }
                let step = s.flow.on_request_headers(&mut host, &mut self.vm, end);
                match step {
                    // Paused for the body: answered now (Envoy sends the body only then),
                    // unless the body comes regardless (full duplex).
                    Step::Pause if read_body && !end && !duplex => s.answer(Owed::RequestHeaders),
                    Step::Pause if read_body && !end => s.owed = Some(Owed::HeadersAndBody),
                    Step::Pause => s.owed = Some(Owed::RequestHeaders),
                    step => {
                        s.owed = Some(Owed::RequestHeaders);
                        s.carry_out(step);
                    }
                }
            }
            Request::RequestBody(b) => {
                let end = b.end_of_stream;
                let chunk_len = b.body.len();
                // A body whose headers were answered passes as it comes (full duplex: handed
                // back chunk by chunk), after the flow has counted it.
                let passing = duplex && s.owed != Some(Owed::HeadersAndBody);
                // A body held for the decision grows no further than the cap: the flow
                // answers 413 on the size it would have reached.
                let held = host.io.as_ref().map_or(0, |io| io.body.len());
                let over = read_body && !passing && held.saturating_add(chunk_len) > self.vm.config.max_body_bytes;
                if let Some(io) = host.io.as_mut().filter(|_| !over) {
                    io.body.extend_from_slice(&b.body);
                }
                if duplex && !passing && !end && !over {
                    return; // held whole until the decision
                }
                // What the held body is, or would be past the cap.
                let size = if read_body { held.saturating_add(chunk_len) } else { chunk_len };
                let step = s.flow.on_request_body(&mut host, &mut self.vm, size, end);
                if !read_body && !duplex {
                    s.io.body.clear(); // counted, and passed on by Envoy: nothing to keep
                }
                if passing {
                    let body = std::mem::take(&mut s.io.body);
                    s.send(Response::RequestBody(streamed(body, end)), None);
                    return;
                }
                if s.owed != Some(Owed::HeadersAndBody) {
                    s.owed = Some(Owed::RequestBody);
                }
                match step {
                    // More of a streamed body to come: this chunk is answered, Envoy sends the next.
                    Step::Pause if !end && !duplex => s.answer(Owed::RequestBody),
                    Step::Pause => {}
                    step => s.carry_out(step),
                }
            }
            // Trailers end the body (a body followed by trailers has no end-of-stream of its own).
            Request::RequestTrailers(_) => {
                let holding = s.owed == Some(Owed::HeadersAndBody);
                let size = if read_body { host.io.as_ref().map_or(0, |io| io.body.len()) } else { 0 };
                let step = s.flow.on_request_body(&mut host, &mut self.vm, size, true);
                if holding {
                    s.trailers_owed = true;
                    s.carry_out(step);
                } else {
                    s.owed = Some(Owed::Trailers);
                    match step {
                        Step::Pause => {}
                        step => s.carry_out(step),
                    }
                }
            }
            Request::ResponseTrailers(_) => {
                s.send(Response::ResponseTrailers(TrailersResponse::default()), None);
            }
            Request::ResponseHeaders(h) => {
                let end = h.end_of_stream;
                if let Some(io) = host.io.as_mut() {
                    io.response_headers = pairs(h.headers);
                }
                let _ = s.flow.on_response_headers(&mut host, &self.vm);
                let mutation = s.io.response_mutations.take();
                let common = CommonResponse { header_mutation: mutation, ..Default::default() };
                s.send(Response::ResponseHeaders(HeadersResponse { response: Some(common) }), None);
                if end {
                    s.log(self.origin, &mut self.calls, &self.stats, &mut self.vm, id);
                }
            }
            Request::ResponseBody(b) => {
                let end = b.end_of_stream;
                let size = b.body.len();
                if let Some(io) = host.io.as_mut() {
                    io.chunk = b.body;
                }
                let _ = s.flow.on_response_body(&mut host, &mut self.vm, size);
                let response = if s.io.response_body_mode == BodySendMode::FullDuplexStreamed {
                    streamed(std::mem::take(&mut s.io.chunk), end)
                } else {
                    BodyResponse { response: Some(CommonResponse::default()) }
                };
                s.send(Response::ResponseBody(response), None);
                if end {
                    s.log(self.origin, &mut self.calls, &self.stats, &mut self.vm, id);
                }
            }
        }
    }

    /// The answer to call `token`, to the context that made it.
    fn answer(&mut self, token: u32, answer: &Answer) {
        match self.calls.owner(token) {
            None => {}
            Some(0) => {
                let mut host = host(self.origin, None, Some(answer), &mut self.calls, &self.stats, 0);
                match self.vm.on_predictions_answer(&mut host, token, answer.body.len()) {
                    Some(deliveries) => self.deliver(deliveries),
                    None => self.vm.on_batch_answer(&mut host, token),
                }
            }
            Some(id) => {
                let Some(s) = self.streams.get_mut(&id) else { return };
                let mut host = host(self.origin, Some(&mut s.io), Some(answer), &mut self.calls, &self.stats, id);
                let step = s.flow.on_callout_answer(&mut host, &mut self.vm, token, answer.body.len());
                s.carry_out(step);
            }
        }
    }

    /// Hands each request its share of a coalesced predict call.
    fn deliver(&mut self, deliveries: Vec<Delivery>) {
        for Delivery { context, answer } in deliveries {
            let Some(s) = self.streams.get_mut(&context) else { continue };
            let mut host = host(self.origin, Some(&mut s.io), None, &mut self.calls, &self.stats, context);
            let step = s.flow.on_coalesced_answer(&mut host, &mut self.vm, answer);
            s.carry_out(step);
        }
    }
}

fn host<'a>(
    origin: Instant,
    io: Option<&'a mut Io>,
    answer: Option<&'a Answer>,
    calls: &'a mut Calls,
    stats: &'a Stats,
    context: u32,
) -> EppHost<'a> {
    EppHost { origin, io, answer, calls, stats, context }
}

impl Stream {
    /// Carries out a step of the flow on the message whose answer is owed.
    fn carry_out(&mut self, step: Step) {
        match step {
            Step::Pause => {}
            Step::Continue | Step::Resume => {
                if let Some(owed) = self.owed {
                    self.answer(owed);
                }
            }
            Step::Reply { status, headers, body } => {
                let set_headers = headers.iter().map(|(name, value)| set(name, value)).collect();
                let reply = ImmediateResponse {
                    status: Some(HttpStatus { code: i32::try_from(status).unwrap_or(500) }),
                    headers: Some(HeaderMutation { set_headers, remove_headers: Vec::new() }),
                    body,
                    details: format!("headroom_{status}"),
                };
                self.owed = None;
                self.send(Response::ImmediateResponse(reply), None);
            }
        }
    }

    /// Answers the owed message `owed` with the header changes so far, and the destination
    /// in `envoy.lb` once the flow has chosen one.
    fn answer(&mut self, owed: Owed) {
        self.owed = None;
        let mutation = self.io.request_mutations.take();
        let metadata = self.metadata(mutation.as_ref());
        let common = CommonResponse { header_mutation: mutation, ..Default::default() };
        match owed {
            Owed::RequestHeaders => {
                self.send(Response::RequestHeaders(HeadersResponse { response: Some(common) }), metadata)
            }
            Owed::RequestBody => self.send(Response::RequestBody(BodyResponse { response: Some(common) }), metadata),
            Owed::HeadersAndBody => {
                self.send(Response::RequestHeaders(HeadersResponse { response: Some(common) }), metadata);
                let body = std::mem::take(&mut self.io.body);
                self.send(Response::RequestBody(streamed(body, !self.trailers_owed)), None);
                if self.trailers_owed {
                    self.send(Response::RequestTrailers(TrailersResponse::default()), None);
                }
            }
            // Header changes are too late here; the pick goes in the metadata alone.
            Owed::Trailers => self.send(Response::RequestTrailers(TrailersResponse::default()), metadata),
        }
    }

    /// `envoy.lb` with the pick, when `mutation` sets the destination header: GIE's
    /// protocol names the endpoint and its fallbacks there (under
    /// `x-gateway-destination-endpoint`, whatever the header is called), as the header does.
    /// The flow sets it once and each answer takes the changes since the last, so the
    /// metadata goes once too.
    fn metadata(&self, mutation: Option<&HeaderMutation>) -> Option<Struct> {
        let header = self.io.destination_header.as_str();
        let value = mutation?.set_headers.iter().filter_map(|o| o.header.as_ref()).find(|h| h.key == header)?;
        let key = headroom_protocol::headers::DESTINATION.to_string();
        let lb = Struct { fields: [(key, Value::string(value.text()))].into() };
        let kind = crate::proto::value::Kind::StructValue(lb);
        Some(Struct { fields: [(LB_NAMESPACE.to_string(), Value { kind: Some(kind) })].into() })
    }

    fn send(&self, response: Response, dynamic_metadata: Option<Struct>) {
        // The stream is gone only when Envoy left: nothing waits for the answer.
        let _ = self.out.send(ProcessingResponse { response: Some(response), dynamic_metadata });
    }

    /// The request is over: what was measured goes to the outbox.
    fn log(&mut self, origin: Instant, calls: &mut Calls, stats: &Stats, vm: &mut Vm, id: u32) {
        if !self.logged {
            self.logged = true;
            let mut host = host(origin, Some(&mut self.io), None, calls, stats, id);
            self.flow.on_log(&mut host, vm);
        }
    }
}

fn streamed(body: Vec<u8>, end_of_stream: bool) -> BodyResponse {
    let mutation = body_mutation::Mutation::StreamedResponse(StreamedBodyResponse { body, end_of_stream });
    let common =
        CommonResponse { body_mutation: Some(BodyMutation { mutation: Some(mutation) }), ..Default::default() };
    BodyResponse { response: Some(common) }
}

/// A header map from Envoy as the flow reads it (names lower-case, values as text).
fn pairs(map: Option<crate::proto::HeaderMap>) -> Vec<(String, String)> {
    map.map(|m| m.headers.into_iter().map(|h| (h.key.to_ascii_lowercase(), h.text())).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{processing_request, HeaderMap, HeaderValue, HttpBody, HttpHeaders, ProtocolConfiguration};

    fn worker(config: &[u8], stats: Arc<Stats>) -> Worker {
        let (inbox, _rx) = mpsc::unbounded_channel();
        let calls = Calls::new(Arc::new(HashMap::new()), reqwest::Client::new(), inbox);
        let config = FilterConfig::parse(config).unwrap_or_else(|e| panic!("{e}"));
        Worker {
            index: 0,
            vm: Vm::new(config, 7),
            seed: 7,
            streams: HashMap::new(),
            calls,
            stats,
            origin: Instant::now(),
        }
    }

    fn body(chunk: usize, end: bool) -> Input {
        let request =
            processing_request::Request::RequestBody(HttpBody { body: vec![b'x'; chunk], end_of_stream: end });
        Input::Message {
            stream: 1,
            message: Box::new(ProcessingRequest { request: Some(request), ..Default::default() }),
        }
    }

    /// A client's body held for the decision (full duplex: Envoy streams it without waiting)
    /// stops growing at `max_body_bytes` and is answered 413 naming `body`, never buffered
    /// whole: 300 MB used to go into the picker's memory.
    #[test]
    fn a_body_over_the_cap_is_a_413_and_is_not_buffered() {
        let mut w = worker(br#"{"pool": "p", "max_body_bytes": 4096}"#, Arc::new(Stats::default()));
        let (out, mut answers) = mpsc::unbounded_channel();
        w.handle(Input::Open { stream: 1, out });
        let header = |k: &str, v: &str| HeaderValue { key: k.into(), value: v.into(), raw_value: Vec::new() };
        let headers = HeaderMap {
            headers: vec![
                header(":method", "POST"),
                header(":path", "/v1/completions"),
                header("x-slo-ttft-ms", "500"),
            ],
        };
        let request =
            processing_request::Request::RequestHeaders(HttpHeaders { headers: Some(headers), end_of_stream: false });
        let duplex = ProtocolConfiguration {
            request_body_mode: BodySendMode::FullDuplexStreamed as i32,
            response_body_mode: BodySendMode::Streamed as i32,
            ..Default::default()
        };
        let first = ProcessingRequest { request: Some(request), protocol_config: Some(duplex), ..Default::default() };
        w.handle(Input::Message { stream: 1, message: Box::new(first) });
        w.handle(body(3000, false));
        assert!(answers.try_recv().is_err(), "held, under the cap");
        for _ in 0..100 {
            w.handle(body(3000, false));
        }
        let held = w.streams.get(&1).map_or(0, |s| s.io.body.len());
        assert!(held <= 4096, "the picker holds {held} bytes");
        let Ok(ProcessingResponse { response: Some(Response::ImmediateResponse(reply)), .. }) = answers.try_recv()
        else {
            panic!("a local reply");
        };
        assert_eq!(reply.status.map(|s| s.code), Some(413));
        assert!(String::from_utf8_lossy(&reply.body).contains("\"body\""), "{:?}", reply.body);
    }

    #[test]
    fn a_panicking_step_ends_the_workers_streams_and_restarts_its_vm_not_the_worker() {
        let stats = Arc::new(Stats::default());
        let mut worker = worker(br#"{"pool": "p"}"#, stats.clone());
        let (out, mut answers) = mpsc::unbounded_channel();
        worker.guarded(|w| w.handle(Input::Open { stream: 1, out }));
        assert_eq!(worker.streams.len(), 1);
        let restarts = |stats: &Stats| stats.render().lines().any(|l| l == "headroom_epp_worker_restarts 1");

        worker.guarded(|_| panic!("a bug"));
        assert!(worker.streams.is_empty(), "the stream ended");
        assert!(matches!(answers.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)), "its gRPC stream closes");
        assert!(restarts(&stats), "{}", stats.render());
        assert!(stats.render().lines().any(|l| l == "headroom_epp_open_streams 0"));
        assert_eq!((worker.seed, worker.vm.config.pool.as_str()), (8, "p"), "a fresh VM, same configuration");

        // And it goes on: a new stream is served.
        let (out, _answers) = mpsc::unbounded_channel();
        worker.guarded(|w| w.handle(Input::Open { stream: 2, out }));
        worker.guarded(Worker::tick);
        assert_eq!(worker.streams.len(), 1);
    }
}
