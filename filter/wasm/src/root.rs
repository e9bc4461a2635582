//! The root context: forwards the VM's callbacks (configure, tick, batch answers)
//! to `headroom_filter_core::vm::Vm` and creates a `Request` per stream.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::Rc;
use std::time::Duration;

use headroom_filter_core::host::Level;
use headroom_filter_core::vm::Vm;
use headroom_filter_core::FilterConfig;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};

use crate::envoy::Envoy;
use crate::host;
use crate::request::{Request, SharedVm};
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

#[derive(Default)]
pub struct Root {
    /// Set by the first successful `on_configure`.
    vm: Option<(SharedVm, Rc<Stats>)>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token_id: u32, _: usize, _: usize, _: usize) {
        if let Some((vm, stats)) = &self.vm {
            vm.borrow_mut().on_batch_answer(&mut Envoy { stats }, token_id);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = host::buffer(BufferType::PluginConfiguration, usize::MAX).ok().flatten().unwrap_or_default();
        let config = match FilterConfig::parse(&bytes) {
            Ok(c) => c,
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
            Some((vm, _)) => vm.borrow_mut().reconfigure(config),
            None => {
                let seed = RandomState::new().hash_one(host::now_ns());
                self.vm = Some((Rc::new(RefCell::new(Vm::new(config, seed))), Rc::new(Stats::define())));
            }
        }
        host::log(Level::Info, "headroom: configured");
        true
    }

    fn on_tick(&mut self) {
        if let Some((vm, stats)) = &self.vm {
            vm.borrow_mut().flush(&mut Envoy { stats });
            stats.vm_memory(linear_memory_bytes());
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let (vm, stats) = self.vm.clone()?;
        Some(Box::new(Request::new(vm, stats)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
