//! One router's fleet in simulated time: clients, the gateway, the predictor and the
//! servers as events on one clock, with no sockets and no wall clock.
//!
//! Every decision is the product's own code: the filter's flow and VM (`filter/core`,
//! driven callback by callback as Envoy drives them, through [`SimEnvoy`]), the
//! predictor's service, flow control and training (`predictor-core`, on a manual clock
//! moved with the world, models run by its plain-Rust runtime; [`super::headroom`]), the
//! simulator's engine ([`super::servers`]). What Envoy and the network add is modelled as the delays of
//! [`DELAYS`], and plain Envoy's balancers (round robin, least request) as what they do.
//! Time runs as the real benchmark's wall time: engines at the workload's time scale, the
//! filter's and predictor's intervals as configured, so a measurement here is the real
//! bench's measurement with the host's CPU taken out.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::Duration;

use headroom_filter_core::coalesce::Delivery;
use headroom_filter_core::flow::{Flow, Step};
use headroom_filter_core::vm::Vm;
use headroom_filter_core::FilterConfig;
use headroom_loadgen::runner::{self, Outcome};
use headroom_loadgen::workload::RequestSpec;
use headroom_predictor_core::config::Config;
use headroom_predictor_core::pool::EngineMetrics;
use headroom_protocol::headers;
use headroom_protocol::meter::ResponseMeter;
use headroom_protocol::openai::{parse_inference_body, Api, InferenceBody};
use headroom_sim::profile::Profile;

use super::envoy::{Call, SimEnvoy, Stream};
use super::headroom::{Headroom, Served};
use super::servers::{ReplyText, Server};

/// What the network and Envoy add, in the benchmark's wall time (ns). Measured on the real
/// stack (`make bench-gateway`, docs/performance.md): SLO routing adds about 0.37 ms at the
/// median over plain Envoy, most of it the predictor callout's round trip; a hop through
/// Envoy on loopback about 0.1 ms.
#[derive(Debug, Clone, Copy)]
pub struct Delays {
    /// Client to Envoy, and Envoy to client.
    pub client_ns: u64,
    /// Envoy to a model server, and back.
    pub upstream_ns: u64,
    /// Envoy to the predictor (its handler included), and back.
    pub predictor_ns: u64,
    /// A scrape's round trip: the predictor files the metrics a server showed this long ago.
    pub scrape_ns: u64,
    /// From a wake-up of the predictor's flow task to its round over the queues.
    pub flow_wake_ns: u64,
}

pub const DELAYS: Delays = Delays {
    client_ns: 100_000,
    upstream_ns: 100_000,
    predictor_ns: 150_000,
    scrape_ns: 1_000_000,
    flow_wake_ns: 50_000,
};

/// The filter's monotonic clock reads the world's time plus this (any origin will do; not 0).
const HOST_CLOCK_ORIGIN_NS: u64 = 1_000_000_000_000;

/// How plain Envoy balances (the baselines without the filter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balancer {
    RoundRobin,
    /// Power of two choices on active requests (Envoy's `LEAST_REQUEST` with equal weights).
    LeastRequest,
    /// A consistent hash of the session header (Envoy's `RING_HASH` on `x-session-id`): a
    /// session's requests go to one server; one without the header to a random server.
    /// (Envoy's ring places hashes differently; what matters here is that each session
    /// keeps its server and sessions spread evenly.)
    SessionHash,
}

/// What the world is built from.
pub struct Setup {
    pub profiles: Vec<String>,
    pub time_scale: f64,
    pub model: String,
    /// The client's timeout (wall seconds).
    pub timeout_s: f64,
    /// The clients' headers and hints (`runner::request_headers`).
    pub target: runner::Target,
    pub gateway: Gateway,
    /// Seeds the balancers' random picks and the VMs' (deterministic for a seed).
    pub seed: u64,
}

/// What sits between the clients and the servers.
pub enum Gateway {
    Envoy(Balancer),
    /// Envoy with the headroom filter (`workers` VMs), and the predictor.
    Headroom {
        filter: Box<FilterConfig>,
        predictor: Box<Config>,
        workers: usize,
    },
}

enum Ev {
    Send,
    AtGateway(u64),
    AtServer(u64),
    Submit(u64),
    StepDone(usize),
    Tokens { id: u64, first: bool, last: Option<(u32, u32)> },
    ClientTimeout(u64),
    CallIn { vm: usize, token: u32 },
    CallAnswer { vm: usize, token: u32, status: u16, body: Vec<u8> },
    CallTimeout { vm: usize, token: u32 },
    Wake(usize),
    Tick(usize),
    Scrape,
    Scraped(Vec<EngineMetrics>),
    FlowServe,
    FlowRecheck,
    Train,
    Expire,
}

struct Timed {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// One request of the current measurement.
struct Req {
    spec: RequestSpec,
    measured: bool,
    sent_ns: u64,
    vm: usize,
    body: String,
    parsed: Option<InferenceBody>,
    flow: Option<Flow>,
    stream: Stream,
    server: Option<usize>,
    outcome: Outcome,
    meter: Option<ResponseMeter>,
}

/// The world of one router's fleet; it runs on from one measurement to the next, as a stack does.
pub struct World {
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Timed>>,
    servers: Vec<Server>,
    by_address: HashMap<String, usize>,
    active: Vec<u32>,
    round_robin: usize,
    rng: headroom_protocol::rng::Rng,
    balancer: Option<Balancer>,
    headroom: Option<Headroom>,
    reqs: BTreeMap<u64, Req>,
    next_id: u64,
    setup_scale: f64,
    timeout_ns: u64,
    target: runner::Target,
    model: String,
    sending: Sending,
    measured_left: usize,
    done: Vec<Outcome>,
}

/// The traffic of the current measurement: its requests (wall time from `start`), the next
/// to send, and how many of the first are measured.
#[derive(Default)]
struct Sending {
    work: Vec<RequestSpec>,
    next: usize,
    start: u64,
    measured: usize,
}

/// The addresses the simulated servers go by (no socket is opened on them).
pub fn address(i: usize) -> String {
    format!("127.0.0.1:{}", 18_000 + i)
}

impl World {
    pub fn new(setup: Setup) -> anyhow::Result<World> {
        let mut servers = Vec::new();
        for (i, name) in setup.profiles.iter().enumerate() {
            let profile = Profile::by_name(name).ok_or_else(|| anyhow::anyhow!("unknown server profile {name:?}"))?;
            servers.push(Server::new(address(i), profile));
        }
        let by_address = servers.iter().enumerate().map(|(i, s)| (s.address.clone(), i)).collect();
        let mut world = World {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            active: vec![0; servers.len()],
            servers,
            by_address,
            round_robin: 0,
            rng: headroom_protocol::rng::Rng::new(setup.seed),
            balancer: None,
            headroom: None,
            reqs: BTreeMap::new(),
            next_id: 0,
            setup_scale: setup.time_scale,
            timeout_ns: (setup.timeout_s * 1e9) as u64,
            target: setup.target,
            model: setup.model,
            sending: Sending::default(),
            measured_left: 0,
            done: Vec::new(),
        };
        match setup.gateway {
            Gateway::Envoy(b) => world.balancer = Some(b),
            Gateway::Headroom { filter, predictor, workers } => {
                let flush = Duration::from_millis(filter.flush_interval_ms);
                let (recheck, retrain) = (predictor.flow.recheck_interval_ms, predictor.model.retrain_interval_ms);
                let workers = workers.max(1);
                world.headroom = Some(Headroom::new(&filter, *predictor, workers, setup.seed, world.servers.len())?);
                // The periodic work: each VM's flush tick (the workers' ticks apart), the
                // scraper, the flow task's recheck, the trainer, the expiry.
                for w in 0..workers {
                    let offset = flush.as_nanos() as u64 * w as u64 / workers as u64;
                    world.at(offset + 1, Ev::Tick(w));
                }
                world.at(0, Ev::Scrape);
                world.at(ms(recheck), Ev::FlowRecheck);
                world.at(ms(retrain), Ev::Train);
                world.at(ms(1000), Ev::Expire);
            }
        }
        Ok(world)
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Timed { at, seq: self.seq, ev }));
    }

    fn after(&mut self, delay_ns: u64, ev: Ev) {
        self.at(self.now + delay_ns, ev);
    }

    /// Sends `work` (wall time from now, open loop) and runs until its first `measured`
    /// requests have ended; the rest only hold the load meanwhile and are then dropped, as
    /// `runner::run_with_trailing` does. The measured requests' outcomes, in order.
    pub fn run(&mut self, work: &[RequestSpec], measured: usize) -> anyhow::Result<Vec<Outcome>> {
        self.sending = Sending { work: work.to_vec(), next: 0, start: self.now, measured };
        self.measured_left = measured.min(work.len());
        if let Some(first) = work.first() {
            self.at(self.now + (first.at_s * 1e9) as u64, Ev::Send);
        }
        while self.measured_left > 0 {
            let Some(Reverse(Timed { at, ev, .. })) = self.queue.pop() else {
                anyhow::bail!("the simulated fleet went idle with {} measured requests open", self.measured_left);
            };
            self.now = self.now.max(at);
            self.handle(ev);
        }
        // The trailing traffic stops, and the clients of what it sent leave.
        self.sending.work.clear();
        let open: Vec<u64> = self.reqs.keys().copied().collect();
        for id in open {
            self.abort(id);
        }
        let mut out = std::mem::take(&mut self.done);
        out.sort_by_key(|o| o.index);
        Ok(out)
    }

    /// The client sends the next request of the traffic (its body made now: most of a
    /// step's trailing traffic is never sent), and the one after is due at its time.
    fn send(&mut self) {
        let Sending { work, next, start, measured } = &mut self.sending;
        let index = *next;
        let Some(spec) = work.get(index).cloned() else { return };
        *next += 1;
        let (start, measured) = (*start, index < *measured);
        if let Some(after) = work.get(index + 1) {
            let at = start + (after.at_s * 1e9) as u64;
            self.at(at, Ev::Send);
        }
        let id = self.next_id;
        self.next_id += 1;
        let req = Req {
            body: runner::request_body(&self.target, index, &spec),
            outcome: Outcome::sent(index, &spec),
            spec,
            measured,
            sent_ns: self.now,
            vm: (id % self.vm_count() as u64) as usize,
            parsed: None,
            flow: None,
            stream: Stream::default(),
            server: None,
            meter: None,
        };
        self.reqs.insert(id, req);
        self.after(DELAYS.client_ns, Ev::AtGateway(id));
        self.after(self.timeout_ns, Ev::ClientTimeout(id));
    }

    fn vm_count(&self) -> usize {
        self.headroom.as_ref().map_or(1, |h| h.vms.len())
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Send => self.send(),
            Ev::AtGateway(id) => self.at_gateway(id),
            Ev::AtServer(id) => self.at_server(id),
            Ev::Submit(id) => self.submit(id),
            Ev::StepDone(s) => self.step_done(s),
            Ev::Tokens { id, first, last } => self.tokens(id, first, last),
            Ev::ClientTimeout(id) => {
                if let Some(req) = self.reqs.get_mut(&id) {
                    req.outcome.error = Some("timeout".into());
                    req.outcome.e2e_ms = (self.now - req.sent_ns) as f64 / 1e6;
                    self.abort(id);
                }
            }
            Ev::CallIn { vm, token } => self.serve_call(vm, token),
            Ev::CallAnswer { vm, token, status, body } => {
                if let Some(call) = self.headroom.as_mut().and_then(|h| h.calls.remove(&(vm, token))) {
                    self.answer_call(vm, call.call, status, body);
                }
            }
            Ev::CallTimeout { vm, token } => {
                // Envoy answers the filter 504 and resets the call: a waiting request's
                // handler goes, and its ticket takes it out of the queue.
                if let Some(call) = self.headroom.as_mut().and_then(|h| h.calls.remove(&(vm, token))) {
                    self.answer_call(vm, call.call, 504, Vec::new());
                }
            }
            Ev::Wake(vm) => self.root(vm, |vm, host| vm.on_wake(host)),
            Ev::Tick(vm) => {
                self.root(vm, |vm, host| vm.on_tick(host));
                if let Some(h) = &self.headroom {
                    let every = ms(h.vms[vm].config.flush_interval_ms);
                    self.after(every, Ev::Tick(vm));
                }
            }
            Ev::Scrape => {
                let metrics = self.servers.iter().map(Server::metrics).collect();
                self.after(DELAYS.scrape_ns, Ev::Scraped(metrics));
                if let Some(h) = &self.headroom {
                    let every = ms(h.predictor.config.scrape_interval_ms);
                    self.after(every, Ev::Scrape);
                }
            }
            Ev::Scraped(metrics) => self.scraped(metrics),
            Ev::FlowServe => self.flow_round(),
            Ev::FlowRecheck => {
                self.flow_round();
                if let Some(h) = &self.headroom {
                    let every = ms(h.predictor.config.flow.recheck_interval_ms);
                    self.after(every, Ev::FlowRecheck);
                }
            }
            Ev::Train => {
                let Some(h) = self.headroom.as_mut() else { return };
                h.train(self.now);
                let every = ms(h.predictor.config.model.retrain_interval_ms);
                self.after(every, Ev::Train);
            }
            Ev::Expire => {
                let Some(h) = self.headroom.as_mut() else { return };
                h.expire(self.now);
                self.after(ms(1000), Ev::Expire);
            }
        }
    }

    /// The request reaches Envoy: plain Envoy balances it; the filter reads its headers and
    /// body (one chunk: the clients send small bodies whole) and starts its callout.
    fn at_gateway(&mut self, id: u64) {
        if self.headroom.is_none() {
            let session = self.reqs.get(&id).and_then(|r| r.spec.conversation.map(|c| c.session_id(r.spec.run)));
            let server = self.balance(session.as_deref());
            self.forward(id, server);
            return;
        }
        let Some(req) = self.reqs.get_mut(&id) else { return };
        let sent_headers = runner::request_headers(&self.target, &req.spec);
        let mut request_headers: Vec<(String, String)> = vec![
            (":method".into(), "POST".into()),
            (":path".into(), "/v1/completions".into()),
            (":authority".into(), "gateway".into()),
            ("content-type".into(), "application/json".into()),
            ("content-length".into(), req.body.len().to_string()),
        ];
        request_headers.extend(sent_headers.into_iter().map(|(n, v)| (n.to_string(), v)));
        req.stream.request_headers = request_headers;
        req.stream.request_body = req.body.clone().into_bytes();
        req.flow = Some(Flow::for_context(context_of(id)));
        let len = req.body.len();
        let step = self.on_flow(id, |flow, host, vm| flow.on_request_headers(host, vm, false));
        match step {
            Some(Step::Pause) => {
                let step = self.on_flow(id, |flow, host, vm| flow.on_request_body(host, vm, len, true));
                self.carry_out(id, step, true);
            }
            other => self.carry_out(id, other, true),
        }
    }

    /// Runs one of request `id`'s flow callbacks on its VM, then takes what the filter asked
    /// of the host (its calls, a wake-up).
    fn on_flow(&mut self, id: u64, f: impl FnOnce(&mut Flow, &mut SimEnvoy, &mut Vm) -> Step) -> Option<Step> {
        let h = self.headroom.as_mut()?;
        let req = self.reqs.get_mut(&id)?;
        let flow = req.flow.as_mut()?;
        let host = &mut h.hosts[req.vm];
        host.now_ns = self.now + HOST_CLOCK_ORIGIN_NS;
        host.context = Some(context_of(id));
        std::mem::swap(&mut host.stream, &mut req.stream);
        let step = f(flow, host, &mut h.vms[req.vm]);
        std::mem::swap(&mut host.stream, &mut req.stream);
        host.context = None;
        let vm = req.vm;
        self.take_host_work(vm);
        Some(step)
    }

    /// Request `id`'s `on_log`: the stream is done.
    fn log(&mut self, id: u64) {
        let _ = self.on_flow(id, |flow, host, vm| {
            flow.on_log(host, vm);
            Step::Continue
        });
    }

    /// A root callback of VM `vm` (a tick, a wake-up, an answer to the root's call), then
    /// each request's share of a coalesced answer handed to it.
    fn root(&mut self, vm: usize, f: impl FnOnce(&mut Vm, &mut SimEnvoy) -> Vec<Delivery>) {
        let Some(h) = self.headroom.as_mut() else { return };
        let host = &mut h.hosts[vm];
        host.now_ns = self.now + HOST_CLOCK_ORIGIN_NS;
        host.context = None;
        let deliveries = f(&mut h.vms[vm], host);
        self.take_host_work(vm);
        for Delivery { context, answer } in deliveries {
            let id = u64::from(context);
            let step = self.on_flow(id, |flow, host, vm| flow.on_coalesced_answer(host, vm, answer));
            self.carry_out(id, step, true);
        }
    }

    /// The calls VM `vm`'s filter started go to the predictor (and time out at their
    /// timeout); a wake-up it asked for comes at once.
    fn take_host_work(&mut self, vm: usize) {
        let Some(h) = self.headroom.as_mut() else { return };
        let sent = h.take_calls(vm);
        let woken = std::mem::take(&mut h.hosts[vm].woken);
        for (token, timeout) in sent {
            self.after(DELAYS.predictor_ns, Ev::CallIn { vm, token });
            self.after(timeout.as_nanos() as u64, Ev::CallTimeout { vm, token });
        }
        if woken {
            self.after(0, Ev::Wake(vm));
        }
    }

    /// Carries out a flow's step: in the request's phase, a resume (or a continue) sends it
    /// on to the endpoint the filter chose; a local reply ends it.
    fn carry_out(&mut self, id: u64, step: Option<Step>, request_phase: bool) {
        match step {
            Some(Step::Resume | Step::Continue) if request_phase => {
                let Some(req) = self.reqs.get(&id) else { return };
                let chosen = req
                    .stream
                    .request_headers
                    .iter()
                    .find(|(n, _)| n == headers::DESTINATION)
                    .and_then(|(_, v)| v.split(',').next())
                    .and_then(|a| self.by_address.get(a.trim()).copied());
                // No destination: Envoy's fallback policy (round robin) places it.
                let server = chosen.unwrap_or_else(|| self.next_round_robin());
                self.forward(id, server);
            }
            Some(Step::Reply { status, headers, .. }) => {
                let Some(req) = self.reqs.get_mut(&id) else { return };
                req.outcome.status = status as u16;
                req.outcome.e2e_ms = (self.now + DELAYS.client_ns - req.sent_ns) as f64 / 1e6;
                let header = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
                req.outcome.read_debug_headers(header);
                self.log(id);
                self.finish(id);
            }
            _ => {}
        }
    }

    fn next_round_robin(&mut self) -> usize {
        self.round_robin = (self.round_robin + 1) % self.servers.len();
        self.round_robin
    }

    /// Plain Envoy's pick for a request of `session` (its `x-session-id`).
    fn balance(&mut self, session: Option<&str>) -> usize {
        match self.balancer {
            Some(Balancer::SessionHash) => {
                let n = self.servers.len().max(1) as u64;
                let hash = session.map_or_else(|| self.rng.next_u64(), |s| fnv1a(s.as_bytes()));
                (hash % n) as usize
            }
            Some(Balancer::LeastRequest) if self.servers.len() > 1 => {
                let n = self.servers.len() as u64;
                let a = (self.rng.next_u64() % n) as usize;
                let b = (self.rng.next_u64() % n) as usize;
                if self.active[b] < self.active[a] {
                    b
                } else {
                    a
                }
            }
            _ => self.next_round_robin(),
        }
    }

    fn forward(&mut self, id: u64, server: usize) {
        let Some(req) = self.reqs.get_mut(&id) else { return };
        req.server = Some(server);
        req.stream.upstream = Some(self.servers[server].address.clone());
        self.active[server] += 1;
        self.after(DELAYS.upstream_ns, Ev::AtServer(id));
    }

    /// The server's front: parses the body, refuses what exceeds its context, waits its API
    /// overhead, then hands the request to the engine.
    fn at_server(&mut self, id: u64) {
        let Some(req) = self.reqs.get_mut(&id) else { return };
        let Some(s) = req.server else { return };
        let server = &self.servers[s];
        match parse_inference_body(req.body.as_bytes(), Api::Completions) {
            Ok(body) if server.fits(&body) => {
                let overhead = (server.profile.api_overhead_ms * 1e6 / self.setup_scale) as u64;
                req.parsed = Some(body);
                self.after(overhead, Ev::Submit(id));
            }
            _ => {
                // The front's 400: the response passes the gateway back to the client.
                self.active[s] = self.active[s].saturating_sub(1);
                self.respond_without_tokens(id, 400);
            }
        }
    }

    fn submit(&mut self, id: u64) {
        let Some(req) = self.reqs.get_mut(&id) else { return };
        let (Some(s), Some(body)) = (req.server, req.parsed.as_ref()) else { return };
        if let Some(end) = self.servers[s].submit(id, body, self.now, self.setup_scale) {
            self.at(end, Ev::StepDone(s));
        }
    }

    fn step_done(&mut self, s: usize) {
        let (tokens, next) = self.servers[s].step_done(self.now, self.setup_scale);
        if let Some(end) = next {
            self.at(end, Ev::StepDone(s));
        }
        for t in tokens {
            let (first, last) = (t.index == 1, t.last.then_some((t.index, t.cached_tokens)));
            if first || last.is_some() {
                self.after(DELAYS.upstream_ns, Ev::Tokens { id: t.id, first, last });
            }
        }
    }

    /// A response's first and/or last token passes the gateway (the filter meters it) on
    /// its way to the client (who meters it too, as the load generator does).
    fn tokens(&mut self, id: u64, first: bool, last: Option<(u32, u32)>) {
        let Some(req) = self.reqs.get_mut(&id) else { return };
        let stream = req.spec.stream;
        let prompt_tokens = req.parsed.as_ref().map_or(0, |b| b.approximate_prompt_tokens());
        let model = self.model.clone();
        let reply = ReplyText { id, model: &model, prompt_tokens };
        if first && stream {
            self.response_headers(id, 200, true);
            self.body_chunk(id, reply.first_chunk().into_bytes());
        }
        let Some((n, cached)) = last else { return };
        let body = if stream {
            reply.last_chunks(n, cached)
        } else {
            self.response_headers(id, 200, false);
            reply.whole(n, cached)
        };
        self.body_chunk(id, body.into_bytes());
        if let Some(s) = self.reqs.get(&id).and_then(|r| r.server) {
            self.active[s] = self.active[s].saturating_sub(1);
        }
        self.log(id);
        self.finish(id);
    }

    /// The response's headers pass the gateway (the filter adds its debug headers, which the
    /// client reads).
    fn response_headers(&mut self, id: u64, status: u16, streaming: bool) {
        let Some(req) = self.reqs.get_mut(&id) else { return };
        let content_type = if streaming { "text/event-stream" } else { "application/json" };
        let served_by = req.stream.upstream.clone().unwrap_or_default();
        req.stream.response_headers = vec![
            (":status".into(), status.to_string()),
            ("content-type".into(), content_type.into()),
            (headers::SERVED_BY.into(), served_by.clone()),
        ];
        req.outcome.status = status;
        req.outcome.served_by = Some(served_by);
        req.meter = Some(ResponseMeter::new(streaming, 0, 4 << 20));
        let _ = self.on_flow(id, |flow, host, vm| flow.on_response_headers(host, vm));
        let Some(req) = self.reqs.get_mut(&id) else { return };
        let seen = &req.stream.response_headers;
        req.outcome.read_debug_headers(|name| seen.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()));
    }

    fn body_chunk(&mut self, id: u64, chunk: Vec<u8>) {
        let len = chunk.len();
        let Some(req) = self.reqs.get_mut(&id) else { return };
        let at_client = self.now + DELAYS.client_ns - req.sent_ns;
        if let Some(meter) = req.meter.as_mut() {
            meter.on_chunk(&chunk, at_client);
        }
        req.stream.response_body = chunk;
        let _ = self.on_flow(id, |flow, host, vm| flow.on_response_body(host, vm, len));
    }

    /// A response with no tokens (the server's 400): headers and an error body.
    fn respond_without_tokens(&mut self, id: u64, status: u16) {
        self.response_headers(id, status, false);
        self.body_chunk(id, br#"{"error":{"message":"context exceeded"}}"#.to_vec());
        self.log(id);
        self.finish(id);
    }

    /// The client has the whole response: its outcome is kept when measured.
    fn finish(&mut self, id: u64) {
        let Some(mut req) = self.reqs.remove(&id) else { return };
        let at_client = self.now + DELAYS.client_ns - req.sent_ns;
        if let Some(meter) = req.meter.take() {
            let m = meter.finish(at_client);
            req.outcome.e2e_ms = m.e2e_ms;
            req.outcome.ttft_ms = m.ttft_ms;
            req.outcome.tpot_ms = m.tpot_ms;
            req.outcome.output_tokens = m.output_tokens;
        }
        if req.measured {
            self.done.push(req.outcome);
            self.measured_left = self.measured_left.saturating_sub(1);
        }
    }

    /// The client goes away (the step is over, or its timeout passed): the server drops
    /// the request and the filter logs it, as Envoy does for a reset stream.
    fn abort(&mut self, id: u64) {
        let Some(req) = self.reqs.get(&id) else { return };
        if let Some(s) = req.server {
            self.servers[s].abort(id);
            self.active[s] = self.active[s].saturating_sub(1);
        }
        if req.flow.is_some() {
            self.log(id);
        }
        let Some(req) = self.reqs.remove(&id) else { return };
        if req.measured {
            self.done.push(req.outcome);
            self.measured_left = self.measured_left.saturating_sub(1);
        }
    }

    /// A call of VM `vm`'s filter reaches the predictor; its answer, if it has one now,
    /// comes back after the predictor's delay.
    fn serve_call(&mut self, vm: usize, token: u32) {
        let Some(h) = self.headroom.as_mut() else { return };
        match h.serve_call(vm, token, self.now) {
            Served::Unknown => return,
            Served::Waiting => {}
            Served::Answer(status, body) => self.after(DELAYS.predictor_ns, Ev::CallAnswer { vm, token, status, body }),
        }
        self.flow_woken();
    }

    /// The predictor's flow task was woken (a report, a first token, a scrape): its round
    /// comes after [`Delays::flow_wake_ns`].
    fn flow_woken(&mut self) {
        if self.headroom.as_mut().is_some_and(|h| h.take_wake()) {
            self.after(DELAYS.flow_wake_ns, Ev::FlowServe);
        }
    }

    /// One round of the flow task over every busy pool; the requests it released or expired
    /// get their answers.
    fn flow_round(&mut self) {
        let Some(h) = self.headroom.as_mut() else { return };
        for ((vm, token), body) in h.flow_round(self.now) {
            self.after(DELAYS.predictor_ns, Ev::CallAnswer { vm, token, status: 200, body });
        }
        self.flow_woken();
    }

    /// A scrape round's metrics reach the predictor.
    fn scraped(&mut self, metrics: Vec<EngineMetrics>) {
        let Some(h) = self.headroom.as_mut() else { return };
        h.scraped(metrics, &self.servers, self.now);
        self.flow_woken();
    }

    /// The answer to a call (or Envoy's 504 for one that timed out) reaches the filter: the
    /// request context that made it, or the root.
    fn answer_call(&mut self, vm: usize, call: Call, status: u16, body: Vec<u8>) {
        let Some(h) = self.headroom.as_mut() else { return };
        let len = body.len();
        h.hosts[vm].callout_status = Some(status);
        h.hosts[vm].callout_body = body;
        let token = call.token;
        match call.context {
            Some(context) => {
                let id = u64::from(context);
                let step = self.on_flow(id, |flow, host, vm| flow.on_callout_answer(host, vm, token, len));
                self.carry_out(id, step, true);
            }
            None => self.root(vm, |vm, host| match vm.on_predictions_answer(host, token, len) {
                Some(deliveries) => deliveries,
                None => {
                    vm.on_batch_answer(host, token);
                    Vec::new()
                }
            }),
        }
    }

    /// The fallbacks the filter took, by cause, over the world's life (none when plain Envoy).
    pub fn fallbacks(&self) -> u64 {
        self.headroom.as_ref().map_or(0, |h| h.hosts.iter().flat_map(|e| e.fallbacks).sum())
    }
}

/// The host context id of request `id` (requests of one world stay far below 2^32).
fn context_of(id: u64) -> u32 {
    id as u32
}

fn ms(ms: u64) -> u64 {
    ms * 1_000_000
}

/// FNV-1a of `bytes`: the sticky-session balancer's hash (any well-spread hash will do).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
