//! The root context: configuration, the flush tick, and per-VM shared state.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::rc::Rc;
use std::time::Duration;

use headroom_filter_core::outbox::{Batch, Outbox, Outcome};
use headroom_filter_core::{fallback::StateCache, rng::Rng, shards::Shards, FilterConfig};
use headroom_protocol::{codec, paths};
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
    /// Dispatches and observations waiting for the tick.
    pub outbox: Outbox,
    /// Random per VM: with `next_request`, makes the ids the filter tracks requests by.
    pub vm_nonce: u64,
    pub next_request: u64,
    /// The predictor replica that owns this pool, with failover.
    pub shards: Shards,
    /// `Bearer <predictor_token>`, when one is configured.
    pub authorization: Option<String>,
}

impl Vm {
    /// A request id unique per VM and request, never taken from the client: reused or
    /// forged `x-request-id`s cannot collide in the predictor's tracking or pick a
    /// request's holdout side.
    pub fn new_request_id(&mut self) -> String {
        self.next_request += 1;
        format!("{:016x}-{}", self.vm_nonce, self.next_request)
    }

    /// The headers of a call to the predictor: `path`, the body's format, the token.
    pub fn call_headers<'a>(&'a self, path: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut headers = vec![
            (":method", "POST"),
            (":path", path),
            (":authority", self.config.predictor_authority.as_str()),
            ("content-type", codec::MSGPACK),
            ("accept", codec::MSGPACK),
        ];
        if let Some(auth) = &self.authorization {
            headers.push(("authorization", auth.as_str()));
        }
        headers
    }

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

#[derive(Default)]
pub struct Root {
    vm: Option<SharedVm>,
    /// Batch calls under way: token -> (cluster called, batch).
    sending: HashMap<u32, (String, Batch)>,
}

/// Timeout of a dispatch or report batch call.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

impl Root {
    /// Sends what the outbox has ready: one dispatch batch and one report batch at most
    /// under way at a time (dispatch batches must complete in order, `outbox` module).
    fn flush(&mut self) {
        let Some(vm) = self.vm.clone() else { return };
        let mut vm = vm.borrow_mut();
        let sending_dispatches = self.sending.values().any(|(_, b)| matches!(b, Batch::Dispatches(_)));
        let sending_reports = self.sending.values().any(|(_, b)| matches!(b, Batch::Observations(_)));
        let cluster = vm.predictor_cluster();
        let mut ready = Vec::new();
        if !sending_dispatches {
            ready.extend(vm.outbox.next_dispatches().map(|b| (paths::DISPATCH, b)));
        }
        if !sending_reports {
            ready.extend(vm.outbox.next_reports().map(|b| (paths::REPORT, b)));
        }
        for (path, (batch, body)) in ready {
            match host::http_call(&cluster, &vm.call_headers(path), &body, FLUSH_TIMEOUT) {
                Ok(token) => {
                    self.sending.insert(token, (cluster.clone(), batch));
                }
                Err(_) => {
                    vm.record_call(&cluster, None);
                    vm.outbox.sent(batch, Outcome::Failed);
                }
            }
        }
        let counts = vm.outbox.take_counts();
        vm.stats.outbox(counts);
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token_id: u32, _: usize, _: usize, _: usize) {
        let Some((cluster, batch)) = self.sending.remove(&token_id) else { return };
        let Some(vm) = self.vm.clone() else { return };
        let status = host::header(MapType::HttpCallResponseHeaders, ":status").and_then(|s| s.parse::<u16>().ok());
        let outcome = Outcome::of(status);
        let delivered_dispatches = outcome != Outcome::Failed && matches!(batch, Batch::Dispatches(_));
        {
            let mut vm = vm.borrow_mut();
            vm.record_call(&cluster, status);
            vm.outbox.sent(batch, outcome);
        }
        // Reports waiting for these dispatches may go now rather than on the next tick.
        if delivered_dispatches {
            self.flush();
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
        let authorization = config.predictor_token.as_ref().map(|t| format!("Bearer {t}"));
        match &self.vm {
            Some(vm) => {
                let mut vm = vm.borrow_mut();
                vm.outbox.set_limits(config.max_batch, config.max_batch_bytes);
                vm.config = config;
                vm.shards = shards;
                vm.authorization = authorization;
            }
            None => {
                let seed = RandomState::new().hash_one(host::now_ns());
                self.vm = Some(Rc::new(RefCell::new(Vm {
                    stats: Stats::define(),
                    rng: Rng::new(seed),
                    states: StateCache::default(),
                    outbox: Outbox::new(config.max_queued, config.max_batch, config.max_batch_bytes),
                    vm_nonce: Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15).next_u64(),
                    next_request: 0,
                    shards,
                    authorization,
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

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let vm = self.vm.clone()?;
        Some(Box::new(Request::new(vm)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
