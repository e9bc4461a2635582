//! predictor-svc configuration (TOML), a leaf crate: the service, and tools that
//! check a configuration before it ships (`headroom-deploy-check`), parse it here.
//!
//! ```toml
//! listen = "127.0.0.1:9000"
//! [[pool]]
//! name = "default"
//! endpoints = ["127.0.0.1:8001", "127.0.0.1:8002"]
//!
//! [[pool]]
//! name = "llama"
//! [[pool.kubernetes]]          # endpoints from EndpointSlices, watched
//! namespace = "llm"
//! selector = "kubernetes.io/service-name=vllm-llama"
//! hardware = "h100"
//!
//! [[pool]]
//! name = "qwen"
//! [[pool.inference_pool]]      # endpoints from an InferencePool's pods, watched
//! namespace = "llm"
//! name = "vllm-qwen"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod callers;
pub mod engine;
pub mod profile;
pub use profile::Profile;

/// What a model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Objective {
    /// The mean (L2 in log space).
    Mean,
    /// The `q` quantile, e.g. 0.9.
    Quantile { q: f64 },
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP API listens on.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// How often each endpoint's `/metrics` is scraped.
    #[serde(default = "default_scrape_interval_ms")]
    pub scrape_interval_ms: u64,
    /// A scrape slower than this counts as failed.
    #[serde(default = "default_scrape_timeout_ms")]
    pub scrape_timeout_ms: u64,
    /// Metrics older than this make an endpoint's predictions unknown.
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// A dispatched request never reported is forgotten after this long at most.
    #[serde(default = "default_in_flight_ttl_s")]
    pub in_flight_ttl_s: u64,
    /// A dispatched request with a predicted end-to-end time (TTFT + TPOT x `max_tokens`)
    /// is forgotten sooner: after this multiple of it, but not before `in_flight_min_s`.
    /// A report that went to another predictor replica (a rollout's overlap, a failover)
    /// then inflates this replica's books for seconds, not `in_flight_ttl_s`.
    #[serde(default = "default_in_flight_expiry_multiple")]
    pub in_flight_expiry_multiple: f64,
    /// The least time a request with a predicted end is tracked for.
    #[serde(default = "default_in_flight_min_s")]
    pub in_flight_min_s: u64,
    /// Prefix blocks remembered per endpoint (LRU).
    #[serde(default = "default_prefix_blocks")]
    pub prefix_blocks_per_endpoint: usize,
    /// Observations kept in memory for `GET /v1/observations` (at most 100000;
    /// each is under 2 KiB once validated, so the log stays under 200 MiB).
    #[serde(default = "default_observations_kept")]
    pub observations_kept: usize,
    /// Requests tracked in flight per pool; a dispatch beyond it is refused and counted
    /// (`headroom_dispatches{result="pool_full"}`), so a flood cannot grow memory.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Largest `/metrics` body read from a model server; a larger one is a failed scrape.
    #[serde(default = "default_max_scrape_bytes")]
    pub max_scrape_bytes: usize,
    /// File holding the shared token that `/v1/predict`, `/v1/dispatch`, `/v1/report`,
    /// `/v1/observations` and model downloads require (`authorization: Bearer <token>`).
    /// The environment variable `HEADROOM_PREDICTOR_TOKEN`, when set, takes precedence.
    /// Neither: those routes are open (trusted network only; `docs/reliability.md`).
    #[serde(default)]
    pub auth_token_file: Option<PathBuf>,
    /// File naming each caller (gateway) and its tokens, one `name token` per line
    /// (`callers.rs`); read again when it changes. Its tokens work beside the single one above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callers_file: Option<PathBuf>,
    /// What one caller may do, whichever token it presents.
    #[serde(default)]
    pub callers: callers::CallerQuotas,
    #[serde(rename = "pool")]
    pub pools: Vec<PoolConfig>,
    /// Engines beyond the built-in ones (or replacing one of the same name): which series a
    /// pool's `engine` reads (`engine.rs`).
    #[serde(default, rename = "engine", skip_serializing_if = "Vec::is_empty")]
    pub engines: Vec<engine::EngineConfig>,
    /// Latency models: training, persistence, or a user-supplied model.
    #[serde(default)]
    pub model: ModelConfig,
    /// How to reach the Kubernetes API (pools with `[[pool.kubernetes]]` or `[[pool.inference_pool]]` sources).
    #[serde(default)]
    pub kubernetes: KubernetesConfig,
    /// Bounds of the flow-control queue (used when the filter sets `flow_control`).
    #[serde(default)]
    pub flow: FlowConfig,
    /// When an endpoint whose requests fail (as the gateways report them) gets no prediction,
    /// and so no traffic routed by one, however idle its metrics look
    /// (`headroom_protocol::health`); `consecutive_failures = 0` turns it off.
    #[serde(default)]
    pub passive_health: headroom_protocol::health::EjectionPolicy,
}

/// The `[flow]` section: the queue requests wait in when no endpoint has headroom for
/// them (docs/flow-control.md). The filter asks to wait (`flow_control`); these bound it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlowConfig {
    /// Requests waiting at once per pool, all priority bands together. Beyond it a request
    /// is placed as without flow control (`queue_full`), never dropped.
    pub max_queued: usize,
    /// Requests waiting at once per pool and priority band.
    pub max_queued_per_band: usize,
    /// The longest any request waits, whatever the filter offers (ms).
    pub max_wait_ms: u64,
    /// How often waiting requests are judged again when no report, first token or scrape
    /// woke them (ms); their deadlines are checked as often.
    pub recheck_interval_ms: u64,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig { max_queued: 1000, max_queued_per_band: 500, max_wait_ms: 60_000, recheck_interval_ms: 20 }
    }
}

/// The `[kubernetes]` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// API server URL. Default: the in-cluster service account, else `KUBECONFIG` / `~/.kube/config`.
    pub api_server: Option<String>,
}

/// Endpoints of a pool discovered from Kubernetes EndpointSlices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSource {
    pub namespace: String,
    /// Label selector on the EndpointSlices, e.g. `kubernetes.io/service-name=vllm`.
    pub selector: String,
    /// Use this port number on every address.
    pub port: Option<u16>,
    /// Else the slice port of this name. Else the slice's only port.
    pub port_name: Option<String>,
    /// Hardware class of these endpoints (a model feature), e.g. `h100`.
    pub hardware: Option<String>,
}

/// Endpoints of a pool discovered from a Gateway API Inference Extension `InferencePool`
/// (`inference.networking.k8s.io/v1`): the ready pods its `spec.selector` matches, on each
/// of its `spec.targetPorts`, followed as the pool object and its pods change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferencePoolSource {
    pub namespace: String,
    /// The InferencePool's name.
    pub name: String,
    /// Hardware class of these endpoints (a model feature), e.g. `h100`.
    pub hardware: Option<String>,
}

/// The `[model]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Models and samples persist here (none: in memory only).
    pub data_dir: Option<PathBuf>,
    /// `mean` or `p90`.
    pub objective: String,
    /// How often to consider retraining.
    pub retrain_interval_ms: u64,
    /// Samples needed per target before the first model.
    pub min_samples: usize,
    /// New samples needed since the last training.
    pub min_new_samples: usize,
    /// Newest samples kept per stratification bucket.
    pub bucket_cap: usize,
    /// Share of request ids held out for validation, in percent.
    pub holdout_percent: u64,
    /// A new model is discarded if its held-out error exceeds the active one's by this fraction.
    pub keep_margin: f64,
    pub trees: usize,
    pub max_depth: usize,
    pub learning_rate: f64,
    /// Model versions kept for `GET /v1/models`.
    pub keep_versions: usize,
    /// Use this ONNX model (features[N,14] -> latency_ms[N,2]) instead of training online.
    pub model_path: Option<PathBuf>,
    /// `false`: no model is trained (nor restored from `data_dir`); the analytic prior
    /// serves throughout, with the live correction. With `true` the prior still takes a
    /// target from a trained model that live reports show worse (`model::duel`): past a
    /// fleet's cliff, models refitted every few seconds on the newest reports swung 2-10x
    /// against what requests measured, where the prior, which reads the endpoint's load,
    /// held (docs/notebook/predictor.md, "Trained models past the cliff").
    pub train: bool,
    /// The ONNX Runtime library (default: `ORT_DYLIB_PATH`, then the project's `.venv`).
    pub onnxruntime_library: Option<PathBuf>,
    /// Trees learn the residual of the analytic prior (`log(actual) - log(prior)`),
    /// which keeps the prior's shape where samples have not been yet; `false` learns
    /// the latency from scratch (the behaviour before, kept to compare).
    pub residual: bool,
    /// Step of the live correction of served predictions per observed request, in log
    /// space (`model::calibration`): holds p90 coverage at 90%, keeps mean predictions
    /// median-unbiased. 0 turns it off.
    pub calibration_rate: f64,
    /// Drift: when the active model's error over the last 100 observations passes
    /// this many times the active model's held-out error (either target), the next
    /// training round starts at once, weights recent samples and is judged on recent
    /// held-out ones. 0 turns drift handling off.
    pub drift_factor: f64,
    /// How many times slower than the prior's calibration GPU (H100) each hardware
    /// class runs its prefill, e.g. `{ a100 = 2.7 }`: the analytic prior's, before a model
    /// trains and wherever it contends with one (docs/configuration.md).
    pub prior_hardware_scale: BTreeMap<String, f64>,
    /// Measured profiles per hardware class (`headroom-profile`, or Llumnix's files), e.g.
    /// `{ cpu = { ttft = "cpu-ttft.json", tpot = "cpu-tpot.json" } }`: the prior takes that
    /// class's costs from them, in place of the analytic formula's (`profile`). Paths, like every
    /// path of this file, are relative to the service's working directory.
    pub prior_profiles: BTreeMap<String, ProfilePaths>,
}

/// The two files of a hardware class's profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilePaths {
    /// TTFT by prompt tokens.
    pub ttft: PathBuf,
    /// TPOT by batch size and context.
    pub tpot: PathBuf,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            data_dir: None,
            // With the filter's flow control, the benchmark's best router (docs/configuration.md,
            // "Profiles"); `mean` is the `predicted` profile's.
            objective: "p90".into(),
            retrain_interval_ms: 5000,
            min_samples: 200,
            min_new_samples: 50,
            bucket_cap: 500,
            holdout_percent: 10,
            keep_margin: 0.1,
            // 60 trees per target keeps 64 candidates under 250 us in ORT (docs/predictor.md).
            trees: 60,
            max_depth: 6,
            learning_rate: 0.15,
            keep_versions: 5,
            model_path: None,
            train: true,
            onnxruntime_library: None,
            prior_hardware_scale: BTreeMap::new(),
            prior_profiles: BTreeMap::new(),
            residual: true,
            calibration_rate: 0.01,
            drift_factor: 1.5,
        }
    }
}

impl ModelConfig {
    /// The training objective (validated at load).
    pub fn objective(&self) -> Objective {
        match self.objective.as_str() {
            "p90" => Objective::Quantile { q: 0.9 },
            _ => Objective::Mean,
        }
    }
}

/// One pool of interchangeable model servers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// `ip:port` of each model server (static list).
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// EndpointSlice sources, watched; their ready endpoints join the static ones.
    #[serde(default)]
    pub kubernetes: Vec<KubernetesSource>,
    /// InferencePool sources, watched; their ready pods join the others.
    #[serde(default)]
    pub inference_pool: Vec<InferencePoolSource>,
    /// Hardware class of endpoints, e.g. `{"10.0.0.12:8000" = "a100"}`: a model
    /// feature, so one pool can mix GPU types. Unlisted endpoints are class 0.
    #[serde(default)]
    pub hardware: BTreeMap<String, String>,
    /// What serves the pool, so which series its `/metrics` are read from: `vllm` (the
    /// default), `sglang`, `trtllm-serve`, `triton-tensorrt-llm`, or an `[[engine]]`.
    #[serde(default = "default_engine")]
    pub engine: String,
}

fn default_engine() -> String {
    engine::DEFAULT_ENGINE.to_string()
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9000))
}
fn default_scrape_interval_ms() -> u64 {
    200
}
fn default_scrape_timeout_ms() -> u64 {
    1000
}
fn default_stale_after_ms() -> u64 {
    5000
}
fn default_in_flight_ttl_s() -> u64 {
    600
}
fn default_in_flight_expiry_multiple() -> f64 {
    4.0
}
fn default_in_flight_min_s() -> u64 {
    30
}
fn default_prefix_blocks() -> usize {
    100_000
}
fn default_observations_kept() -> usize {
    10_000
}
fn default_max_in_flight() -> usize {
    100_000
}
fn default_max_scrape_bytes() -> usize {
    4 << 20
}

/// Environment variable holding the API token (takes precedence over `auth_token_file`).
pub const TOKEN_ENV: &str = "HEADROOM_PREDICTOR_TOKEN";
pub use callers::{CallerQuotas, CallerToken, MIN_TOKEN_BYTES, PLACEHOLDER_TOKEN_PREFIX};
/// The `model.prior_hardware_scale` values accepted: how many times slower than an H100 a
/// class may be said to run. Beyond it a value is more likely a typo than a GPU.
pub const PRIOR_HARDWARE_SCALE: std::ops::RangeInclusive<f64> = 0.05..=20.0;

impl Config {
    /// A configuration of `pools` with every other field at its default (what a file
    /// naming only its pools means). Tools build one and write it with [`Config::to_toml`].
    pub fn new(pools: Vec<PoolConfig>) -> Config {
        Config {
            listen: default_listen(),
            scrape_interval_ms: default_scrape_interval_ms(),
            scrape_timeout_ms: default_scrape_timeout_ms(),
            stale_after_ms: default_stale_after_ms(),
            in_flight_ttl_s: default_in_flight_ttl_s(),
            in_flight_expiry_multiple: default_in_flight_expiry_multiple(),
            in_flight_min_s: default_in_flight_min_s(),
            prefix_blocks_per_endpoint: default_prefix_blocks(),
            observations_kept: default_observations_kept(),
            max_in_flight: default_max_in_flight(),
            max_scrape_bytes: default_max_scrape_bytes(),
            auth_token_file: None,
            callers_file: None,
            callers: callers::CallerQuotas::default(),
            pools,
            engines: Vec::new(),
            model: ModelConfig::default(),
            kubernetes: KubernetesConfig::default(),
            flow: FlowConfig::default(),
            passive_health: Default::default(),
        }
    }

    /// The configuration as the TOML file predictor-svc reads (validated first, so a
    /// tool never writes a file the service would refuse).
    pub fn to_toml(&self) -> anyhow::Result<String> {
        self.validate()?;
        Ok(toml::to_string(self)?)
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Config::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let config: Config = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    /// The API token from `HEADROOM_PREDICTOR_TOKEN` or `auth_token_file` (trimmed);
    /// `None` when neither is set. A token too short or with non-visible characters is refused.
    pub fn auth_token(&self) -> anyhow::Result<Option<String>> {
        let (token, from) = match std::env::var(TOKEN_ENV) {
            Ok(t) if !t.trim().is_empty() => (t, TOKEN_ENV.to_string()),
            _ => match &self.auth_token_file {
                None => return Ok(None),
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .map_err(|e| anyhow::anyhow!("auth_token_file {}: {e}", path.display()))?;
                    (text, format!("auth_token_file {}", path.display()))
                }
            },
        };
        callers::checked_token(&token, &from).map(Some)
    }

    /// Every caller's tokens: the single token ([`Config::auth_token`]) as
    /// [`callers::SHARED_CALLER`], then `callers_file`'s. Empty: the guarded routes are open.
    pub fn caller_tokens(&self) -> anyhow::Result<Vec<CallerToken>> {
        let mut tokens: Vec<CallerToken> = self
            .auth_token()?
            .map(|token| CallerToken { caller: callers::SHARED_CALLER.to_string(), token })
            .into_iter()
            .collect();
        if let Some(path) = &self.callers_file {
            for c in callers::read_callers(path)? {
                anyhow::ensure!(
                    tokens.iter().all(|t| t.token != c.token),
                    "callers_file {}: a token of {:?} is also the single token",
                    path.display(),
                    c.caller
                );
                tokens.push(c);
            }
        }
        Ok(tokens)
    }

    /// Every hardware name used anywhere, sorted: class ids are 1-based positions here.
    fn hardware_names(&self) -> Vec<&String> {
        let mut names: Vec<&String> = self
            .pools
            .iter()
            .flat_map(|p| {
                let discovered = p.kubernetes.iter().filter_map(|k| k.hardware.as_ref());
                p.hardware.values().chain(discovered).chain(p.inference_pool.iter().filter_map(|i| i.hardware.as_ref()))
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Class id of a hardware name, 1-based in name order (0: not used anywhere).
    pub fn hardware_class(&self, name: &str) -> u32 {
        self.hardware_names().iter().position(|n| *n == name).map_or(0, |i| i as u32 + 1)
    }

    /// How much slower than the prior's calibration each hardware class runs, by class id
    /// (`model.prior_hardware_scale`; 1 where unset, and for class 0, unknown).
    pub fn prior_hardware_scale(&self) -> Vec<f64> {
        let mut hardware_scale = vec![1.0];
        hardware_scale.extend(
            self.hardware_names().iter().map(|n| self.model.prior_hardware_scale.get(*n).copied().unwrap_or(1.0)),
        );
        hardware_scale
    }

    /// The measured profile of each hardware class, by class id (`model.prior_profiles`;
    /// `None` where a class has none: the analytic prior serves it). Reads the files.
    pub fn prior_profiles(&self) -> anyhow::Result<Vec<Option<Profile>>> {
        let mut profiles = vec![None];
        for name in self.hardware_names() {
            let loaded = match self.model.prior_profiles.get(name) {
                Some(paths) => Some(Profile::load(&paths.ttft, &paths.tpot)?),
                None => None,
            };
            profiles.push(loaded);
        }
        Ok(profiles)
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            matches!(self.model.objective.as_str(), "mean" | "p90"),
            "model.objective must be \"mean\" or \"p90\""
        );
        anyhow::ensure!(self.model.retrain_interval_ms >= 100, "model.retrain_interval_ms must be >= 100");
        anyhow::ensure!(self.model.min_samples >= 20, "model.min_samples must be >= 20");
        anyhow::ensure!(self.model.holdout_percent < 100, "model.holdout_percent must be < 100");
        anyhow::ensure!((1..=2000).contains(&self.model.trees), "model.trees must be within 1..=2000");
        anyhow::ensure!((1..=16).contains(&self.model.max_depth), "model.max_depth must be within 1..=16");
        anyhow::ensure!(
            self.model.learning_rate > 0.0 && self.model.learning_rate <= 1.0,
            "model.learning_rate must be within (0, 1]"
        );
        anyhow::ensure!(
            (0.0..=0.2).contains(&self.model.calibration_rate),
            "model.calibration_rate must be within 0..=0.2 (0: off)"
        );
        anyhow::ensure!(
            self.model.drift_factor == 0.0 || (1.0..=100.0).contains(&self.model.drift_factor),
            "model.drift_factor must be 0 (off) or within 1..=100"
        );
        let names = self.hardware_names();
        for (name, scale) in &self.model.prior_hardware_scale {
            anyhow::ensure!(
                scale.is_finite() && PRIOR_HARDWARE_SCALE.contains(scale),
                "model.prior_hardware_scale.{name} must be within {}..={} (times slower than an H100)",
                PRIOR_HARDWARE_SCALE.start(),
                PRIOR_HARDWARE_SCALE.end()
            );
            anyhow::ensure!(
                names.contains(&name),
                "model.prior_hardware_scale.{name}: no pool names this hardware (known: {names:?})"
            );
        }
        for name in self.model.prior_profiles.keys() {
            anyhow::ensure!(
                names.contains(&name),
                "model.prior_profiles.{name}: no pool names this hardware (known: {names:?})"
            );
        }
        // Every profile must load: a typo in a path fails at start, not at the first request.
        self.prior_profiles().map_err(|e| anyhow::anyhow!("model.prior_profiles: {e}"))?;
        anyhow::ensure!(!self.pools.is_empty(), "at least one [[pool]] is required");
        self.callers.validate()?;
        if let Some((field, why)) = self.passive_health.invalid() {
            anyhow::bail!("{field} {why}");
        }
        for pool in &self.pools {
            engine::resolve(&pool.engine, &self.engines)
                .map_err(|e| anyhow::anyhow!("pool {:?}: engine: {e}", pool.name))?;
        }
        for e in &self.engines {
            e.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        anyhow::ensure!((1..=100_000).contains(&self.observations_kept), "observations_kept must be within 1..=100000");
        anyhow::ensure!((1..=10_000_000).contains(&self.max_in_flight), "max_in_flight must be within 1..=10000000");
        anyhow::ensure!((1..=86_400).contains(&self.in_flight_ttl_s), "in_flight_ttl_s must be within 1..=86400");
        anyhow::ensure!(
            (1.0..=100.0).contains(&self.in_flight_expiry_multiple),
            "in_flight_expiry_multiple must be within 1..=100"
        );
        anyhow::ensure!(
            (1..=self.in_flight_ttl_s).contains(&self.in_flight_min_s),
            "in_flight_min_s must be within 1..=in_flight_ttl_s"
        );
        anyhow::ensure!(
            (1024..=256 << 20).contains(&self.max_scrape_bytes),
            "max_scrape_bytes must be within 1024..=268435456"
        );
        anyhow::ensure!((1..=1000).contains(&self.model.keep_versions), "model.keep_versions must be within 1..=1000");
        anyhow::ensure!(self.scrape_interval_ms >= 10, "scrape_interval_ms must be >= 10");
        anyhow::ensure!((1..=100_000).contains(&self.flow.max_queued), "flow.max_queued must be within 1..=100000");
        anyhow::ensure!(
            (1..=self.flow.max_queued).contains(&self.flow.max_queued_per_band),
            "flow.max_queued_per_band must be within 1..=flow.max_queued"
        );
        anyhow::ensure!(
            (1..=3_600_000).contains(&self.flow.max_wait_ms),
            "flow.max_wait_ms must be within 1..=3600000"
        );
        anyhow::ensure!(
            (1..=1000).contains(&self.flow.recheck_interval_ms),
            "flow.recheck_interval_ms must be within 1..=1000"
        );

        anyhow::ensure!(self.scrape_timeout_ms >= 10, "scrape_timeout_ms must be >= 10");
        let mut names = std::collections::HashSet::new();
        for pool in &self.pools {
            anyhow::ensure!(!pool.name.is_empty(), "pool.name must not be empty");
            anyhow::ensure!(
                pool.name.len() <= headroom_protocol::limits::MAX_NAME_BYTES,
                "pool.name must be at most {} bytes",
                headroom_protocol::limits::MAX_NAME_BYTES
            );
            anyhow::ensure!(names.insert(&pool.name), "pool {:?} is defined twice", pool.name);
            anyhow::ensure!(
                !pool.endpoints.is_empty() || !pool.kubernetes.is_empty() || !pool.inference_pool.is_empty(),
                "pool {:?}: needs endpoints, a [[pool.kubernetes]] or a [[pool.inference_pool]] source",
                pool.name
            );
            for k in &pool.kubernetes {
                anyhow::ensure!(
                    !k.namespace.is_empty(),
                    "pool {:?}: kubernetes.namespace must not be empty",
                    pool.name
                );
                anyhow::ensure!(
                    !k.selector.trim().is_empty(),
                    "pool {:?}: kubernetes.selector must not be empty (it would watch every EndpointSlice)",
                    pool.name
                );
                anyhow::ensure!(k.port != Some(0), "pool {:?}: kubernetes.port must be > 0", pool.name);
            }
            for i in &pool.inference_pool {
                anyhow::ensure!(
                    !i.namespace.is_empty() && !i.name.is_empty(),
                    "pool {:?}: inference_pool.namespace and inference_pool.name must not be empty",
                    pool.name
                );
            }
            for e in &pool.endpoints {
                e.parse::<SocketAddr>()
                    .map_err(|_| anyhow::anyhow!("pool {:?}: endpoint {e:?} is not ip:port", pool.name))?;
            }
            for e in pool.hardware.keys() {
                anyhow::ensure!(
                    pool.endpoints.contains(e),
                    "pool {:?}: hardware names {e:?}, not one of its endpoints",
                    pool.name
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_config_writes_the_file_it_parses_back_to() {
        let mut c = Config::new(vec![PoolConfig {
            name: "default".into(),
            endpoints: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            kubernetes: Vec::new(),
            inference_pool: Vec::new(),
            hardware: [("127.0.0.1:2".to_string(), "a100".to_string())].into(),
            engine: "sglang".into(),
        }]);
        c.auth_token_file = Some("/run/token".into());
        c.model.data_dir = Some("/var/lib/headroom".into());
        c.model.objective = "p90".into();
        let text = c.to_toml().unwrap();
        assert_eq!(Config::parse(&text).unwrap(), c, "{text}");
        c.model.objective = "median".into();
        assert!(c.to_toml().is_err(), "an invalid configuration is never written");
    }

    #[test]
    fn minimal_config() {
        let c = Config::parse("[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n").unwrap();
        assert_eq!(c.pools[0].endpoints.len(), 1);
        assert_eq!(c.scrape_interval_ms, 200);
        assert_eq!(c.model.objective(), Objective::Quantile { q: 0.9 });
    }

    #[test]
    fn hardware_classes_are_stable_ids() {
        let c = Config::parse(
            "[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\nhardware = {\"127.0.0.1:2\" = \"h100\", \"127.0.0.1:1\" = \"a100\"}\n",
        )
        .unwrap();
        assert_eq!((c.hardware_class("a100"), c.hardware_class("h100"), c.hardware_class("tpu")), (1, 2, 0));
    }

    #[test]
    fn prior_scales_follow_the_class_ids_and_bad_ones_are_refused_by_name() {
        let pool = "[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\nhardware = {\"127.0.0.1:2\" = \"h100\", \"127.0.0.1:1\" = \"a100\"}\n";
        let c = Config::parse(&format!("[model]\nprior_hardware_scale = {{a100 = 1.7}}\n{pool}")).unwrap();
        assert_eq!(c.prior_hardware_scale(), vec![1.0, 1.7, 1.0], "class 0 (unknown), a100, h100");
        for (scale, field) in [("{a100 = 0}", "prior_hardware_scale.a100"), ("{tpu = 2.0}", "prior_hardware_scale.tpu")]
        {
            let err = Config::parse(&format!("[model]\nprior_hardware_scale = {scale}\n{pool}")).unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn kubernetes_sources_replace_or_join_static_endpoints() {
        let c = Config::parse(
            "[kubernetes]\napi_server = \"http://127.0.0.1:1\"\n[[pool]]\nname = \"p\"\n[[pool.kubernetes]]\nnamespace = \"llm\"\nselector = \"app=vllm\"\nport_name = \"http\"\nhardware = \"a100\"\n",
        )
        .unwrap();
        assert!(c.pools[0].endpoints.is_empty());
        assert_eq!(c.pools[0].kubernetes[0].port_name.as_deref(), Some("http"));
        assert_eq!(c.hardware_class("a100"), 1);
        assert_eq!(c.kubernetes.api_server.as_deref(), Some("http://127.0.0.1:1"));
    }

    #[test]
    fn invalid_configs_refused() {
        for text in [
            "",
            "[[pool]]\nname = \"p\"\nendpoints = []\n",
            "[[pool]]\nname = \"p\"\nendpoints = [\"localhost\"]\n",
            "[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:2\"]\n",
            "bogus = 1\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "[model]\nobjective = \"median\"\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\nhardware = {\"127.0.0.1:9\" = \"a100\"}\n",
            "[[pool]]\nname = \"p\"\n[[pool.kubernetes]]\nnamespace = \"llm\"\nselector = \"\"\n",
            "[[pool]]\nname = \"p\"\n[[pool.kubernetes]]\nnamespace = \"llm\"\nselector = \"a=b\"\nport = 0\n",
            "[[pool]]\nname = \"p\"\n[[pool.kubernetes]]\nnamespace = \"llm\"\nselector = \"a=b\"\nbogus = 1\n",
            "[flow]\nmax_queued = 0\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "[flow]\nmax_queued = 10\nmax_queued_per_band = 11\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "[flow]\nmax_wait_ms = 0\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "[flow]\nrecheck_interval_ms = 0\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "[flow]\nbogus = 1\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "in_flight_ttl_s = 0\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "in_flight_expiry_multiple = 0.5\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "in_flight_expiry_multiple = nan\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
            "in_flight_ttl_s = 60\nin_flight_min_s = 61\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
        ] {
            assert!(Config::parse(text).is_err(), "{text}");
        }
    }
}
