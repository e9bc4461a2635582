//! The plugin configuration: parsed and validated once in `on_configure`,
//! then shared read-only with every request.

use headroom_protocol::health::EjectionPolicy;
use headroom_protocol::{headers, limits};
use serde::Deserialize;

use crate::prefix_load::PrefixLoadConfig;

/// How the positive tier is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Bin-pack: favour the endpoint with the least sufficient headroom, keeping slack elsewhere.
    Least,
    /// Spread: favour the endpoint with the most headroom.
    Most,
}

/// How requests that did not ask for SLO routing are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DefaultProfile {
    /// The lowest predicted latency (TTFT and TPOT weighted by `ttft_weight`).
    LowestLatency,
    /// The composite of free KV, relative queue and prefix match.
    Composite,
    /// llm-d's default: prefix-cache affinity filter, then token-load scorer
    /// (`prefix_load` holds its knobs; `crate::prefix_load`).
    PrefixLoad,
}

/// What happens to a stated SLO below its floor (`min_ttft_slo_ms`, `min_tpot_slo_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SloFloorAction {
    /// Raise it to the floor and route (the caller keeps its request).
    Clamp,
    /// Answer `400` naming the header.
    Reject,
}

/// Everything the filter can be told. Every field has a default, so `{}` is
/// a valid configuration; `docs/configuration.md` lists them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Pool name sent to the predictor (which endpoints to predict).
    pub pool: String,
    /// Envoy cluster of predictor-svc.
    pub predictor_cluster: String,
    /// Envoy clusters of several predictor replicas (overrides `predictor_cluster`): each
    /// pool is owned by one, chosen by rendezvous hashing, with failover (`shards` module).
    pub predictor_shards: Vec<String>,
    /// Wait for the request body (token count, prefix, `stream`, `max_tokens`) before
    /// routing. Needs `allow_on_headers_stop_iteration: true` in the Envoy Wasm config,
    /// which Istio's WasmPlugin cannot set: with a WasmPlugin use `false`, routing on
    /// headers alone (input tokens estimated from `content-length`).
    pub read_body: bool,
    /// Header-only routing: the most prompt bytes a request's `content-length` may claim.
    /// The claim sizes the request's own prediction only; what the predictor books for its
    /// endpoint waits until the body has passed and is what actually did (docs/reliability.md).
    /// Default 1 MiB: about 250,000 tokens of text, more than any served context.
    pub max_claimed_body_bytes: u64,
    /// `:authority` of predictor calls.
    pub predictor_authority: String,
    /// Give up on a predict call after this long and fall back.
    pub predictor_timeout_ms: u64,
    /// Dispatches and reports are sent in batches on this tick. It is also how late
    /// the predictor learns of a placement (and of a first token): until a dispatch
    /// arrives, requests predicted for the same endpoint do not see it. Measured on the
    /// simulator (docs/notebook/predictor.md, "What the state knows"): a 100 ms tick costs about
    /// 5 points of TTFT error against fresh state, 20 ms about 1.5; a batch is one call
    /// whatever its size, so a short tick costs calls only where traffic is light.
    pub flush_interval_ms: u64,
    /// Most items kept queued per VM while the predictor is unreachable;
    /// beyond it the oldest are dropped (and counted).
    pub max_queued: usize,
    /// Most items sent in one batch call.
    pub max_batch: usize,
    /// Largest encoded batch; larger ones are split, and an item larger alone is
    /// dropped and counted. At most the predictor's body limit (4 MiB).
    pub max_batch_bytes: usize,
    /// Sent as `authorization: Bearer <token>` on every predictor call; must match the
    /// predictor's `auth_token_file` / `HEADROOM_PREDICTOR_TOKEN` (`docs/reliability.md`).
    pub predictor_token: Option<String>,
    /// The environment variable the token is read from instead (`predictor_token` unset): a
    /// token in the plugin configuration is in every copy of it (Envoy's `/config_dump`, the
    /// WasmPlugin or EnvoyFilter spec), one in the gateway's environment is not. Envoy passes
    /// it to the VM when `vm_config.environment_variables.host_env_keys` names it, and the
    /// manifests set it in the gateway's container from the predictor's Secret.
    pub predictor_token_env: Option<String>,
    /// Lowest TTFT SLO honoured, ms. Bounds how far one caller's goal can tighten the
    /// targets the filter judges others by.
    pub min_ttft_slo_ms: f64,
    /// Lowest TPOT SLO honoured, ms. A TPOT SLO also tightens the target of every
    /// later request on the same endpoint (the tightest running one), so set it near
    /// the fastest decode your fleet delivers.
    pub min_tpot_slo_ms: f64,
    /// What a stated SLO below its floor gets: `clamp` (default) or `reject` (400).
    pub slo_floor_action: SloFloorAction,
    /// Header the proxy routes by (override_host / ORIGINAL_DST).
    pub destination_header: String,
    /// Request header giving the caller's priority (< 0: sheddable).
    pub priority_header: String,
    /// Request paths (exact, query ignored) whose body is parsed and routed.
    pub inference_paths: Vec<String>,
    /// Add `x-headroom-*` response headers (chosen endpoint, predictions, tier).
    pub debug_headers: bool,
    /// Report each routed request's first token as it passes (on the next tick), so the
    /// predictor sees the request past prefill when it happens, not when predicted.
    pub first_token_events: bool,
    /// Coalesce a worker's predict calls: while one is out, the requests that arrive go
    /// together in the next (`coalesce`, docs/performance.md). Off: one call per request.
    pub batch_predictions: bool,
    /// Send the coalesced batches on one gRPC stream per worker to the predictor (`stream`),
    /// HTTP calls while it is not open. Needs the predictor cluster to speak HTTP/2.
    pub predict_stream: bool,
    /// Endpoint state older than this is not used by the fallback.
    pub fallback_state_max_age_ms: u64,
    /// At most this many prefix blocks are hashed per request.
    pub max_prefix_blocks: usize,
    /// TPOT targets are `min(own SLO, tightest running) * tpot_buffer`.
    pub tpot_buffer: f64,
    /// TTFT targets are `SLO * ttft_buffer` (Llumnix's TTFT SLO dispatch threshold).
    pub ttft_buffer: f64,
    /// Probability of picking from the negative tier when both tiers exist.
    pub negative_tier_epsilon: f64,
    /// Weight of TTFT headroom in the score (TPOT gets `1 - ttft_weight`).
    pub ttft_weight: f64,
    /// Scoring within the positive tier.
    pub strategy: Strategy,
    /// Placement of requests without `x-prediction-based-scheduling: true`.
    pub default_profile: DefaultProfile,
    /// Knobs of the `prefix_load` default profile.
    pub prefix_load: PrefixLoadConfig,
    /// Extra endpoints listed after the chosen one in the destination header
    /// (`ip:port,ip:port,...`); override_host tries them on retry (a connect failure, a
    /// reset or a 5xx before any byte, as the route's `retry_on` allows).
    pub fallback_endpoints: usize,
    /// The largest request body read (bytes): a longer one is answered `413` naming `body`
    /// before it is buffered further. In Envoy the listener's buffer limit applies too (1 MiB
    /// unless raised: Envoy answers 413 itself past it); the endpoint picker buffers a body
    /// itself (`BUFFERED` and `FULL_DUPLEX_STREAMED` modes), and this is its bound.
    pub max_body_bytes: usize,
    /// How long one try may wait for its server's response to begin, as a multiple of the
    /// request's own goals: TTFT for a stream (whose headers come as it starts), TTFT plus
    /// `max_tokens` TPOTs for a whole answer. Set as Envoy's per-try timeout
    /// (`x-envoy-upstream-rq-per-try-timeout-ms`), so a hung server holds a request no longer
    /// than that before Envoy retries it on the next endpoint and passive health counts the
    /// failure. `0` leaves the route's own timeouts; a request without goals gets none.
    pub try_timeout_slo_factor: f64,
    /// The shortest per-try timeout set (ms): connection set-up and a busy host's jitter are
    /// no reason to give up on a server.
    pub try_timeout_min_ms: u64,
    /// The most sequences one request may ask (its prompts times `max(n, best_of)`): more
    /// are answered `400` naming `n`. Each is booked as load on its endpoint.
    pub max_sequences: u32,
    /// When an endpoint that fails requests is ejected from this VM's choices, whatever
    /// its metrics say (`headroom_protocol::health`); `consecutive_failures: 0` turns it off.
    pub passive_health: EjectionPolicy,
    /// Prefix match at or above which an endpoint is strictly preferred.
    pub prefix_strict_threshold: f64,
    /// Prefix match at or above which an endpoint is preferred in a second pass.
    pub prefix_loose_threshold: f64,
    /// Affinity is ignored when the best prefix-matching endpoint's predicted TTFT
    /// is worse than the best other's by more than this (ms).
    pub prefix_ttft_penalty_ms: f64,
    /// Probability of skipping prefix affinity for one request (exploration).
    pub prefix_explore_epsilon: f64,
    /// An endpoint under this KV usage counts as cold (can absorb a sheddable request).
    pub cold_kv_usage: f64,
    /// `retry-after` seconds sent with a 429.
    pub shed_retry_after_s: u32,
    /// Responses larger than this are not parsed for usage (non-streaming).
    pub max_response_parse_bytes: usize,
    /// Flow control (docs/flow-control.md): an SLO-routed request that no endpoint has
    /// headroom for waits in the predictor's queue, ordered by priority and deadline,
    /// instead of joining a server's FIFO queue. The predictor's `[flow]` bounds it.
    pub flow_control: bool,
    /// The longest a request waits in that queue (ms); the predictor call's timeout is
    /// this plus `predictor_timeout_ms`.
    pub flow_max_wait_ms: u64,
    /// Header naming a request's tenant: within a priority band, tenants take turns.
    pub fairness_header: String,
    /// The priorities a client may claim in `priority_header`, lowest and highest: a claim
    /// outside is held to the range (and counted). With flow control a band above blocks every
    /// band below it, so the default lets a client lower its own priority (`-1`: sheddable)
    /// but not raise it over anyone's; a higher priority comes from `trusted_priority_header`.
    pub client_priority_range: [i32; 2],
    /// A header that a trusted filter ahead of this one sets (an auth filter, from a verified
    /// token) with the request's priority: when configured and present, the priority is taken
    /// from it, unclamped, and the client's `priority_header` is ignored. Envoy must strip a
    /// client's own copy first (docs/reliability.md, "What a client's headers can do").
    pub trusted_priority_header: Option<String>,
    /// The pool's InferenceObjectives, name to `spec.priority` (unset there: 0): a request
    /// naming one in `x-llm-d-inference-objective` (or the older `x-gateway-inference-objective`)
    /// gets its priority, unclamped, over its own `priority_header` claim; a name not listed
    /// falls back to that claim. Any client may name any objective, as in llm-d's router:
    /// where that matters, a trusted filter ahead sets the header (or `trusted_priority_header`,
    /// which wins over both).
    pub objectives: std::collections::BTreeMap<String, i32>,
    /// Model name (the body's `model`) to the predictor pool that serves it, so one gateway
    /// fronts several models: a request for a listed model is predicted, placed and
    /// reported in that pool, any other in `pool`. The gateway's cluster (or InferencePool)
    /// must hold every mapped pool's endpoints. Needs the body (`read_body`), and one
    /// predictor (not `predictor_shards`, which place a pool on a replica by its name).
    pub model_pools: std::collections::BTreeMap<String, String>,
    /// The same for the tenant: when configured, the tenant is taken from this header only
    /// (absent: the shared anonymous tenant), never from the client's `fairness_header`.
    pub trusted_fairness_header: Option<String>,
    /// A request with room still waits while the queue ahead of it (its predicted TTFT less
    /// its own on the idle server) is above this (ms) at every endpoint with room, and then
    /// goes only where it is not, unless its own SLO is about to run out: model servers'
    /// queues stay this short, so later, tighter requests find room instead of looser work
    /// ahead of them.
    /// About a third of the tightest TTFT SLO served (docs/flow-control.md).
    pub flow_dispatch_horizon_ms: u64,
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            pool: "default".into(),
            predictor_cluster: "headroom_predictor".into(),
            predictor_shards: Vec::new(),
            read_body: true,
            max_claimed_body_bytes: 1 << 20,
            predictor_authority: "headroom-predictor".into(),
            predictor_timeout_ms: 50,
            flush_interval_ms: 20,
            max_queued: 10_000,
            max_batch: 500,
            max_batch_bytes: 1 << 20,
            predictor_token: None,
            predictor_token_env: None,
            min_ttft_slo_ms: 10.0,
            min_tpot_slo_ms: 5.0,
            slo_floor_action: SloFloorAction::Clamp,
            destination_header: headers::DESTINATION.into(),
            priority_header: headers::PRIORITY.into(),
            inference_paths: vec!["/v1/completions".into(), "/v1/chat/completions".into(), "/v1/responses".into()],
            debug_headers: false,
            first_token_events: true,
            batch_predictions: true,
            predict_stream: true,
            fallback_state_max_age_ms: 5_000,
            max_prefix_blocks: 256,
            tpot_buffer: 1.0,
            ttft_buffer: 1.0,
            negative_tier_epsilon: 0.01,
            ttft_weight: 0.8,
            // Spreading: measured better than bin-packing on every mixed workload (docs/benchmark.md).
            strategy: Strategy::Most,
            default_profile: DefaultProfile::LowestLatency,
            prefix_load: PrefixLoadConfig::default(),
            // Two more: a failing choice is retried on the next best, not by round robin.
            fallback_endpoints: 2,
            passive_health: EjectionPolicy::default(),
            // Past any long-context prompt as text (128k tokens are ~512 KiB), short of what
            // lets one client hold much of a picker's memory.
            max_body_bytes: 4 << 20,
            // A request three times past its goal before its answer began has missed it; the
            // retry elsewhere still may not.
            try_timeout_slo_factor: 3.0,
            try_timeout_min_ms: 1000,
            // vLLM's default batch (`max_num_seqs`): a request asking more cannot run at once
            // on any engine.
            max_sequences: 256,
            prefix_strict_threshold: 0.99,
            prefix_loose_threshold: 0.80,
            prefix_ttft_penalty_ms: 5000.0,
            prefix_explore_epsilon: 0.01,
            cold_kv_usage: 0.02,
            shed_retry_after_s: 1,
            max_response_parse_bytes: 1 << 20,
            // With the predictor's p90 objective, the benchmark's best router: it kept critical
            // traffic 1.41x further than the best baseline (docs/bench/report.md, hetero).
            flow_control: true,
            flow_max_wait_ms: 10_000,
            fairness_header: headers::FAIRNESS_ID.into(),
            flow_dispatch_horizon_ms: 150,
            client_priority_range: [-1, 0],
            trusted_priority_header: None,
            objectives: std::collections::BTreeMap::new(),
            model_pools: std::collections::BTreeMap::new(),
            trusted_fairness_header: None,
        }
    }
}

/// A configuration refused, naming the field at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid plugin configuration: field `{}`: {}", self.field, self.message)
    }
}

fn bad(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { field: field.into(), message: message.into() }
}

impl FilterConfig {
    /// The factors on a request's SLOs headroom is judged against.
    pub fn slo_buffers(&self) -> headroom_protocol::headroom::SloBuffers {
        headroom_protocol::headroom::SloBuffers { ttft: self.ttft_buffer, tpot: self.tpot_buffer }
    }

    /// What is accepted but should be changed, one message each, logged at configuration.
    /// The manifests' placeholder token is one: the predictor refuses to start with it, so
    /// it can never authenticate; refusing it here as well would make Envoy refuse the
    /// shipped manifests, which carry it for the user to replace.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.predictor_token.as_deref().is_some_and(|t| t.starts_with("change-me")) {
            out.push("predictor_token is the manifests' placeholder: set the token the predictor has".to_string());
        }
        out
    }

    /// Parses and validates the plugin configuration (empty means defaults).
    pub fn parse(bytes: &[u8]) -> Result<FilterConfig, ConfigError> {
        FilterConfig::parse_in(bytes, |_| None)
    }

    /// [`FilterConfig::parse`] with the process's environment as `env` (a name's value):
    /// where `predictor_token_env` finds the token.
    pub fn parse_in(bytes: &[u8], env: impl Fn(&str) -> Option<String>) -> Result<FilterConfig, ConfigError> {
        let mut config: FilterConfig = if bytes.iter().all(u8::is_ascii_whitespace) {
            FilterConfig::default()
        } else {
            let mut de = serde_json::Deserializer::from_slice(bytes);
            serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let message = e.inner().to_string();
                let field = match e.path().to_string().as_str() {
                    "." | "?" | "" => field_of_serde_error(&message),
                    path => path.to_string(),
                };
                bad(&field, message)
            })?
        };
        if let Some(name) = &config.predictor_token_env {
            if config.predictor_token.is_some() {
                return Err(bad("predictor_token_env", "set predictor_token or predictor_token_env, not both"));
            }
            if name.is_empty() || name.len() > 256 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(bad("predictor_token_env", "must be an environment variable's name ([A-Za-z0-9_]+)"));
            }
            let Some(token) = env(name).map(|t| t.trim().to_string()).filter(|t| !t.is_empty()) else {
                let why = format!(
                    "{name} is not set in the filter's environment (name it in the Wasm VM's \
                     vm_config.environment_variables.host_env_keys, and set it in the gateway's)"
                );
                return Err(bad("predictor_token_env", why));
            };
            config.predictor_token = Some(token);
        }
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let non_empty = [
            ("pool", &self.pool),
            ("predictor_cluster", &self.predictor_cluster),
            ("predictor_authority", &self.predictor_authority),
            ("destination_header", &self.destination_header),
            ("priority_header", &self.priority_header),
            ("fairness_header", &self.fairness_header),
        ];
        for (field, value) in non_empty {
            if value.trim().is_empty() {
                return Err(bad(field, "must not be empty"));
            }
        }
        for (field, value) in [
            ("destination_header", &self.destination_header),
            ("priority_header", &self.priority_header),
            ("fairness_header", &self.fairness_header),
        ] {
            if value.chars().any(|c| c.is_ascii_uppercase() || c.is_whitespace()) {
                return Err(bad(field, "header names must be lower case with no spaces"));
            }
        }
        if self.predictor_shards.iter().any(|c| c.trim().is_empty()) {
            return Err(bad("predictor_shards", "cluster names must not be empty"));
        }
        for (field, value) in [
            ("trusted_priority_header", &self.trusted_priority_header),
            ("trusted_fairness_header", &self.trusted_fairness_header),
        ] {
            if value
                .as_ref()
                .is_some_and(|v| v.is_empty() || v.chars().any(|c| c.is_ascii_uppercase() || c.is_whitespace()))
            {
                return Err(bad(field, "header names must be non-empty, lower case with no spaces"));
            }
        }
        if let Some(name) = self.objectives.keys().find(|n| n.is_empty() || n.len() > limits::MAX_NAME_BYTES) {
            let max = limits::MAX_NAME_BYTES;
            return Err(bad("objectives", format!("objective names must be 1..={max} bytes, got {name:?}")));
        }
        let max = limits::MAX_NAME_BYTES;
        let bad_name = |n: &String| n.trim().is_empty() || n.len() > max;
        if let Some((model, pool)) = self.model_pools.iter().find(|(m, p)| bad_name(m) || bad_name(p)) {
            return Err(bad(
                "model_pools",
                format!("model and pool names must be 1..={max} bytes, got {model:?} = {pool:?}"),
            ));
        }
        if !self.model_pools.is_empty() && !self.predictor_shards.is_empty() {
            return Err(bad("model_pools", "cannot be used with predictor_shards (a shard owns a pool by its name)"));
        }
        if !self.model_pools.is_empty() && !self.read_body {
            return Err(bad("model_pools", "needs read_body: the model is in the body"));
        }
        let [lowest, highest] = self.client_priority_range;
        if lowest > highest {
            return Err(bad("client_priority_range", "must be [lowest, highest] with lowest <= highest"));
        }
        let mut seen = std::collections::BTreeSet::new();
        if !self.predictor_shards.iter().all(|c| seen.insert(c)) {
            return Err(bad("predictor_shards", "a cluster is listed twice"));
        }
        if !(1..=60_000).contains(&self.predictor_timeout_ms) {
            return Err(bad("predictor_timeout_ms", "must be within 1..=60000"));
        }
        if !(10..=60_000).contains(&self.flush_interval_ms) {
            return Err(bad("flush_interval_ms", "must be within 10..=60000"));
        }
        if !(1024..=1 << 30).contains(&self.max_claimed_body_bytes) {
            return Err(bad("max_claimed_body_bytes", "must be within 1024..=1073741824"));
        }
        if self.max_queued == 0 {
            return Err(bad("max_queued", "must be at least 1"));
        }
        if self.max_batch == 0 {
            return Err(bad("max_batch", "must be at least 1"));
        }
        if !(1024..=limits::MAX_BODY_BYTES).contains(&self.max_batch_bytes) {
            return Err(bad("max_batch_bytes", format!("must be within 1024..={}", limits::MAX_BODY_BYTES)));
        }
        if let Some(token) = &self.predictor_token {
            if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad("predictor_token", "must be at least 16 visible ASCII characters"));
            }
        }
        for (field, value) in [("min_ttft_slo_ms", self.min_ttft_slo_ms), ("min_tpot_slo_ms", self.min_tpot_slo_ms)] {
            if !(value.is_finite() && (0.0..=limits::MAX_MS).contains(&value)) {
                return Err(bad(field, format!("must be a number of milliseconds within 0..={}", limits::MAX_MS)));
            }
        }
        if self.inference_paths.iter().any(|p| !p.starts_with('/')) {
            return Err(bad("inference_paths", "every path must start with '/'"));
        }
        for (field, b) in [("tpot_buffer", self.tpot_buffer), ("ttft_buffer", self.ttft_buffer)] {
            if !(b.is_finite() && (limits::MIN_SLO_BUFFER..=limits::MAX_SLO_BUFFER).contains(&b)) {
                let (lo, hi) = (limits::MIN_SLO_BUFFER, limits::MAX_SLO_BUFFER);
                return Err(bad(field, format!("must be within {lo}..={hi}")));
            }
        }
        if !(1..=600_000).contains(&self.flow_max_wait_ms) {
            return Err(bad("flow_max_wait_ms", "must be within 1..=600000"));
        }
        if !(1..=600_000).contains(&self.flow_dispatch_horizon_ms) {
            return Err(bad("flow_dispatch_horizon_ms", "must be within 1..=600000"));
        }
        if !(0.0..=1.0).contains(&self.negative_tier_epsilon) {
            return Err(bad("negative_tier_epsilon", "must be within 0..=1"));
        }
        let unit_fields = [
            ("ttft_weight", self.ttft_weight),
            ("prefix_strict_threshold", self.prefix_strict_threshold),
            ("prefix_loose_threshold", self.prefix_loose_threshold),
            ("prefix_explore_epsilon", self.prefix_explore_epsilon),
            ("cold_kv_usage", self.cold_kv_usage),
        ];
        for (field, value) in unit_fields {
            if !(0.0..=1.0).contains(&value) {
                return Err(bad(field, "must be within 0..=1"));
            }
        }
        if self.prefix_loose_threshold > self.prefix_strict_threshold {
            return Err(bad("prefix_loose_threshold", "must not exceed prefix_strict_threshold"));
        }
        if !(self.prefix_ttft_penalty_ms.is_finite() && self.prefix_ttft_penalty_ms >= 0.0) {
            return Err(bad("prefix_ttft_penalty_ms", "must be a number >= 0"));
        }
        if self.max_prefix_blocks > limits::MAX_PREFIX_HASHES {
            return Err(bad("max_prefix_blocks", format!("must be at most {}", limits::MAX_PREFIX_HASHES)));
        }
        if let Some((field, why)) = self.prefix_load.invalid() {
            return Err(bad(field, why));
        }
        if self.fallback_endpoints > 16 {
            return Err(bad("fallback_endpoints", "must be within 0..=16"));
        }
        if !(1024..=(256 << 20)).contains(&self.max_body_bytes) {
            return Err(bad("max_body_bytes", "must be within 1024..=268435456"));
        }
        if let Some((field, why)) = self.passive_health.invalid() {
            return Err(bad(field, why));
        }
        if !(self.try_timeout_slo_factor.is_finite() && (0.0..=100.0).contains(&self.try_timeout_slo_factor)) {
            return Err(bad("try_timeout_slo_factor", "must be within 0..=100"));
        }
        if !(1..=limits::MAX_SEQUENCES).contains(&self.max_sequences) {
            return Err(bad("max_sequences", format!("must be within 1..={}", limits::MAX_SEQUENCES)));
        }
        if !(10..=3_600_000).contains(&self.try_timeout_min_ms) {
            return Err(bad("try_timeout_min_ms", "must be within 10..=3600000"));
        }
        Ok(())
    }

    /// The predictor clusters: `predictor_shards`, or else `predictor_cluster` alone.
    pub fn predictor_clusters(&self) -> Vec<String> {
        if self.predictor_shards.is_empty() {
            vec![self.predictor_cluster.clone()]
        } else {
            self.predictor_shards.clone()
        }
    }

    /// True when `path` (query string ignored) is an inference path, after the
    /// normalisation a server applies: percent-decoding of unreserved characters,
    /// repeated slashes merged, a trailing slash dropped. Otherwise
    /// `//v1/completions` or `/v1/%63ompletions` would reach the model server
    /// unrouted, and unmetered.
    pub fn is_inference_path(&self, path: &str) -> bool {
        let path = normalize_path(path.split('?').next().unwrap_or(path));
        self.inference_paths.contains(&path)
    }
}

/// `path` with unreserved percent-escapes decoded (RFC 3986 section 6.2.2.2),
/// `//` merged, `.` and `..` segments resolved and a trailing slash removed.
pub fn normalize_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .filter(|c| c.is_ascii_alphanumeric() || b"-._~".contains(c));
        match escape {
            Some(c) => {
                decoded.push(c);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/"))
}

/// At the top level serde names an unknown or missing field only in its
/// message ("unknown field `x`"); pull out the name when it is there.
fn field_of_serde_error(message: &str) -> String {
    message
        .split('`')
        .nth(1)
        .filter(|name| !name.is_empty())
        .filter(|_| message.starts_with("unknown field") || message.starts_with("missing field"))
        .unwrap_or("(configuration)")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn empty_is_defaults() {
        assert_eq!(FilterConfig::parse(b"").unwrap(), FilterConfig::default());
        assert_eq!(FilterConfig::parse(b"{}").unwrap(), FilterConfig::default());
    }

    #[test]
    fn fields_override_defaults() {
        let c = FilterConfig::parse(br#"{"pool":"llama","debug_headers":true,"predictor_timeout_ms":20}"#).unwrap();
        assert_eq!(c.pool, "llama");
        assert!(c.debug_headers);
        assert_eq!(c.predictor_timeout_ms, 20);
    }

    #[test]
    fn the_placeholder_token_is_accepted_with_a_warning() {
        let config =
            FilterConfig::parse(br#"{"predictor_token":"change-me-generate-with-openssl-rand-hex-32"}"#).unwrap();
        assert_eq!(config.warnings().len(), 1);
        assert!(FilterConfig::default().warnings().is_empty());
    }

    /// The token can come from the gateway's environment, so that no copy of the plugin
    /// configuration (Envoy's `/config_dump`, a WasmPlugin spec) holds it.
    #[test]
    fn the_token_is_read_from_the_named_environment_variable() {
        let env = |name: &str| (name == "HEADROOM_PREDICTOR_TOKEN").then(|| " 0123456789abcdef-token\n".to_string());
        let config = FilterConfig::parse_in(br#"{"predictor_token_env":"HEADROOM_PREDICTOR_TOKEN"}"#, env).unwrap();
        assert_eq!(config.predictor_token.as_deref(), Some("0123456789abcdef-token"));
        let short =
            FilterConfig::parse_in(br#"{"predictor_token_env":"HEADROOM_PREDICTOR_TOKEN"}"#, |_| Some("short".into()));
        assert_eq!(short.unwrap_err().field, "predictor_token", "held to the token's own rule");
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"pool":""}"#, "pool"),
            (br#"{"predictor_timeout_ms":0}"#, "predictor_timeout_ms"),
            (br#"{"flush_interval_ms":1}"#, "flush_interval_ms"),
            (br#"{"no_such_knob":1}"#, "no_such_knob"),
            (br#"{"negative_tier_epsilon":2}"#, "negative_tier_epsilon"),
            (br#"{"destination_header":"X-Dest"}"#, "destination_header"),
            (br#"{"inference_paths":["v1/x"]}"#, "inference_paths"),
            (br#"{"tpot_buffer":-1}"#, "tpot_buffer"),
            (br#"{"tpot_buffer":50}"#, "tpot_buffer"),
            (br#"{"ttft_buffer":0}"#, "ttft_buffer"),
            (br#"{"flow_max_wait_ms":0}"#, "flow_max_wait_ms"),
            (br#"{"flow_dispatch_horizon_ms":0}"#, "flow_dispatch_horizon_ms"),
            (br#"{"fairness_header":"X-Tenant"}"#, "fairness_header"),
            (br#"{"strategy":"random"}"#, "strategy"),
            (br#"{"predictor_timeout_ms":"fast"}"#, "predictor_timeout_ms"),
            (br#"{"prefix_loose_threshold":0.995}"#, "prefix_loose_threshold"),
            (br#"{"prefix_ttft_penalty_ms":-1}"#, "prefix_ttft_penalty_ms"),
            (br#"{"cold_kv_usage":1.5}"#, "cold_kv_usage"),
            (br#"{"fallback_endpoints":99}"#, "fallback_endpoints"),
            (br#"{"try_timeout_slo_factor":-1}"#, "try_timeout_slo_factor"),
            (br#"{"try_timeout_min_ms":0}"#, "try_timeout_min_ms"),
            (br#"{"max_sequences":0}"#, "max_sequences"),
            (br#"{"predictor_token_env":"NOT SET"}"#, "predictor_token_env"),
            (br#"{"predictor_token_env":"UNSET_IN_TESTS_7F3A"}"#, "predictor_token_env"),
            (br#"{"predictor_token_env":"X","predictor_token":"0123456789abcdef"}"#, "predictor_token_env"),
            (br#"{"predictor_shards":["a","a"]}"#, "predictor_shards"),
            (br#"{"predictor_shards":[""]}"#, "predictor_shards"),
            (br#"{"":0}"#, "(configuration)"),
            (br#"{"read_body":"no"}"#, "read_body"),
            (br#"{"client_priority_range":[1,-1]}"#, "client_priority_range"),
            (br#"{"model_pools":{"m":""}}"#, "model_pools"),
            (br#"{"model_pools":{"m":"p"},"predictor_shards":["a","b"]}"#, "model_pools"),
            (br#"{"model_pools":{"m":"p"},"read_body":false}"#, "model_pools"),
            (br#"{"objectives":{"":1}}"#, "objectives"),
            (br#"{"objectives":{"a":1.5}}"#, "objectives.a"),
            (br#"{"trusted_priority_header":"X-Auth"}"#, "trusted_priority_header"),
            (br#"{"trusted_fairness_header":""}"#, "trusted_fairness_header"),
            (br#"{"max_claimed_body_bytes":10}"#, "max_claimed_body_bytes"),
            (br#"{"max_batch_bytes":100}"#, "max_batch_bytes"),
            (br#"{"max_batch_bytes":99999999}"#, "max_batch_bytes"),
            (br#"{"predictor_token":"short"}"#, "predictor_token"),
            (br#"{"min_tpot_slo_ms":-1}"#, "min_tpot_slo_ms"),
            (br#"{"slo_floor_action":"ignore"}"#, "slo_floor_action"),
            (br#"{"prefix_load":{"affinity_threshold":2}}"#, "prefix_load.affinity_threshold"),
            (br#"{"prefix_load":{"peak_prefill_tokens_per_s":0}}"#, "prefix_load.peak_prefill_tokens_per_s"),
            (br#"{"prefix_load":{"tau":1}}"#, "prefix_load.tau"),
            (br#"{"default_profile":"llm-d"}"#, "default_profile"),
        ];
        for (json, field) in cases {
            let err = FilterConfig::parse(json).unwrap_err();
            assert_eq!(err.field, *field, "{}", String::from_utf8_lossy(json));
        }
        assert!(FilterConfig::parse(b"{not json").is_err());
    }

    #[test]
    fn shards_override_the_single_cluster() {
        assert_eq!(FilterConfig::default().predictor_clusters(), ["headroom_predictor"]);
        let c = FilterConfig::parse(br#"{"predictor_shards":["p0","p1"]}"#).unwrap();
        assert_eq!(c.predictor_clusters(), ["p0", "p1"]);
    }

    #[test]
    fn inference_path_ignores_query() {
        let c = FilterConfig::default();
        assert!(c.is_inference_path("/v1/completions?x=1"));
        assert!(c.is_inference_path("/v1/chat/completions"));
        assert!(!c.is_inference_path("/v1/models"));
    }

    #[test]
    fn paths_that_differ_only_by_normalisation_are_routed() {
        let c = FilterConfig::default();
        for path in [
            "/v1/completions/",
            "//v1/completions",
            "/v1//chat/completions",
            "/v1/%63ompletions",
            "/v1/%63%6F%6d%70letions?stream=1",
            "/./v1/completions",
            "/v1/../v1/completions",
        ] {
            assert!(c.is_inference_path(path), "{path}");
        }
        for path in ["/v1/completion", "/v1/completions%2F", "/v2/completions", "/v1/x/../../completions"] {
            assert!(!c.is_inference_path(path), "{path}");
        }
    }
}
