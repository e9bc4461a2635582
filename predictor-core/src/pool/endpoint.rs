//! One model server as the predictor knows it: its scraped engine metrics, the prefixes it
//! was sent, the step time it runs at and the prompt tokens sent it lately.

use std::time::{Duration, Instant};

use headroom_protocol::prefix::PrefixCache;

/// Engine metrics read from an endpoint's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineMetrics {
    pub running: u32,
    pub waiting: u32,
    pub kv_usage: f64,
    /// vLLM's inter-token latency histogram as read (cumulative); `None` when the server
    /// exposes none.
    pub decode: Option<DecodeCounter>,
    /// Whether the scrape read the engine's running or waiting count (a server whose metrics
    /// name neither leaves both 0): only a count read can vouch for the books ([`Pool::expire`]).
    pub queue_read: bool,
}

/// The cumulative sum and count of a server's inter-token latency histogram: the time
/// between consecutive output tokens of each request, summed over every token it made.
/// Between two scrapes, the sum's growth over the count's is the mean time between tokens
/// of what was decoded meanwhile: the step time the server runs at now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeCounter {
    pub sum_s: f64,
    pub tokens: f64,
}

/// One model server.
#[derive(Debug)]
pub struct Endpoint {
    pub address: String,
    pub metrics: Option<EngineMetrics>,
    pub scraped_at: Option<Instant>,
    pub scrape_errors: u64,
    /// Hardware class id (0: unknown), a model feature.
    pub hardware_class: u32,
    pub(super) prefix: PrefixCache,
    /// The time between tokens it runs at now: from its inter-token latency histogram
    /// between scrapes where it exposes one, else a moving average of the TPOTs reported
    /// there (which arrive when requests end, seconds after the steps they describe).
    pub(super) recent_tpot_ms: Option<f64>,
    /// The histogram as of the start of the window being measured.
    pub(super) decode_from: Option<(DecodeCounter, Instant)>,
    /// When the histogram last moved `recent_tpot_ms`: reports do not, while it does.
    pub(super) decode_seen_at: Option<Instant>,
    /// Uncached prompt tokens dispatched there per second, decaying with [`PREFILL_RATE_TAU`],
    /// as of `prefill_rate_at`.
    pub(super) prefill_rate: f64,
    pub(super) prefill_rate_at: Option<Instant>,
    /// Its model's context length (`/v1/models`' `max_model_len`), once read.
    pub max_context_tokens: Option<u32>,
}

/// Weight of the newest TPOT report in an endpoint's moving average.
const RECENT_TPOT_WEIGHT: f64 = 0.2;
/// Time constant of the step time read from the histogram: long enough to average over
/// the steps that carry a prefill chunk and those that do not (tens of steps at real
/// speed), short enough to follow a batch that fills within seconds.
const DECODE_TAU: Duration = Duration::from_secs(1);
/// Tokens a window of the histogram must hold before it says anything: fewer (a nearly
/// idle server) are a step or two, noise.
const DECODE_MIN_TOKENS: f64 = 32.0;
/// A window that takes longer to reach [`DECODE_MIN_TOKENS`] describes no "now": it is
/// dropped and the next one starts.
const DECODE_MAX_WINDOW: Duration = Duration::from_secs(5);
/// While the histogram moved `recent_tpot_ms` this recently, reports leave it alone.
pub(super) const DECODE_FRESH: Duration = Duration::from_secs(10);
/// Time constant of an endpoint's recent prefill rate: short enough to follow a burst. A
/// longer one (30 s) made the trained models' TTFT less accurate (docs/predictor.md, "The
/// prefill rate over 30 seconds").
pub(super) const PREFILL_RATE_TAU: Duration = Duration::from_secs(5);

impl Endpoint {
    /// A server just listed, with nothing known of it yet but its hardware class and room
    /// for `prefix_blocks` cached prompt blocks.
    pub(super) fn new(address: String, hardware_class: u32, prefix_blocks: usize) -> Endpoint {
        Endpoint {
            address,
            metrics: None,
            scraped_at: None,
            scrape_errors: 0,
            hardware_class,
            prefix: PrefixCache::new(prefix_blocks),
            recent_tpot_ms: None,
            decode_from: None,
            decode_seen_at: None,
            prefill_rate: 0.0,
            prefill_rate_at: None,
            max_context_tokens: None,
        }
    }

    /// The server refused a connection: it is down, or back as a new process. Its engine
    /// state is unknown from now on, and so is its prefix cache: a restarted server starts
    /// with an empty one, so the blocks remembered for it would draw requests there for
    /// cache hits it no longer has.
    pub fn unreachable(&mut self) {
        self.metrics = None;
        self.scraped_at = None;
        self.decode_from = None;
        self.prefix.shrink_to(0);
    }

    /// Files a successful scrape read at `now`.
    pub fn scraped(&mut self, m: EngineMetrics, now: Instant) {
        self.metrics = Some(m);
        self.scraped_at = Some(now);
        self.fold_decode(m.decode, now);
    }

    /// Moves `recent_tpot_ms` towards the mean time between tokens decoded since the
    /// window began, once the window holds [`DECODE_MIN_TOKENS`]. A histogram that went
    /// backwards (the server restarted) or a window too old starts a new window.
    fn fold_decode(&mut self, now_counter: Option<DecodeCounter>, now: Instant) {
        let Some(c) = now_counter else {
            self.decode_from = None;
            return;
        };
        let Some((from, at)) = self.decode_from else {
            self.decode_from = Some((c, now));
            return;
        };
        let (tokens, sum_s) = (c.tokens - from.tokens, c.sum_s - from.sum_s);
        let span = now.saturating_duration_since(at);
        if tokens < 0.0 || sum_s < 0.0 || span > DECODE_MAX_WINDOW {
            self.decode_from = Some((c, now));
            return;
        }
        if tokens < DECODE_MIN_TOKENS {
            return;
        }
        self.decode_from = Some((c, now));
        let step_ms = sum_s / tokens * 1000.0;
        if !(step_ms.is_finite() && step_ms > 0.0) {
            return;
        }
        let w = 1.0 - (-span.as_secs_f64() / DECODE_TAU.as_secs_f64()).exp();
        self.recent_tpot_ms = Some(match self.decode_seen_at.and(self.recent_tpot_ms) {
            Some(avg) => (1.0 - w) * avg + w * step_ms,
            // The first reading replaces what reports said.
            None => step_ms,
        });
        self.decode_seen_at = Some(now);
    }

    /// A TPOT reported for a request served there, at `now`: moves `recent_tpot_ms`
    /// unless the histogram does.
    pub(super) fn reported_tpot(&mut self, tpot_ms: f64, now: Instant) {
        if self.decode_seen_at.is_some_and(|t| now.saturating_duration_since(t) < DECODE_FRESH) {
            return;
        }
        self.decode_seen_at = None;
        if tpot_ms.is_finite() && tpot_ms > 0.0 {
            let w = RECENT_TPOT_WEIGHT;
            self.recent_tpot_ms = Some(self.recent_tpot_ms.map_or(tpot_ms, |avg| (1.0 - w) * avg + w * tpot_ms));
        }
    }

    /// The recent prefill rate decayed to `now`.
    pub(super) fn prefill_rate(&self, now: Instant) -> f64 {
        self.prefill_rate_at.map_or(0.0, |t| {
            let dt = now.saturating_duration_since(t).as_secs_f64();
            self.prefill_rate * (-dt / PREFILL_RATE_TAU.as_secs_f64()).exp()
        })
    }

    /// Adds `tokens` of prefill dispatched at `now` to the rate.
    pub(super) fn add_prefill(&mut self, tokens: u64, now: Instant) {
        self.prefill_rate = self.prefill_rate(now) + tokens as f64 / PREFILL_RATE_TAU.as_secs_f64();
        self.prefill_rate_at = Some(now);
    }
}
