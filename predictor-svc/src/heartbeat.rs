//! Whether each background task (scraper, expiry, trainer, flow queue, token reload) still goes
//! round. Each beats every round; `/readyz` and `/healthz` read [`Heartbeats::silent`]: a
//! task silent past its bound (wedged, not dead: a dead one is restarted, `crate::tasks`)
//! makes the replica unready, naming it, so the gateway's calls go to a replica that is
//! whole; silent [`LIVENESS_FACTOR`] times as long, it fails liveness and is restarted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use headroom_predictor_core::config::Config;

/// How many times a task's bound of silence fails liveness as well as readiness.
pub const LIVENESS_FACTOR: u32 = 4;

/// A background task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Scraper,
    Expiry,
    Trainer,
    Flow,
    Tokens,
}

impl Task {
    pub const ALL: [Task; 5] = [Task::Scraper, Task::Expiry, Task::Trainer, Task::Flow, Task::Tokens];

    pub fn name(self) -> &'static str {
        match self {
            Task::Scraper => "scraper",
            Task::Expiry => "expiry",
            Task::Trainer => "trainer",
            Task::Flow => "flow",
            Task::Tokens => "tokens",
        }
    }

    /// How long it may go without a beat: ten of its rounds, at least 5 s; the trainer's
    /// round includes a training, so it gets ten minutes beyond its interval.
    pub fn max_silence(self, config: &Config) -> Duration {
        let rounds = |ms: u64| Duration::from_millis(ms.saturating_mul(10)).max(Duration::from_secs(5));
        match self {
            Task::Scraper => rounds(config.scrape_interval_ms.saturating_add(config.scrape_timeout_ms)),
            Task::Expiry => rounds(1000),
            Task::Trainer => Duration::from_millis(config.model.retrain_interval_ms) + Duration::from_secs(600),
            Task::Flow => rounds(config.flow.recheck_interval_ms),
            Task::Tokens => rounds(crate::tokens::RELOAD_INTERVAL.as_millis() as u64),
        }
    }
}

/// When each task last beat, in ms since `started`; [`RETIRED`]: it ended by design (the
/// trainer of a predictor that does not train).
#[derive(Debug)]
pub struct Heartbeats {
    started: Instant,
    beats: [AtomicU64; Task::ALL.len()],
}

const RETIRED: u64 = u64::MAX;

impl Default for Heartbeats {
    fn default() -> Self {
        Heartbeats::new(Instant::now())
    }
}

impl Heartbeats {
    /// Every task counts as having beaten at `started`.
    pub fn new(started: Instant) -> Heartbeats {
        Heartbeats { started, beats: Default::default() }
    }

    fn slot(&self, task: Task) -> &AtomicU64 {
        &self.beats[task as usize]
    }

    /// `task` is alive at `now`.
    pub fn beat_at(&self, task: Task, now: Instant) {
        let ms = now.saturating_duration_since(self.started).as_millis();
        self.slot(task).store(u64::try_from(ms).unwrap_or(RETIRED - 1), Ordering::Relaxed);
    }

    pub fn beat(&self, task: Task) {
        self.beat_at(task, Instant::now());
    }

    /// `task` ended by design: no beat is due from it.
    pub fn retire(&self, task: Task) {
        self.slot(task).store(RETIRED, Ordering::Relaxed);
    }

    /// The tasks silent at `now` for over `factor` times their bound.
    pub fn silent(&self, config: &Config, now: Instant, factor: u32) -> Vec<&'static str> {
        let since = now.saturating_duration_since(self.started);
        Task::ALL
            .into_iter()
            .filter(|&t| {
                let beat = self.slot(t).load(Ordering::Relaxed);
                beat != RETIRED && since.saturating_sub(Duration::from_millis(beat)) > t.max_silence(config) * factor
            })
            .map(Task::name)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::parse("[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_task_silent_past_its_bound_is_named_and_a_retired_one_is_not() {
        let c = config();
        let t0 = Instant::now();
        let beats = Heartbeats::new(t0);
        let later = t0 + Duration::from_secs(30);
        for t in [Task::Scraper, Task::Expiry, Task::Flow] {
            beats.beat_at(t, later);
        }
        assert!(beats.silent(&c, later, 1).is_empty(), "the trainer's bound is ten minutes past its interval");
        let much_later = later + Task::Expiry.max_silence(&c) + Duration::from_millis(1);
        beats.beat_at(Task::Scraper, much_later);
        beats.beat_at(Task::Flow, much_later);
        assert_eq!(beats.silent(&c, much_later, 1), ["expiry"]);
        assert!(beats.silent(&c, much_later, LIVENESS_FACTOR).is_empty(), "not yet for liveness");
        beats.retire(Task::Expiry);
        assert!(beats.silent(&c, much_later, 1).is_empty());
    }
}
