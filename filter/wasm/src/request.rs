//! One HTTP stream: forwards Envoy's callbacks to `headroom_filter_core::flow::Flow`
//! and carries out the step it returns.

use std::cell::RefCell;
use std::rc::Rc;

use headroom_filter_core::flow::{Flow, Step};
use headroom_filter_core::host::Level;
use headroom_filter_core::vm::Vm;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::envoy::Envoy;
use crate::host;
use crate::stats::Stats;

/// The VM's state, shared by the root and every request context of one VM (one
/// worker thread, so no locking).
pub type SharedVm = Rc<RefCell<Vm>>;

pub struct Request {
    vm: SharedVm,
    stats: Rc<Stats>,
    flow: Flow,
}

impl Request {
    pub fn new(vm: SharedVm, stats: Rc<Stats>) -> Self {
        Request { vm, stats, flow: Flow::new() }
    }

    /// Runs one flow callback with the VM's state borrowed, and releases it before the
    /// step is carried out (a local reply or a resume may run other callbacks).
    fn step(&mut self, callback: impl FnOnce(&mut Flow, &mut Envoy, &mut Vm) -> Step) -> Action {
        let step = {
            let mut vm = self.vm.borrow_mut();
            callback(&mut self.flow, &mut Envoy { stats: &self.stats }, &mut vm)
        };
        match step {
            Step::Continue => Action::Continue,
            Step::Pause => Action::Pause,
            Step::Resume => {
                if host::resume_request().is_err() {
                    host::log(Level::Warn, "headroom: could not resume the request");
                }
                Action::Pause
            }
            Step::Reply { status, headers, body } => {
                let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
                if host::send_response(status, &headers, &body).is_err() {
                    host::log(Level::Warn, "headroom: could not send a local reply");
                }
                Action::Pause
            }
        }
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, token_id: u32, _: usize, body_size: usize, _: usize) {
        self.step(|flow, host, vm| flow.on_callout_answer(host, vm, token_id, body_size));
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        self.step(|flow, host, vm| flow.on_request_headers(host, vm, end_of_stream))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.step(|flow, host, vm| flow.on_request_body(host, vm, body_size, end_of_stream))
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        self.step(|flow, host, vm| flow.on_response_headers(host, vm))
    }

    fn on_http_response_body(&mut self, body_size: usize, _: bool) -> Action {
        self.step(|flow, host, vm| flow.on_response_body(host, vm, body_size))
    }

    fn on_log(&mut self) {
        self.flow.on_log(&mut Envoy { stats: &self.stats }, &mut self.vm.borrow_mut());
    }
}
