//! The service's shared state: one `Arc<AppState>` handed to every handler. The
//! decisions' state is [`Predictor`] (predictor-core); what is here is the process's.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use headroom_predictor_core::clock::{Clock, WallClock};
use headroom_predictor_core::predictor::Predictor;

use crate::heartbeat::Heartbeats;
use crate::ort::Ort;
use crate::tokens::Tokens;
use headroom_predictor_core::config::Config;

pub struct AppState {
    /// Pools, models, flow queues, metrics and the clock: what every decision reads.
    pub core: Arc<Predictor>,
    /// Set after the first scrape round; `/readyz` waits for it.
    pub scraped_once: AtomicBool,
    /// The callers' tokens guarded routes require (`crate::auth`); none: they are open.
    pub tokens: Tokens,
    /// Set when the service begins to shut down: open predict streams end then (`crate::stream`),
    /// since a graceful shutdown waits for every stream and the gateway never ends its own.
    pub closing: tokio::sync::watch::Sender<bool>,
    /// When each background task last went round (`crate::tasks`): readiness reads them.
    pub heartbeats: Heartbeats,
    /// The last `/metrics` page (`crate::api::metrics`).
    pub metrics_page: MetricsPage,
}

/// The last `/metrics` page and when its render began, behind an async lock: one render at
/// a time, off the async workers, and every scrape waiting for it shares it.
///
/// Why: each scrape rendered under a blocking lock on an async worker thread, so sixteen
/// clients scraping at once held the workers the predict calls run on: predict p99 58 ms
/// and its max 1.4 s, past the filter's 50 ms budget. Now a waiting scrape yields its
/// worker, the render runs on the blocking pool, and a page rendered after a scrape
/// arrived answers it too, so scrapes cost at most one render at a time however many come.
/// No page is older than the scrape it answers.
#[derive(Default)]
pub struct MetricsPage {
    last: tokio::sync::Mutex<Option<(std::time::Instant, Arc<String>)>>,
}

impl MetricsPage {
    /// A page rendered after `asked`: the last one if it began since, else `render`'s.
    pub async fn since(
        &self,
        asked: std::time::Instant,
        render: impl FnOnce() -> String + Send + 'static,
    ) -> Arc<String> {
        let mut last = self.last.lock().await;
        if let Some((began, page)) = last.as_ref() {
            if *began >= asked {
                return page.clone();
            }
        }
        let began = std::time::Instant::now();
        // A render that panicked leaves an empty page, as an encoding error does.
        let page = Arc::new(tokio::task::spawn_blocking(render).await.unwrap_or_default());
        *last = Some((began, page.clone()));
        page
    }
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
            tokens: Tokens::new(config.caller_tokens()?),
            closing: tokio::sync::watch::Sender::new(false),
            heartbeats: Heartbeats::default(),
            metrics_page: MetricsPage::default(),
            core: Arc::new(Predictor::new(config, runtime, clock)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::*;

    /// A render of `ms` that counts itself.
    fn slow_render(renders: &Arc<AtomicU64>, ms: u64) -> impl FnOnce() -> String + Send + 'static {
        let renders = renders.clone();
        move || {
            std::thread::sleep(Duration::from_millis(ms));
            format!("render {}", renders.fetch_add(1, Ordering::SeqCst) + 1)
        }
    }

    /// On one async thread (the worst case), a render in progress leaves it free for other
    /// work (a predict call's), and scrapes that arrive during it share the next render
    /// instead of each making its own.
    #[tokio::test(flavor = "current_thread")]
    async fn scrapes_render_off_the_async_thread_one_at_a_time_and_share_pages() {
        let page = Arc::new(MetricsPage::default());
        let renders = Arc::new(AtomicU64::new(0));
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let first = tokio::spawn({
            let (page, render) = (page.clone(), slow_render(&renders, 200));
            async move { page.since(Instant::now(), render).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let later: Vec<_> = (0..8)
            .map(|_| {
                let (page, render) = (page.clone(), slow_render(&renders, 100));
                tokio::spawn(async move { page.since(Instant::now(), render).await })
            })
            .collect();
        assert_eq!(first.await.unwrap().as_str(), "render 1");
        assert!(ticks.load(Ordering::SeqCst) >= 10, "the async thread ran other work during the render");
        for scrape in later {
            assert_eq!(scrape.await.unwrap().as_str(), "render 2", "one render after they arrived, shared");
        }
        assert_eq!(renders.load(Ordering::SeqCst), 2);
        // A scrape after that gets a page rendered after it arrived, never an older one.
        assert_eq!(page.since(Instant::now(), slow_render(&renders, 1)).await.as_str(), "render 3");
        ticker.abort();
    }
}
