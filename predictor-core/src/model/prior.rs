//! Predictions before any model is trained: an analytic prior over the same
//! feature row the models take (`crate::model::features`).
//!
//! Derived from the step-time model in `docs/simulator.md` (Llama-3.1-8B on
//! one H100, continuous batching with chunked prefill). It is honest about what
//! it is: a fixed formula over the endpoint state, labelled `analytic-prior`,
//! to be replaced by the trained models.
//!
//! ```text
//! step     = 0.8 + max(6.0, running * 0.024) + context_tokens * 65e-6      (ms)
//! TTFT     = 10 + (uncached prompt + prefill backlog) * 0.03 + waiting * step
//! decode   = step + prompt tokens * 65e-6 (longer contexts read more KV)
//! prefill  = min(prefill tokens dispatched per second * 0.024 / 1000, 0.8)
//! TPOT     = decode / (1 - prefill)
//! ```
//!
//! The prefill backlog is what the pool estimates the engine has left of the prompts
//! dispatched before this one (`pool::prefill_backlog`), drained at this same 0.03 ms a
//! token (`AnalyticPrior::prefill_ms_per_token`).
//!
//! `prefill` is the share of the engine's time that prompts arriving while the
//! request decodes will take: with chunked prefill each of their tokens rides in a
//! decode step and costs what any batched token costs (0.024 ms on an H100), so
//! the decode steps get `1 - prefill` of each second. It is what sets TPOT on a
//! loaded server: on the benchmark's mixed traffic, prompts took 60-90% of each
//! server's time near the cliff, and a prior without the term predicted a third
//! of the TPOTs measured there (docs/predictor.md, "Decodes share the engine with
//! prefills"). The recent rate stands in for the future's, which nothing at
//! dispatch knows better. Capped at 0.8 (decodes at a fifth of their speed): past
//! it the server is saturated, its queue (which the TTFT terms see) says more than
//! the step, and the measured TPOTs there were half what a higher cap predicts.
//!
//! Other GPUs: `model.prior_hardware_scale` multiplies every engine term (all
//! but the 10 ms overhead) for the endpoints of a hardware class: its prefill
//! slowdown against an H100 (2.7 for the simulated A100; docs/configuration.md).
//!
//! A class with a measured profile (`model.prior_profiles`, from `headroom-profile`) takes
//! its costs from the profile instead of the constants, in the same terms:
//!
//! ```text
//! batch    = max(running, in_flight)                       (decoding now)
//! step     = profile TPOT(batch, tokens_in_flight / batch) (0 on an idle engine)
//! TTFT     = profile TTFT(uncached prompt + prefill backlog)
//!            + ceil(those tokens / CHUNK_TOKENS) * step     (each prefill chunk rides a decode step)
//!            + waiting * step
//! decode   = profile TPOT(batch + 1, (tokens_in_flight + prompt) / (batch + 1))
//! prefill  = min(prefill tokens per second * the profile's cost per prompt token / 1000, 0.8)
//! TPOT     = decode / (1 - prefill)
//! ```
//!
//! The profile already holds the engine's own overheads (the API server, scheduling,
//! sampling) as that engine has them, which no constant written for one GPU did: in front of
//! real vLLM on CPU the constants predicted TTFT 3-8x low before the live correction caught up.

use headroom_predictor_config::Profile;

use super::columns::{Row, HARDWARE_CLASS, PREFILL_TOKENS_PER_S};

/// Prompt tokens an engine prefills per step while it decodes (vLLM's chunked prefill,
/// `max_num_batched_tokens`, 2048 by default): how many decode steps a profiled prompt shares.
pub const CHUNK_TOKENS: f64 = 2048.0;

/// Name reported as `model_version` for analytic predictions.
pub const ANALYTIC_PRIOR: &str = "analytic-prior";

/// Constants of the prior (milliseconds).
#[derive(Debug, Clone)]
pub struct AnalyticPrior {
    pub overhead_ms: f64,
    pub step_fixed_ms: f64,
    pub weight_floor_ms: f64,
    pub per_batched_token_ms: f64,
    pub per_context_token_ms: f64,
    pub prefill_per_token_ms: f64,
    /// Highest share of the engine's time the TPOT term lets prefill take.
    pub max_prefill_share: f64,
    /// Engine-time multiplier by hardware class id (the row's `hardware_class`);
    /// classes past the end run at 1.0.
    pub hardware_scale: Vec<f64>,
    /// Measured profile by hardware class id: where one is set, the class's costs come from
    /// it (the module doc) and its `hardware_scale` is not applied.
    pub profiles: Vec<Option<Profile>>,
}

impl Default for AnalyticPrior {
    fn default() -> Self {
        AnalyticPrior {
            overhead_ms: 10.0,
            step_fixed_ms: 0.8,
            weight_floor_ms: 6.0,
            per_batched_token_ms: 0.024,
            per_context_token_ms: 65e-6,
            prefill_per_token_ms: 0.03,
            max_prefill_share: 0.8,
            hardware_scale: Vec::new(),
            profiles: Vec::new(),
        }
    }
}

impl AnalyticPrior {
    /// Predicted (TTFT, TPOT) in ms from a feature row (`model::features::row`); reads
    /// the state columns only, never the prior columns it fills.
    pub fn predict(&self, row: &Row) -> (f64, f64) {
        if let Some(profile) = self.profile(row[HARDWARE_CLASS] as usize) {
            return self.predict_profiled(profile, row);
        }
        let f = |i: usize| f64::from(row[i]);
        let (waiting, running, prefill_backlog, effective_input, in_flight, tokens_in_flight) =
            (f(2), f(3), f(5), f(6), f(7), f(8));
        let input = f(1);
        let scale = self.scale(row);
        let step = scale
            * (self.step_fixed_ms
                + self.weight_floor_ms.max(running.max(in_flight) * self.per_batched_token_ms)
                + tokens_in_flight * self.per_context_token_ms);
        let prefill = scale * (effective_input + prefill_backlog) * self.prefill_per_token_ms;
        let ttft = self.overhead_ms + prefill + waiting * step;
        let decode = step + scale * input * self.per_context_token_ms;
        (ttft, decode / (1.0 - self.prefill_share(row)))
    }

    /// The profiled class's prediction (the module doc's second table).
    fn predict_profiled(&self, profile: &Profile, row: &Row) -> (f64, f64) {
        let f = |i: usize| f64::from(row[i]);
        let (input, waiting, running, prefill_backlog, effective_input, in_flight, tokens_in_flight) =
            (f(1), f(2), f(3), f(5), f(6), f(7), f(8));
        let batch = running.max(in_flight);
        let step = if batch > 0.0 { profile.tpot_ms(batch, tokens_in_flight / batch) } else { 0.0 };
        let prefill = effective_input + prefill_backlog;
        let chunks = (prefill / CHUNK_TOKENS).ceil().max(1.0);
        let ttft = profile.ttft_ms(prefill) + chunks * step + waiting * step;
        let decode = profile.tpot_ms(batch + 1.0, (tokens_in_flight + input) / (batch + 1.0));
        (ttft, decode / (1.0 - self.prefill_share(row)))
    }

    /// The share of the endpoint's time the prompts arriving there take, from its recent
    /// prefill rate (the module doc's `prefill`), within `0..=max_prefill_share`.
    pub fn prefill_share(&self, row: &Row) -> f64 {
        let rate = f64::from(row[PREFILL_TOKENS_PER_S]);
        let share = match self.profile(row[HARDWARE_CLASS] as usize) {
            Some(profile) => rate * profile.prefill_ms_per_token() / 1000.0,
            None => self.scale(row) * rate * self.per_batched_token_ms / 1000.0,
        };
        share.clamp(0.0, self.max_prefill_share)
    }

    /// What one uncached prompt token costs hardware class `class` to prefill (ms): the
    /// rate the prior's TTFT charges (its profile's, where it has one), which the pool drains
    /// its prefill backlog at (`pool::Pool::with_class_costs`), so the two cannot disagree.
    pub fn prefill_ms_per_token(&self, class: u32) -> f64 {
        match self.profile(class as usize) {
            Some(profile) => profile.prefill_ms_per_token(),
            None => self.class_scale(class as usize) * self.prefill_per_token_ms,
        }
    }

    /// Hardware class `class`'s fastest decode step (ms): one request alone on an idle
    /// engine, no prompts arriving. No TPOT can be kept under it there.
    pub fn fastest_tpot_ms(&self, class: u32) -> f64 {
        match self.profile(class as usize) {
            Some(profile) => profile.tpot_ms(1.0, 0.0),
            None => self.class_scale(class as usize) * (self.step_fixed_ms + self.weight_floor_ms),
        }
    }

    /// The measured profile of hardware class `class`, if it has one.
    fn profile(&self, class: usize) -> Option<&Profile> {
        self.profiles.get(class).and_then(Option::as_ref)
    }

    /// The engine-time factor of the row's hardware class.
    fn scale(&self, row: &Row) -> f64 {
        self.class_scale(row[HARDWARE_CLASS] as usize)
    }

    fn class_scale(&self, class: usize) -> f64 {
        self.hardware_scale.get(class).copied().unwrap_or(1.0)
    }
}
