//! Headroom in the simulated world: the filter's VMs with the hosts they call through, and
//! the predictor on the world's clock. Each handler is the service's own for its path
//! (`predictor_core::service`, `admission`); [`super::world::World`] carries what they return
//! as events after the modelled delays.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use headroom_filter_core::vm::Vm;
use headroom_filter_core::FilterConfig;
use headroom_predictor_core::admission::{self, Admission, Ticket};
use headroom_predictor_core::callers::Caller;
use headroom_predictor_core::clock::{Clock, ManualClock};
use headroom_predictor_core::config::Config;
use headroom_predictor_core::flow::queue::Reply;
use headroom_predictor_core::pool::EngineMetrics;
use headroom_predictor_core::predictor::Predictor;
use headroom_predictor_core::service::{self, Scraped};
use headroom_protocol::{
    codec, paths, DispatchBatch, Format, PredictBatch, PredictBatchResponse, PredictRequest, PredictResponse,
    ReportBatch,
};
use serde::Serialize;

use super::envoy::{Call, SimEnvoy};
use super::servers::Server;

/// The pool every fleet serves (the stack's).
const POOL: &str = "default";

/// A waiting request's answer, from the predictor's flow task, to the call it came on.
type Sink = Arc<Mutex<Vec<((usize, u32), PredictResponse)>>>;

#[derive(Debug)]
struct SimReply {
    call: (usize, u32),
    sink: Sink,
}

impl Reply for SimReply {
    fn send(self: Box<Self>, answer: PredictResponse) {
        if let Ok(mut sink) = self.sink.lock() {
            sink.push((self.call, answer));
        }
    }

    fn is_closed(&self) -> bool {
        false // a call Envoy gave up on drops its ticket, which leaves the queue
    }
}

/// A call of the filter's on its way or at the predictor.
pub struct CallState {
    pub call: Call,
    /// Its place in the flow queue, while it waits there.
    _ticket: Option<Ticket>,
}

/// What became of a call at the predictor.
pub enum Served {
    /// Answered now: status and body.
    Answer(u16, Vec<u8>),
    /// Waiting in the flow queue; the flow task answers it.
    Waiting,
    /// No such call (Envoy gave up on it).
    Unknown,
}

/// The filter, its VMs' hosts, and the predictor.
pub struct Headroom {
    pub vms: Vec<Vm>,
    pub hosts: Vec<SimEnvoy>,
    pub predictor: Arc<Predictor>,
    clock: Arc<ManualClock>,
    clock_ns: u64,
    pub calls: HashMap<(usize, u32), CallState>,
    sink: Sink,
    woken: Arc<AtomicBool>,
    flow_pending: bool,
    context_known: Vec<bool>,
}

impl Headroom {
    /// `workers` VMs of `filter` (each its own seed off `seed`) and a predictor of
    /// `predictor` whose holdout is keyed by `seed`, for a fleet of `servers`.
    pub fn new(
        filter: &FilterConfig,
        predictor: Config,
        workers: usize,
        seed: u64,
        servers: usize,
    ) -> anyhow::Result<Headroom> {
        let clock = Arc::new(ManualClock::new());
        let runtime = Arc::new(headroom_predictor_core::model::native::Native);
        let predictor = Arc::new(Predictor::new(predictor, runtime, clock.clone())?);
        predictor.models.key_holdout(seed);
        let woken = Arc::new(AtomicBool::new(false));
        let flag = woken.clone();
        predictor.flows.on_wake(move || flag.store(true, Ordering::SeqCst));
        Ok(Headroom {
            vms: (0..workers).map(|w| Vm::new(filter.clone(), seed ^ (w as u64 + 1))).collect(),
            hosts: (0..workers).map(|_| SimEnvoy::default()).collect(),
            predictor,
            clock,
            clock_ns: 0,
            calls: HashMap::new(),
            sink: Arc::new(Mutex::new(Vec::new())),
            woken,
            flow_pending: false,
            context_known: vec![false; servers],
        })
    }

    /// Moves the predictor's clock to the world's `now`.
    pub fn sync_clock(&mut self, now: u64) {
        if now > self.clock_ns {
            self.clock.advance(Duration::from_nanos(now - self.clock_ns));
            self.clock_ns = now;
        }
    }

    /// The calls VM `vm`'s filter started, filed until answered: `(token, timeout)` of each.
    pub fn take_calls(&mut self, vm: usize) -> Vec<(u32, Duration)> {
        let calls = std::mem::take(&mut self.hosts[vm].calls);
        let mut sent = Vec::with_capacity(calls.len());
        for call in calls {
            sent.push((call.token, call.timeout));
            self.calls.insert((vm, call.token), CallState { call, _ticket: None });
        }
        sent
    }

    /// A call of VM `vm`'s filter reaches the predictor at `now`: the service's handler for
    /// its path.
    pub fn serve_call(&mut self, vm: usize, token: u32, now: u64) -> Served {
        self.sync_clock(now);
        let Some(state) = self.calls.get(&(vm, token)) else { return Served::Unknown };
        let now = self.clock.now();
        let core = &self.predictor;
        let body = &state.call.body;
        let answer: Result<Option<Vec<u8>>, u16> = match state.call.path.as_str() {
            paths::PREDICT => match decode::<PredictRequest>(body) {
                Some(req) if req.check().is_ok() => match service::predict(core, req.clone(), now) {
                    Some(answer) => {
                        let reply = Box::new(SimReply { call: (vm, token), sink: self.sink.clone() });
                        match admission::admit(core, req, answer, now, reply) {
                            Admission::Now(answer) => Ok(encode(&answer)),
                            Admission::Wait(ticket) => {
                                if let Some(state) = self.calls.get_mut(&(vm, token)) {
                                    state._ticket = Some(ticket);
                                }
                                Ok(None)
                            }
                        }
                    }
                    None => Err(404),
                },
                _ => Err(400),
            },
            paths::PREDICT_BATCH => match decode::<PredictBatch>(body) {
                Some(mut batch) if batch.check().is_ok() => {
                    if !batch.dispatches.is_empty() {
                        let dispatches = DispatchBatch { dispatches: std::mem::take(&mut batch.dispatches) };
                        service::dispatch(core, &dispatches, &Caller::anonymous(), now);
                    }
                    if let Some(reports) = batch.reports.take() {
                        service::report(core, reports, &Caller::anonymous(), now);
                    }
                    match service::predict_batch(core, batch.requests, now) {
                        Ok(answers) => Ok(encode(&PredictBatchResponse { answers })),
                        Err(_) => Err(404),
                    }
                }
                _ => Err(400),
            },
            paths::DISPATCH => match decode::<DispatchBatch>(body) {
                Some(batch) if batch.check().is_ok() => {
                    Ok(encode(&service::dispatch(core, &batch, &Caller::anonymous(), now)))
                }
                _ => Err(400),
            },
            paths::REPORT => match decode::<ReportBatch>(body) {
                Some(batch) if batch.check().is_ok() => {
                    Ok(encode(&service::report(core, batch, &Caller::anonymous(), now)))
                }
                _ => Err(400),
            },
            _ => Err(404),
        };
        match answer {
            Ok(Some(body)) => Served::Answer(200, body),
            Ok(None) => Served::Waiting,
            Err(status) => Served::Answer(status, Vec::new()),
        }
    }

    /// Whether the flow task was woken (a report, a first token, a scrape) with no round
    /// already due: the world then runs one after its delay.
    pub fn take_wake(&mut self) -> bool {
        let due = self.woken.swap(false, Ordering::SeqCst) && !self.flow_pending;
        self.flow_pending |= due;
        due
    }

    /// One round of the flow task at `now` over every busy pool: the answers of the requests
    /// it released or expired, each to its call.
    pub fn flow_round(&mut self, now: u64) -> Vec<((usize, u32), Vec<u8>)> {
        self.flow_pending = false;
        self.sync_clock(now);
        for pool in self.predictor.flows.busy_pools() {
            admission::serve_pool(&self.predictor, &pool, self.clock.now());
        }
        let answered = self.sink.lock().map(|mut s| std::mem::take(&mut *s)).unwrap_or_default();
        answered.into_iter().filter_map(|(call, answer)| Some((call, encode(&answer)?))).collect()
    }

    /// A scrape round's metrics reach the predictor at `now`; a server's context length is
    /// read on its first (as the scraper reads `/v1/models` once).
    pub fn scraped(&mut self, metrics: Vec<EngineMetrics>, servers: &[Server], now: u64) {
        self.sync_clock(now);
        let now = self.clock.now();
        for (i, m) in metrics.into_iter().enumerate() {
            let address = &servers[i].address;
            service::scraped(&self.predictor, POOL, address, Scraped::Metrics(m), now);
            if !self.context_known[i] {
                self.context_known[i] = true;
                let tokens = servers[i].profile.max_model_len;
                self.predictor.pools.with(POOL, |p| {
                    if let Some(e) = p.endpoints.iter_mut().find(|e| e.address == *address) {
                        e.max_context_tokens = Some(tokens);
                    }
                });
            }
        }
    }

    /// The trainer's round at `now`.
    pub fn train(&mut self, now: u64) {
        self.sync_clock(now);
        let outcome = self.predictor.models.train_if_due();
        self.predictor.metrics.trained(&outcome);
    }

    /// The expiry's round at `now`.
    pub fn expire(&mut self, now: u64) {
        self.sync_clock(now);
        service::expire(&self.predictor, self.clock.now());
    }
}

fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
    codec::decode(Format::MsgPack, body).ok()
}

fn encode<T: Serialize>(value: &T) -> Option<Vec<u8>> {
    codec::encode(Format::MsgPack, value).ok()
}
