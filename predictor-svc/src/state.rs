//! The service's shared state: one `Arc<AppState>` handed to every handler. The
//! decisions' state is [`Predictor`] (predictor-core); what is here is the process's.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use headroom_predictor_core::clock::{Clock, WallClock};
use headroom_predictor_core::predictor::Predictor;

use crate::heartbeat::Heartbeats;
use crate::ort::Ort;
use headroom_predictor_core::config::Config;

pub struct AppState {
    /// Pools, models, flow queues, metrics and the clock: what every decision reads.
    pub core: Arc<Predictor>,
    /// Set after the first scrape round; `/readyz` waits for it.
    pub scraped_once: AtomicBool,
    /// The token guarded routes require (`crate::auth`); `None`: they are open.
    pub token: Option<String>,
    /// Set when the service begins to shut down: open predict streams end then (`crate::stream`),
    /// since a graceful shutdown waits for every stream and the gateway never ends its own.
    pub closing: tokio::sync::watch::Sender<bool>,
    /// When each background task last went round (`crate::tasks`): readiness reads them.
    pub heartbeats: Heartbeats,
}

impl AppState {
    /// Builds the state on the wall clock; fails when ONNX Runtime, a configured model or
    /// the token cannot be loaded.
    pub fn new(config: Config) -> anyhow::Result<AppState> {
        AppState::with_clock(config, Arc::new(WallClock))
    }

    /// [`AppState::new`] with its decisions on `clock`.
    pub fn with_clock(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<AppState> {
        let runtime = Arc::new(Ort::init(config.model.onnxruntime_library.as_deref())?);
        Ok(AppState {
            scraped_once: AtomicBool::new(false),
            token: config.auth_token()?,
            closing: tokio::sync::watch::Sender::new(false),
            heartbeats: Heartbeats::default(),
            core: Arc::new(Predictor::new(config, runtime, clock)?),
        })
    }
}
