//! The root context: forwards the VM's callbacks (configure, tick, wake-ups, answers to
//! its own calls, its predict stream) to `headroom_filter_core::vm::Vm`, creates a `Request`
//! per stream, and hands each request its share of a coalesced predict call.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::rc::{Rc, Weak};
use std::time::Duration;

use headroom_filter_core::coalesce::Delivery;
use headroom_filter_core::flow::Step;
use headroom_filter_core::host::Level;
use headroom_filter_core::vm::Vm;
use headroom_filter_core::FilterConfig;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};

use crate::host;
use crate::request::{carry_out, Request, Shared};
use crate::stats::Stats;

/// The VM's linear memory (what it holds from the host, never returned: the high-water mark).
fn linear_memory_bytes() -> u64 {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::memory_size::<0>() as u64 * 65536
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        0
    }
}

pub struct Root {
    /// The host's id of this root context.
    context: u32,
    /// Set by the first successful `on_configure`.
    shared: Option<Rc<Shared>>,
}

impl Root {
    pub fn new(context: u32) -> Root {
        Root { context, shared: None }
    }

    /// Hands each request its share of a coalesced predict call and carries out what its
    /// flow returns, on that request's context; then acts as the root again.
    fn deliver(&self, shared: &Shared, deliveries: Vec<Delivery>) {
        if deliveries.is_empty() {
            return;
        }
        for Delivery { context, answer } in deliveries {
            // Gone (its client left, its stream ended): nothing waits for this share.
            let Some(flow) = shared.flows.borrow().get(&context).and_then(Weak::upgrade) else { continue };
            if host::set_effective_context(context).is_err() {
                continue;
            }
            let step = {
                let (Ok(mut flow), Ok(mut vm)) = (flow.try_borrow_mut(), shared.vm.try_borrow_mut()) else {
                    // Never expected (no callback of the request runs inside the root's); if it
                    // happens, the request goes on unrouted (Envoy balances) rather than hang.
                    host::log(Level::Error, "headroom: a request's state was in use when its prediction came");
                    carry_out(Step::Resume);
                    continue;
                };
                flow.on_coalesced_answer(&mut shared.envoy(), &mut vm, answer)
            };
            carry_out(step);
        }
        if host::set_effective_context(self.context).is_err() {
            host::log(Level::Warn, "headroom: could not return to the root context");
        }
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token_id: u32, _: usize, body_size: usize, _: usize) {
        let Some(shared) = self.shared.clone() else { return };
        let deliveries = {
            let mut vm = shared.vm.borrow_mut();
            let mut envoy = shared.envoy();
            match vm.on_predictions_answer(&mut envoy, token_id, body_size) {
                Some(deliveries) => deliveries,
                None => {
                    vm.on_batch_answer(&mut envoy, token_id);
                    return;
                }
            }
        };
        self.deliver(&shared, deliveries);
    }

    fn on_grpc_stream_initial_metadata(&mut self, token_id: u32, _num_elements: u32) {
        let Some(shared) = self.shared.clone() else { return };
        shared.vm.borrow_mut().on_stream_headers(&mut shared.envoy(), token_id);
    }

    fn on_grpc_stream_message(&mut self, token_id: u32, message_size: usize) {
        let Some(shared) = self.shared.clone() else { return };
        let deliveries = shared.vm.borrow_mut().on_stream_message(&mut shared.envoy(), token_id, message_size);
        self.deliver(&shared, deliveries);
    }

    fn on_grpc_stream_close(&mut self, token_id: u32, status_code: u32) {
        let Some(shared) = self.shared.clone() else { return };
        let deliveries = shared.vm.borrow_mut().on_stream_closed(&mut shared.envoy(), token_id, status_code);
        self.deliver(&shared, deliveries);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = host::buffer(BufferType::PluginConfiguration, usize::MAX).ok().flatten().unwrap_or_default();
        // The VM's environment is what Envoy passes it (`vm_config.environment_variables`).
        let config = match FilterConfig::parse_in(&bytes, |name| std::env::var(name).ok()) {
            Ok(c) => c,
            Err(e) => {
                host::log(Level::Error, &format!("headroom: {e}"));
                return false;
            }
        };
        for warning in config.warnings() {
            host::log(Level::Error, &format!("headroom: {warning}"));
        }
        if host::set_tick_period(Duration::from_millis(config.flush_interval_ms)).is_err() {
            host::log(Level::Error, "headroom: could not set the flush tick");
            return false;
        }
        match &self.shared {
            Some(shared) => shared.vm.borrow_mut().reconfigure(config),
            None => {
                let seed = RandomState::new().hash_one(host::now_ns());
                // A name of this VM's own: the last VM to register a name receives its wake-ups.
                let wake = match host::register_queue(&format!("headroom.wake.{seed:016x}")) {
                    Ok(queue) => Some(queue),
                    Err(e) => {
                        host::log(
                            Level::Warn,
                            &format!("headroom: no wake-up queue ({e:?}): one predict call per request"),
                        );
                        None
                    }
                };
                let stats = Stats::define();
                let monotonic = host::monotonic_clock();
                stats.clock(monotonic);
                if !monotonic {
                    host::log(
                        Level::Warn,
                        "headroom: the host serves no monotonic clock: durations on its wall clock, guarded against \
                         steps back",
                    );
                }
                self.shared = Some(Rc::new(Shared {
                    vm: RefCell::new(Vm::new(config, seed)),
                    stats,
                    wake,
                    flows: RefCell::new(HashMap::new()),
                }));
            }
        }
        host::log(Level::Info, "headroom: configured");
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        let Some(shared) = self.shared.clone() else { return };
        // The items only say "wake up"; drained so the queue does not grow.
        while let Ok(Some(_)) = host::dequeue(queue_id) {}
        let deliveries = shared.vm.borrow_mut().on_wake(&mut shared.envoy());
        self.deliver(&shared, deliveries);
    }

    fn on_tick(&mut self) {
        let Some(shared) = self.shared.clone() else { return };
        let deliveries = shared.vm.borrow_mut().on_tick(&mut shared.envoy());
        shared.stats.vm_memory(linear_memory_bytes());
        self.deliver(&shared, deliveries);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = self.shared.clone()?;
        Some(Box::new(Request::new(context_id, shared)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
