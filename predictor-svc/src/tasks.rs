//! The background tasks (scraper, expiry, trainer, flow queue), kept running: each runs
//! under [`supervise`], and a panic restarts it after [`RESTART_PAUSE`] (counted in
//! `headroom_task_restarts_total{task}`) instead of leaving the replica answering from
//! metrics that no longer move while `/healthz` says ok. That each still goes round is
//! `crate::heartbeat`'s job.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::heartbeat::Task;
use crate::state::AppState;

/// How long a panicked task waits before it runs again: a panic on every round must not
/// spin a core.
pub const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// Runs `run(state)` as `task` on the runtime until it returns: restarted after a panic,
/// retired when it returns by itself. Aborting the handle returned stops it.
pub fn supervise<F, Fut>(state: Arc<AppState>, task: Task, run: F) -> tokio::task::JoinHandle<()>
where
    F: Fn(Arc<AppState>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            state.heartbeats.beat(task);
            let running = AbortOnDrop(tokio::spawn(run(state.clone())));
            match running.wait().await {
                Ok(()) => {
                    state.heartbeats.retire(task);
                    return;
                }
                Err(e) if e.is_panic() => {
                    state.core.metrics.task_restarted(task.name());
                    tracing::error!(task = task.name(), "background task panicked; restarting it");
                    tokio::time::sleep(RESTART_PAUSE).await;
                }
                Err(_) => return,
            }
        }
    })
}

/// A task aborted when its supervisor is (dropping a `JoinHandle` only detaches it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    async fn wait(mut self) -> Result<(), tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use headroom_predictor_core::config::Config;

    #[tokio::test]
    async fn a_panicked_task_runs_again_and_one_that_returns_is_retired() {
        let config = Config::parse("[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n");
        let state = Arc::new(AppState::new(config.unwrap_or_else(|e| panic!("{e}"))).unwrap_or_else(|e| panic!("{e}")));
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let handle = supervise(state.clone(), Task::Expiry, move |_| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(run > 0, "the first run panics");
            }
        });
        tokio::time::timeout(RESTART_PAUSE * 5, handle)
            .await
            .unwrap_or_else(|_| panic!("the supervisor never ended"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        let text = state.core.metrics.render();
        assert!(text.contains("headroom_task_restarts_total{task=\"expiry\"} 1"), "{text}");
        let in_an_hour = Instant::now() + Duration::from_secs(3600);
        assert!(!state.heartbeats.silent(&state.core.config, in_an_hour, 1).contains(&"expiry"), "retired");
    }
}
