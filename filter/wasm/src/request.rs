//! One HTTP stream: forwards Envoy's callbacks to `headroom_filter_core::flow::Flow`
//! and carries out the step it returns.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use headroom_filter_core::flow::{Flow, Step};
use headroom_filter_core::host::Level;
use headroom_filter_core::vm::Vm;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::envoy::Envoy;
use crate::host;
use crate::stats::Stats;

/// What the root and every request context of one VM share (one worker thread, so no
/// locking).
pub struct Shared {
    pub vm: RefCell<Vm>,
    pub stats: Stats,
    /// The VM's wake-up queue, when the root could register one (`Host::wake`).
    pub wake: Option<u32>,
    /// Every live stream's flow by context id: where the root hands a request its share of
    /// a coalesced predict call.
    pub flows: RefCell<HashMap<u32, Weak<RefCell<Flow>>>>,
}

impl Shared {
    pub fn envoy(&self) -> Envoy<'_> {
        Envoy { stats: &self.stats, wake: self.wake }
    }
}

pub struct Request {
    context: u32,
    shared: Rc<Shared>,
    flow: Rc<RefCell<Flow>>,
}

impl Request {
    pub fn new(context: u32, shared: Rc<Shared>) -> Self {
        let flow = Rc::new(RefCell::new(Flow::for_context(context)));
        shared.flows.borrow_mut().insert(context, Rc::downgrade(&flow));
        Request { context, shared, flow }
    }

    /// Runs one flow callback with the VM's state borrowed, and releases it before the
    /// step is carried out (a local reply or a resume may run other callbacks).
    fn step(&mut self, callback: impl FnOnce(&mut Flow, &mut Envoy, &mut Vm) -> Step) -> Action {
        let step = {
            let mut vm = self.shared.vm.borrow_mut();
            callback(&mut self.flow.borrow_mut(), &mut self.shared.envoy(), &mut vm)
        };
        carry_out(step)
    }
}

/// Carries out `step` on the effective context: what a callback returns to Envoy.
pub fn carry_out(step: Step) -> Action {
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

impl Drop for Request {
    fn drop(&mut self) {
        self.shared.flows.borrow_mut().remove(&self.context);
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
        self.flow.borrow_mut().on_log(&mut self.shared.envoy(), &mut self.shared.vm.borrow_mut());
    }
}
