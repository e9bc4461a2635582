//! The predictor's state: what every decision reads and changes. The service wraps one
//! in its transport state (`predictor-svc/src/state.rs`); a test or a simulation builds
//! one on its own clock and model runtime.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use headroom_protocol::Observation;

use crate::callers::Callers;
use crate::clock::Clock;
use crate::config::Config;
use crate::flow::queue::Flows;
use crate::metrics::Metrics;
use crate::model::prior::AnalyticPrior;
use crate::model::runtime::Runtime;
use crate::model::store::ModelStore;
use crate::pool::{ClassCost, Pools};

pub struct Predictor {
    pub config: Config,
    pub pools: Pools,
    pub models: ModelStore,
    pub observations: Mutex<ObservationLog>,
    pub metrics: Metrics,
    /// Requests waiting for headroom (flow control), per pool.
    pub flows: Flows,
    /// Each caller's dispatch rate.
    pub callers: Callers,
    /// The time every decision reads (`crate::clock`).
    pub clock: Arc<dyn Clock>,
}

impl Predictor {
    /// Builds the predictor with its models run by `runtime` and its decisions on `clock`;
    /// fails when a configured model or prior profile cannot be loaded.
    pub fn new(config: Config, runtime: Arc<dyn Runtime>, clock: Arc<dyn Clock>) -> anyhow::Result<Predictor> {
        let prior = AnalyticPrior {
            hardware_scale: config.prior_hardware_scale(),
            profiles: config.prior_profiles()?,
            ..AnalyticPrior::default()
        };
        // The pools drain their prefill backlogs at the cost the prior charges per token, and
        // know each class's fastest decode as the prior does.
        let classes = prior.hardware_scale.len().max(prior.profiles.len()).max(1) as u32;
        let costs: Vec<ClassCost> = (0..classes)
            .map(|c| ClassCost {
                prefill_ms_per_token: prior.prefill_ms_per_token(c),
                fastest_tpot_ms: prior.fastest_tpot_ms(c),
            })
            .collect();
        let models = ModelStore::open_with_clock(config.model.clone(), runtime, clock.clone())?.with_prior(prior);
        Ok(Predictor {
            pools: Pools::from_config(&config, &costs),
            metrics: Metrics::new(models.persist_failures.clone(), models.substituted.clone()),
            models,
            observations: Mutex::new(ObservationLog::new(config.observations_kept)),
            flows: Flows::new(config.flow.clone()),
            callers: Callers::new(config.callers),
            clock,
            config,
        })
    }
}
/// The most recent observations, newest last.
pub struct ObservationLog {
    kept: VecDeque<Observation>,
    capacity: usize,
    pub total: u64,
}

impl ObservationLog {
    pub fn new(capacity: usize) -> Self {
        ObservationLog { kept: VecDeque::new(), capacity: capacity.max(1), total: 0 }
    }

    pub fn push(&mut self, o: Observation) {
        if self.kept.len() == self.capacity {
            self.kept.pop_front();
        }
        self.kept.push_back(o);
        self.total += 1;
    }

    /// Up to `limit` of the newest observations, oldest first.
    pub fn newest(&self, limit: usize) -> Vec<Observation> {
        let skip = self.kept.len().saturating_sub(limit);
        self.kept.iter().skip(skip).cloned().collect()
    }

    /// `(total, first, page)`: up to `limit` observations, oldest first, the newest ones or,
    /// with `after`, the first ones numbered after it (numbered from 1 as they arrived, the
    /// oldest kept being `total - kept + 1`); `first` is the page's first one's number.
    pub fn page(&self, after: Option<u64>, limit: usize) -> (u64, u64, Vec<Observation>) {
        let dropped = self.total - self.kept.len() as u64;
        let skip = match after {
            Some(after) => usize::try_from(after.saturating_sub(dropped)).unwrap_or(usize::MAX).min(self.kept.len()),
            None => self.kept.len().saturating_sub(limit),
        };
        let page = self.kept.iter().skip(skip).take(limit).cloned().collect();
        (self.total, dropped + skip as u64 + 1, page)
    }
}
