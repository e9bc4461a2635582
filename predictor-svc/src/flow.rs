//! The flow-control task: judges every busy pool's queue whenever capacity may have
//! freed (a report, a first token, a scrape wakes it) and at least every
//! `recheck_interval_ms`. The queue and its decisions are predictor-core's
//! (`predictor_core::flow`); the service adds the task and the channel a waiting
//! request's answer travels back on.

use std::sync::Arc;
use std::time::Duration;

use headroom_predictor_core::admission::serve_pool;
use headroom_predictor_core::flow::queue::Reply;
use headroom_protocol::PredictResponse;
use tokio::sync::{oneshot, Notify};

use crate::heartbeat::Task;
use crate::state::AppState;

/// A waiting request's answer goes back to its handler over a oneshot channel.
#[derive(Debug)]
pub struct Answer(pub oneshot::Sender<PredictResponse>);

impl Reply for Answer {
    fn send(self: Box<Self>, answer: PredictResponse) {
        // The caller may have left meanwhile: nobody to tell.
        let _ = self.0.send(answer);
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Runs forever: every wake-up (or `recheck_interval_ms` without one), a round over each
/// busy pool at the predictor's clock.
pub async fn run(state: Arc<AppState>) {
    let core = &state.core;
    let recheck = Duration::from_millis(core.config.flow.recheck_interval_ms);
    let woken = Arc::new(Notify::new());
    let waker = woken.clone();
    core.flows.on_wake(move || waker.notify_one());
    loop {
        tokio::select! {
            _ = woken.notified() => {}
            _ = tokio::time::sleep(recheck) => {}
        }
        state.heartbeats.beat(Task::Flow);
        for pool in core.flows.busy_pools() {
            serve_pool(core, &pool, core.clock.now());
        }
    }
}
