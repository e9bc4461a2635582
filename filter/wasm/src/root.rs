//! The root context: configuration, the flush tick, and per-VM shared state.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::rc::Rc;
use std::time::Duration;

use headroom_filter_core::{fallback::StateCache, queue::BoundedQueue, rng::Rng, FilterConfig};
use headroom_protocol::{codec, paths, Dispatch, DispatchBatch, Format, Observation, ReportBatch};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, MapType};

use crate::host::{self, Level};
use crate::request::Request;
use crate::stats::Stats;

/// State shared by the root and every request context of one VM (one worker thread).
pub struct Vm {
    pub config: Rc<FilterConfig>,
    pub stats: Stats,
    pub rng: Rng,
    /// Last endpoint states from the predictor, for the fallback.
    pub states: StateCache,
    pub dispatches: BoundedQueue<Dispatch>,
    pub observations: BoundedQueue<Observation>,
    /// Counter for request ids when the client sent no `x-request-id`.
    pub next_request: u64,
}

pub type SharedVm = Rc<RefCell<Vm>>;

/// A batch on its way to the predictor, kept to requeue if the call fails.
enum InFlightBatch {
    Dispatches(Vec<Dispatch>),
    Observations(Vec<Observation>),
}

#[derive(Default)]
pub struct Root {
    vm: Option<SharedVm>,
    sending: HashMap<u32, InFlightBatch>,
}

/// Timeout of a dispatch or report batch call.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

impl Root {
    fn flush(&mut self) {
        let Some(vm) = self.vm.clone() else { return };
        let mut vm = vm.borrow_mut();
        let sending_dispatches = self.sending.values().any(|b| matches!(b, InFlightBatch::Dispatches(_)));
        let sending_reports = self.sending.values().any(|b| matches!(b, InFlightBatch::Observations(_)));
        let max = vm.config.max_batch;
        // Dispatches before reports: the predictor starts tracking before it stops.
        if !sending_dispatches && !vm.dispatches.is_empty() {
            let batch = vm.dispatches.take(max);
            let body = DispatchBatch { dispatches: batch };
            match self.send(&vm.config, paths::DISPATCH, &body) {
                Some(token) => {
                    self.sending.insert(token, InFlightBatch::Dispatches(body.dispatches));
                }
                None => vm.dispatches.requeue(body.dispatches),
            }
        }
        if !sending_reports && !vm.observations.is_empty() {
            let batch = vm.observations.take(max);
            let body = ReportBatch { observations: batch };
            match self.send(&vm.config, paths::REPORT, &body) {
                Some(token) => {
                    self.sending.insert(token, InFlightBatch::Observations(body.observations));
                }
                None => vm.observations.requeue(body.observations),
            }
        }
        let dropped = vm.dispatches.take_dropped() + vm.observations.take_dropped();
        if dropped > 0 {
            vm.stats.reports(0, dropped);
        }
    }

    fn send<T: serde::Serialize>(&self, config: &FilterConfig, path: &str, body: &T) -> Option<u32> {
        let bytes = codec::encode(Format::MsgPack, body).ok()?;
        let headers = [
            (":method", "POST"),
            (":path", path),
            (":authority", config.predictor_authority.as_str()),
            ("content-type", codec::MSGPACK),
        ];
        host::http_call(&config.predictor_cluster, &headers, &bytes, FLUSH_TIMEOUT).ok()
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token_id: u32, _: usize, _: usize, _: usize) {
        let Some(batch) = self.sending.remove(&token_id) else { return };
        let Some(vm) = self.vm.clone() else { return };
        let mut vm = vm.borrow_mut();
        let ok = host::header(MapType::HttpCallResponseHeaders, ":status").is_some_and(|s| s.starts_with('2'));
        match (ok, batch) {
            (true, InFlightBatch::Observations(sent)) => vm.stats.reports(sent.len() as u64, 0),
            (true, InFlightBatch::Dispatches(_)) => {}
            (false, InFlightBatch::Dispatches(batch)) => {
                vm.stats.flush_failed();
                vm.dispatches.requeue(batch);
            }
            (false, InFlightBatch::Observations(batch)) => {
                vm.stats.flush_failed();
                vm.observations.requeue(batch);
            }
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = host::buffer(BufferType::PluginConfiguration, usize::MAX).ok().flatten().unwrap_or_default();
        let config = match FilterConfig::parse(&bytes) {
            Ok(c) => Rc::new(c),
            Err(e) => {
                host::log(Level::Error, &format!("headroom: {e}"));
                return false;
            }
        };
        if host::set_tick_period(Duration::from_millis(config.flush_interval_ms)).is_err() {
            host::log(Level::Error, "headroom: could not set the flush tick");
            return false;
        }
        match &self.vm {
            Some(vm) => vm.borrow_mut().config = config,
            None => {
                let seed = RandomState::new().hash_one(host::now_ns());
                self.vm = Some(Rc::new(RefCell::new(Vm {
                    stats: Stats::define(),
                    rng: Rng::new(seed),
                    states: StateCache::default(),
                    dispatches: BoundedQueue::new(config.max_queued),
                    observations: BoundedQueue::new(config.max_queued),
                    next_request: 0,
                    config,
                })));
            }
        }
        host::log(Level::Info, "headroom: configured");
        true
    }

    fn on_tick(&mut self) {
        self.flush();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let vm = self.vm.clone()?;
        Some(Box::new(Request::new(vm, context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
