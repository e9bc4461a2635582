//! The root context: configuration, the flush tick, and per-VM shared state.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::rc::Rc;
use std::time::Duration;

use headroom_filter_core::{fallback::StateCache, queue::BoundedQueue, rng::Rng, shards::Shards, FilterConfig};
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
    /// The predictor replica that owns this pool, with failover.
    pub shards: Shards,
}

impl Vm {
    /// The predictor cluster to call now.
    pub fn predictor_cluster(&self) -> String {
        self.shards.current(host::now_ms()).to_string()
    }

    /// Records how a call to `cluster` went: no answer, a timeout or a 5xx count
    /// against the replica; any other answer shows it alive.
    pub fn record_call(&mut self, cluster: &str, status: Option<u16>) {
        let alive = status.is_some_and(|s| s != 0 && s < 500);
        if self.shards.record(cluster, alive, host::now_ms()) {
            self.stats.predictor_ejected();
            host::log(Level::Warn, &format!("headroom: predictor cluster {cluster} failing; using the next replica"));
        }
    }
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
    /// Batch calls under way: token -> (cluster called, batch).
    sending: HashMap<u32, (String, InFlightBatch)>,
}

/// Timeout of a dispatch or report batch call.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

impl Root {
    fn flush(&mut self) {
        let Some(vm) = self.vm.clone() else { return };
        let mut vm = vm.borrow_mut();
        let sending_dispatches = self.sending.values().any(|(_, b)| matches!(b, InFlightBatch::Dispatches(_)));
        let sending_reports = self.sending.values().any(|(_, b)| matches!(b, InFlightBatch::Observations(_)));
        let max = vm.config.max_batch;
        let cluster = vm.predictor_cluster();
        // Dispatches before reports: the predictor starts tracking before it stops.
        if !sending_dispatches && !vm.dispatches.is_empty() {
            let batch = vm.dispatches.take(max);
            let body = DispatchBatch { dispatches: batch };
            match self.send(&vm.config, &cluster, paths::DISPATCH, &body) {
                Some(token) => {
                    self.sending.insert(token, (cluster.clone(), InFlightBatch::Dispatches(body.dispatches)));
                }
                None => {
                    vm.record_call(&cluster, None);
                    vm.dispatches.requeue(body.dispatches)
                }
            }
        }
        if !sending_reports && !vm.observations.is_empty() {
            let batch = vm.observations.take(max);
            let body = ReportBatch { observations: batch };
            match self.send(&vm.config, &cluster, paths::REPORT, &body) {
                Some(token) => {
                    self.sending.insert(token, (cluster, InFlightBatch::Observations(body.observations)));
                }
                None => {
                    vm.record_call(&cluster, None);
                    vm.observations.requeue(body.observations)
                }
            }
        }
        let dropped = vm.dispatches.take_dropped() + vm.observations.take_dropped();
        if dropped > 0 {
            vm.stats.reports(0, dropped);
        }
    }

    fn send<T: serde::Serialize>(&self, config: &FilterConfig, cluster: &str, path: &str, body: &T) -> Option<u32> {
        let bytes = codec::encode(Format::MsgPack, body).ok()?;
        let headers = [
            (":method", "POST"),
            (":path", path),
            (":authority", config.predictor_authority.as_str()),
            ("content-type", codec::MSGPACK),
        ];
        host::http_call(cluster, &headers, &bytes, FLUSH_TIMEOUT).ok()
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token_id: u32, _: usize, _: usize, _: usize) {
        let Some((cluster, batch)) = self.sending.remove(&token_id) else { return };
        let Some(vm) = self.vm.clone() else { return };
        let mut vm = vm.borrow_mut();
        let status = host::header(MapType::HttpCallResponseHeaders, ":status").and_then(|s| s.parse::<u16>().ok());
        vm.record_call(&cluster, status);
        match (status.unwrap_or(0), batch) {
            (200..=299, InFlightBatch::Observations(sent)) => vm.stats.reports(sent.len() as u64, 0),
            (200..=299, InFlightBatch::Dispatches(_)) => {}
            // Refused as invalid: sending it again cannot succeed, and it would hold back
            // everything queued behind it. Dropped and counted.
            (400..=499, InFlightBatch::Dispatches(batch)) => vm.stats.refused(batch.len() as u64),
            (400..=499, InFlightBatch::Observations(batch)) => vm.stats.refused(batch.len() as u64),
            // No answer, a timeout or a 5xx: sent again on a later tick.
            (_, InFlightBatch::Dispatches(batch)) => {
                vm.stats.flush_failed();
                vm.dispatches.requeue(batch);
            }
            (_, InFlightBatch::Observations(batch)) => {
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
        let shards = Shards::new(config.predictor_clusters(), &config.pool);
        match &self.vm {
            Some(vm) => {
                let mut vm = vm.borrow_mut();
                vm.config = config;
                vm.shards = shards;
            }
            None => {
                let seed = RandomState::new().hash_one(host::now_ns());
                self.vm = Some(Rc::new(RefCell::new(Vm {
                    stats: Stats::define(),
                    rng: Rng::new(seed),
                    states: StateCache::default(),
                    dispatches: BoundedQueue::new(config.max_queued),
                    observations: BoundedQueue::new(config.max_queued),
                    next_request: 0,
                    shards,
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
