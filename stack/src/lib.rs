//! The local headroom stack: simulated model servers, predictor-svc and Envoy
//! with the headroom filter, all on 127.0.0.1 with free ports.
//!
//! Used by `make up` / `make down` / `make demo` (through the `headroom-stack`
//! binary) and by the end-to-end tests. Every process it starts it stops by
//! pid; a detached stack records its pids in `<run_dir>/stack.json`.

pub mod accuracy;
pub mod engine;
pub mod envoy_config;
pub mod host;
pub mod http;
pub mod locate;
pub mod predictor_setup;
pub mod process;
pub mod router;
pub mod vllm;

pub use engine::{Engine, SIM_MODEL};
pub use router::Router;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use headroom_predictor_config::{Config as PredictorConfig, PoolConfig};
use process::Proc;

/// How to build a stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// What serves the model (started by the stack unless `servers` are given).
    pub engine: Engine,
    /// Model servers already running elsewhere (`headroom-stack up --servers`): the stack
    /// starts none and puts the gateway in front of these; `profiles` then names each one's
    /// hardware class (or is empty).
    pub servers: Vec<SocketAddr>,
    /// One hardware profile per server the stack starts (`h100`, `a100` for the simulator;
    /// `cpu` for vLLM), or per given server.
    pub profiles: Vec<String>,
    /// Measure each hardware class's costs on its first server before traffic
    /// (`headroom-profile`'s sweep, seconds on the idle fleet) and give them to the predictor
    /// as its prior (`model.prior_profiles`). Off, classes take the analytic prior, the
    /// simulator's own cost formula (what the tests and the simulated benchmark use).
    pub profile: bool,
    /// Simulator time scale (1 = real time).
    pub time_scale: f64,
    /// Filter configuration fields, over the stack's defaults.
    pub plugin: Map<String, Value>,
    /// Where configs, logs and `stack.json` go.
    pub run_dir: PathBuf,
    /// Tie the processes' lives to this thread (tests) instead of detaching (`make up`).
    pub attached: bool,
    /// Use a predictor already listening here instead of starting predictor-svc
    /// (tests put a misbehaving one there).
    pub external_predictor: Option<SocketAddr>,
    /// The predictor's training objective (`mean` or `p90`).
    pub objective: String,
    /// Envoy with headroom, or a plain Envoy baseline.
    pub router: Router,
    /// predictor-svc replicas; more than one are shards (`predictor_shards` in the filter).
    pub predictor_replicas: usize,
    /// The replicas are one cluster's endpoints instead of shards: Envoy balances every
    /// call over them, as over a Kubernetes Service's pods while a rollout's new pod and
    /// its old one both serve (`maxSurge: 1`).
    pub predictor_rollout: bool,
    /// Applied to each replica's configuration after the stack's settings (a test's caps).
    pub predictor_tweak: fn(&mut PredictorConfig),
    /// One simulator process per server (`server-0`, `server-1`, ...), so a test can kill
    /// and restart one server ([`Stack::kill_server`], [`Stack::start_server`]); otherwise one
    /// process serves all.
    pub server_processes: bool,
    /// Start Envoy for hot restart (epoch 0), so [`Stack::hot_restart_envoy`] can hand its
    /// listeners to a new process; otherwise `--disable-hot-restart`.
    pub envoy_hot_restart: bool,
    /// With [`Router::Epp`]: Envoy skips a picker that is down (`failure_mode_allow`) rather
    /// than fail the request.
    pub epp_failure_mode_allow: bool,
    /// With [`Router::Epp`]: Envoy streams request bodies to the picker
    /// (`FULL_DUPLEX_STREAMED`) rather than buffering each whole (`BUFFERED`).
    pub epp_full_duplex: bool,
    /// With [`Router::Epp`]: every request carries the gateway's subset hint naming these
    /// of the stack's servers (by index), as a gateway that restricts picks would send.
    pub epp_subset_hint: Option<Vec<usize>>,
    /// The model each simulated server serves, by index (missing or empty: the simulator's
    /// default), for a gateway fronting several models.
    pub server_models: Vec<String>,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            engine: Engine::Simulator,
            servers: Vec::new(),
            profiles: vec!["h100".into(); 3],
            profile: false,
            time_scale: 1.0,
            plugin: Map::new(),
            run_dir: locate::root().join(".run"),
            attached: true,
            external_predictor: None,
            // The predictor's own default: defined once, in its configuration.
            objective: headroom_predictor_config::ModelConfig::default().objective,
            router: Router::Headroom,
            predictor_replicas: 1,
            predictor_rollout: false,
            predictor_tweak: |_| {},
            server_processes: false,
            envoy_hot_restart: false,
            epp_failure_mode_allow: true,
            epp_full_duplex: false,
            epp_subset_hint: None,
            server_models: Vec::new(),
        }
    }
}

/// Addresses and processes of a running stack (also its on-disk record).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StackState {
    pub gateway: SocketAddr,
    pub admin: SocketAddr,
    /// The first (or only) predictor replica.
    pub predictor: SocketAddr,
    /// Every predictor replica, `predictor` first.
    #[serde(default)]
    pub predictors: Vec<SocketAddr>,
    pub servers: Vec<SocketAddr>,
    pub procs: Vec<Proc>,
    /// The token the predictor's guarded routes require (the filter sends it too).
    #[serde(default)]
    pub token: Option<String>,
    /// The model the servers serve: what a client puts in a request's `model`.
    #[serde(default = "sim_model")]
    pub model: String,
    /// headroom-epp, when Envoy routes through it ([`Router::Epp`]).
    #[serde(default)]
    pub epp: Option<SocketAddr>,
}

fn sim_model() -> String {
    SIM_MODEL.to_string()
}

impl StackState {
    /// Every predictor replica, `predictor` first (a record without the list has one).
    pub fn predictor_replicas(&self) -> &[SocketAddr] {
        if self.predictors.is_empty() {
            std::slice::from_ref(&self.predictor)
        } else {
            &self.predictors
        }
    }

    fn file(run_dir: &Path) -> PathBuf {
        run_dir.join("stack.json")
    }

    /// The record `make up` left, if any.
    pub fn load(run_dir: &Path) -> anyhow::Result<Option<StackState>> {
        let path = Self::file(run_dir);
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path)?;
        Ok(Some(serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?))
    }

    /// Stops every recorded process still running and removes the record.
    pub fn stop_all(&self, run_dir: &Path) -> usize {
        let mut stopped = 0;
        for p in self.procs.iter().rev() {
            if process::is_ours(p) {
                process::stop(p, None, Duration::from_secs(5));
                stopped += 1;
            }
        }
        let _ = std::fs::remove_file(Self::file(run_dir));
        stopped
    }
}

/// A running stack. Dropping it stops every process it started.
pub struct Stack {
    pub state: StackState,
    pub run_dir: PathBuf,
    children: Vec<Option<Child>>,
    attached: bool,
    /// The filter configuration every Envoy of this stack runs (defaults, token, the caller's fields).
    plugin: Map<String, Value>,
    /// `ip:port=profile` of each simulated server, and their time scale (to restart one).
    server_specs: Vec<String>,
    time_scale: f64,
    /// What the stack's own servers are (none when it fronts given servers).
    engine: Option<Engine>,
    /// How the serving Envoy was started (the newest epoch after a hot restart).
    envoy: EnvoyLaunch,
    /// See [`StackOptions::epp_failure_mode_allow`] and [`StackOptions::epp_full_duplex`].
    epp_failure_mode_allow: bool,
    epp_full_duplex: bool,
    epp_subset_hint: Option<Vec<usize>>,
}

/// One Envoy to start in front of the stack's servers: the stack's own, or another beside it
/// (a plain Envoy to compare with, or the next epoch of a hot restart).
#[derive(Debug, Clone)]
pub struct EnvoyLaunch {
    /// Process name (logs, `stop_named`); the config goes to `<name>.yaml`.
    pub name: String,
    pub router: Router,
    pub gateway: SocketAddr,
    pub admin: SocketAddr,
    /// Worker threads (`--concurrency`).
    pub concurrency: usize,
    /// Hot restart `(base_id, epoch)`: epoch 0 starts a family, epoch n+1 takes the listeners
    /// over from epoch n and drains it. `None`: `--disable-hot-restart`.
    pub hot_restart: Option<(u32, u32)>,
}

impl EnvoyLaunch {
    /// Two workers, no hot restart: how the stack runs Envoy unless told otherwise.
    pub fn new(name: &str, router: Router, gateway: SocketAddr, admin: SocketAddr) -> EnvoyLaunch {
        EnvoyLaunch { name: name.to_string(), router, gateway, admin, concurrency: 2, hot_restart: None }
    }
}

/// The filter configuration of the local stack, before the caller's fields.
pub fn default_plugin_config() -> Map<String, Value> {
    let v = json!({"pool": "default", "predictor_cluster": "headroom_predictor", "debug_headers": true});
    v.as_object().cloned().unwrap_or_default()
}

/// The picker's token file in a stack's run directory: the predictor names it `picker`.
const PICKER_TOKEN: &str = "picker-token";

/// A fresh random token for a stack's predictor (128 bits from std's random hasher keys).
fn new_token() -> String {
    use std::hash::BuildHasher;
    let part = || std::collections::hash_map::RandomState::new().hash_one((std::process::id(), Instant::now()));
    format!("{:016x}{:016x}", part(), part())
}

/// Filter configuration fields from a `--plugin` argument: a JSON object, laid over a
/// stack's defaults to measure another setting (the accuracy run, the gateway benchmark).
pub fn plugin_fields(text: &str) -> anyhow::Result<Map<String, Value>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => Ok(fields),
        _ => anyhow::bail!("--plugin must be a JSON object of filter settings, got {text:?}"),
    }
}

/// `n` distinct free TCP ports on 127.0.0.1. Every listener is held until all
/// are chosen: binding port 0 again after closing may return the same port.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// Writes `text` to a file only the current user can read.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(0o600);
    options.open(path)?.write_all(text.as_bytes())
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Polls `ok` every 50 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ok()
}

impl Stack {
    /// Starts the simulated servers, the predictor and Envoy, and waits until
    /// each answers. On failure everything started so far is stopped.
    pub fn start(opts: StackOptions) -> anyhow::Result<Stack> {
        std::fs::create_dir_all(&opts.run_dir)?;
        let run_dir = opts.run_dir.canonicalize()?;
        let bins = locate::bin_dir()?;
        // Missing Envoy or .wasm: fail before starting anything.
        locate::envoy()?;
        locate::wasm()?;
        let replicas = opts.predictor_replicas.max(1);
        let given = !opts.servers.is_empty();
        let own_servers = if given { 0 } else { opts.profiles.len() };
        let mut ports = free_ports(own_servers + 2 + replicas)?.into_iter().map(local);
        let mut next = || ports.next().ok_or_else(|| anyhow::anyhow!("port allocation came up short"));
        let (gateway, admin) = (next()?, next()?);
        let mut predictors: Vec<SocketAddr> = (0..replicas).map(|_| next()).collect::<Result<_, _>>()?;
        if let Some(external) = opts.external_predictor {
            predictors = vec![external];
        }
        let servers: Vec<SocketAddr> =
            if given { opts.servers.clone() } else { (0..own_servers).map(|_| next()).collect::<Result<_, _>>()? };
        // A given fleet says what it serves (`/v1/models`); the stack's own is the engine's.
        let model = if given { predictor_setup::served_model(&servers)? } else { opts.engine.model().to_string() };
        if opts.engine == Engine::Vllm && !given {
            // Missing vLLM or its model: fail before starting anything.
            locate::vllm_python()?;
            locate::vllm_model()?;
        }
        let token = new_token();
        let state = StackState {
            gateway,
            admin,
            predictor: predictors[0],
            predictors,
            servers,
            procs: Vec::new(),
            token: Some(token.clone()),
            model,
            epp: None,
        };
        let server_specs = state
            .servers
            .iter()
            .zip(&opts.profiles)
            .enumerate()
            .map(|(i, (a, p))| match opts.server_models.get(i).filter(|m| !m.is_empty()) {
                Some(model) => format!("{a}={p}:{model}"),
                None => format!("{a}={p}"),
            })
            .collect();
        let mut envoy = EnvoyLaunch::new("envoy", opts.router, gateway, admin);
        if opts.envoy_hot_restart {
            // The base id names the shared memory of one restart family: the gateway port is unique here.
            envoy.hot_restart = Some((u32::from(gateway.port()), 0));
        }
        let mut stack = Stack {
            run_dir: run_dir.clone(),
            state,
            children: Vec::new(),
            attached: opts.attached,
            plugin: Map::new(),
            server_specs,
            time_scale: opts.time_scale,
            engine: (!given).then_some(opts.engine),
            envoy,
            epp_failure_mode_allow: opts.epp_failure_mode_allow,
            epp_full_duplex: opts.epp_full_duplex,
            epp_subset_hint: opts.epp_subset_hint.clone(),
        };

        match stack.engine {
            None => {}
            // Simulated model servers: one process, or one each.
            Some(Engine::Simulator) if opts.server_processes => {
                for i in 0..stack.server_specs.len() {
                    stack.start_server(i)?;
                }
            }
            Some(Engine::Simulator) => {
                let mut args: Vec<String> = vec!["--time-scale".into(), opts.time_scale.to_string()];
                for spec in &stack.server_specs {
                    args.extend(["--server".to_string(), spec.clone()]);
                }
                stack.spawn("simulator", &bins.join("headroom-sim"), &args)?;
                for s in stack.state.servers.clone() {
                    stack.wait_ready("simulator", || http::get(s, "/health").is_ok_and(|(code, _)| code == 200))?;
                }
            }
            // Real vLLM: every server starts at once (a minute or more each), then each is waited for.
            Some(Engine::Vllm) => {
                for i in 0..stack.state.servers.len() {
                    stack.spawn_vllm(i)?;
                }
                for i in 0..stack.state.servers.len() {
                    stack.wait_server(i)?;
                }
            }
        }

        // predictor-svc, one config and data directory per replica. Each server's profile is
        // its hardware class: a model feature, so the pool may mix GPUs.
        let pool = PoolConfig {
            name: "default".into(),
            endpoints: stack.state.servers.iter().map(|s| s.to_string()).collect(),
            kubernetes: Vec::new(),
            inference_pool: Vec::new(),
            hardware: stack.state.servers.iter().zip(&opts.profiles).map(|(s, p)| (s.to_string(), p.clone())).collect(),
            engine: headroom_predictor_config::engine::DEFAULT_ENGINE.into(),
        };
        // The prior from each hardware class's measured costs, where the stack measures them.
        let profiles = if opts.profile {
            let hardware: Vec<(SocketAddr, String)> =
                stack.state.servers.iter().copied().zip(opts.profiles.iter().cloned()).collect();
            let sim_binary = bins.join("headroom-sim");
            let simulated =
                (stack.engine == Some(Engine::Simulator)).then_some((opts.time_scale, sim_binary.as_path()));
            match predictor_setup::profile_servers(&hardware, &stack.state.model, &run_dir.join("profiles"), simulated)
            {
                Ok(p) => p,
                Err(e) => {
                    stack.stop();
                    return Err(e.context("profiling the servers (headroom-profile)"));
                }
            }
        } else {
            BTreeMap::new()
        };
        // The predictor's guarded routes take this token, from a file only its owner reads;
        // the picker is a caller of its own, with its own token (`callers_file`), as each
        // gateway of a deployment should be.
        let token_file = run_dir.join("predictor-token");
        write_private(&token_file, &token)?;
        let callers_file = run_dir.join("predictor-callers");
        let picker_token = new_token();
        write_private(&run_dir.join(PICKER_TOKEN), &picker_token)?;
        write_private(&callers_file, &format!("picker {picker_token}\n"))?;
        for (i, listen) in stack.state.predictors.clone().into_iter().enumerate() {
            let simulated = (stack.engine == Some(Engine::Simulator)).then_some(opts.time_scale);
            let mut config =
                predictor_setup::predictor_config(pool.clone(), &opts.objective, &opts.profiles, simulated);
            config.listen = listen;
            config.auth_token_file = Some(token_file.clone());
            config.callers_file = Some(callers_file.clone());
            config.model.data_dir = Some(run_dir.join(Self::replica_name("predictor-data", i)));
            config.model.prior_profiles = profiles.clone();
            (opts.predictor_tweak)(&mut config);
            std::fs::write(stack.predictor_config(i), config.to_toml()?)?;
            if opts.external_predictor.is_none() {
                stack.start_predictor_replica(i)?;
            }
        }

        // Envoy with the filter.
        let mut plugin = default_plugin_config();
        // From Envoy's environment (`start_envoy`), so that neither its config file nor its
        // `/config_dump` holds the token.
        plugin.insert("predictor_token_env".into(), json!(headroom_predictor_config::TOKEN_ENV));
        if replicas > 1 && !opts.predictor_rollout {
            let shards: Vec<String> = (0..replicas).map(|i| envoy_config::predictor_cluster(i, replicas)).collect();
            plugin.insert("predictor_shards".into(), json!(shards));
        }
        plugin.extend(opts.plugin.clone());
        stack.plugin = plugin;
        if opts.router == Router::Epp {
            stack.start_epp()?;
        }
        let launch = stack.envoy.clone();
        stack.start_envoy(&launch)?;
        write_private(&StackState::file(&run_dir), &serde_json::to_string_pretty(&stack.state)?)?;
        Ok(stack)
    }

    /// Renders the bootstrap for `launch`, starts that Envoy and waits until it routes.
    /// Its process is the stack's: stopped with it, or alone by [`Stack::stop_named`].
    pub fn start_envoy(&mut self, launch: &EnvoyLaunch) -> anyhow::Result<()> {
        let (file, lb_policy) = match launch.router {
            Router::Headroom | Router::HeadroomFilterSkipped | Router::Epp => ("envoy/envoy.yaml.tmpl", ""),
            Router::RoundRobin => ("envoy/baseline.yaml.tmpl", "ROUND_ROBIN"),
            Router::LeastRequest => ("envoy/baseline.yaml.tmpl", "LEAST_REQUEST"),
            Router::StickySession => ("envoy/baseline.yaml.tmpl", "RING_HASH"),
        };
        let mut template = std::fs::read_to_string(locate::root().join(file))?;
        let plugin = Value::Object(self.plugin.clone());
        match launch.router {
            Router::HeadroomFilterSkipped => template = envoy_config::replace_wasm_filter(&template, "")?,
            Router::Epp => {
                let snippet = std::fs::read_to_string(locate::root().join("envoy/ext-proc-filter.yaml.tmpl"))?;
                let subset: Option<Vec<SocketAddr>> = self
                    .epp_subset_hint
                    .as_ref()
                    .map(|indices| indices.iter().filter_map(|&i| self.state.servers.get(i).copied()).collect());
                let filter = envoy_config::ext_proc_filter(
                    &snippet,
                    &plugin,
                    self.epp_failure_mode_allow,
                    self.epp_full_duplex,
                    subset.as_deref(),
                )?;
                template = envoy_config::replace_wasm_filter(&template, &filter)?;
            }
            _ => {}
        }
        let state = &self.state;
        let addresses = envoy_config::Addresses {
            admin: launch.admin,
            gateway: launch.gateway,
            predictors: state.predictor_replicas(),
            servers: &state.servers,
            epp: state.epp,
        };
        let yaml = envoy_config::render_envoy(&template, addresses, &locate::wasm()?, &plugin, lb_policy)?;
        let config = self.run_dir.join(format!("{}.yaml", launch.name));
        write_private(&config, &yaml)?;
        let mut args: Vec<String> = vec!["-c".into(), config.display().to_string()];
        match launch.hot_restart {
            None => args.push("--disable-hot-restart".into()),
            Some((base_id, epoch)) => {
                args.extend(["--base-id".into(), base_id.to_string(), "--restart-epoch".into(), epoch.to_string()]);
                // The old epoch drains for 2 s and exits after 5: requests in flight on it finish.
                args.extend(["--drain-time-s".into(), "2".into(), "--parent-shutdown-time-s".into(), "5".into()]);
            }
        }
        args.extend(["--concurrency".into(), launch.concurrency.to_string(), "--log-level".into(), "warn".into()]);
        let env: Vec<(String, String)> =
            self.state.token.iter().map(|t| (headroom_predictor_config::TOKEN_ENV.to_string(), t.clone())).collect();
        let log = self.run_dir.join(format!("{}.log", launch.name));
        let (proc, child) = process::spawn_with(&launch.name, &locate::envoy()?, &args, &env, &log, self.attached)?;
        self.state.procs.push(proc);
        self.children.push(Some(child));
        let (admin, gateway) = (launch.admin, launch.gateway);
        self.wait_ready(&launch.name, || {
            http::get(admin, "/ready").is_ok_and(|(c, _)| c == 200)
                && http::get(gateway, "/v1/models").is_ok_and(|(c, _)| c == 200)
        })
    }

    fn spawn(&mut self, name: &str, exe: &Path, args: &[String]) -> anyhow::Result<()> {
        let log = self.run_dir.join(format!("{name}.log"));
        let (proc, child) = process::spawn(name, exe, args, &log, self.attached)?;
        self.state.procs.push(proc);
        self.children.push(Some(child));
        Ok(())
    }

    fn wait_ready(&mut self, name: &str, ok: impl FnMut() -> bool) -> anyhow::Result<()> {
        self.wait_ready_for(name, Duration::from_secs(30), ok)
    }

    /// Waits until `ok` holds, for at most `timeout`, or stops the stack and says why
    /// (with the end of the process's log) when `name` exits or the time runs out.
    fn wait_ready_for(&mut self, name: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> anyhow::Result<()> {
        let index = self.state.procs.iter().rposition(|p| p.name == name);
        let mut exited = false;
        let children = &mut self.children;
        let ready = wait_until(timeout, || {
            // A process that already exited will never answer: stop waiting.
            exited = index.and_then(|i| children[i].as_mut()).is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            exited || ok()
        });
        if ready && !exited {
            return Ok(());
        }
        let log = self.run_dir.join(format!("{name}.log"));
        let tail = process::log_tail(&log, 30);
        self.stop();
        let why =
            if exited { "exited".to_string() } else { format!("did not become ready within {} s", timeout.as_secs()) };
        anyhow::bail!("{name} {why}; last lines of {}:\n{tail}", log.display())
    }

    /// `base` for replica 0, `base-i` for the others (process names, files).
    fn replica_name(base: &str, i: usize) -> String {
        if i == 0 {
            base.to_string()
        } else {
            format!("{base}-{i}")
        }
    }

    fn predictor_config(&self, i: usize) -> PathBuf {
        self.run_dir.join(format!("{}.toml", Self::replica_name("predictor", i)))
    }

    /// Starts (or restarts) predictor-svc on its port and waits for `/readyz`.
    pub fn start_predictor(&mut self) -> anyhow::Result<()> {
        self.start_predictor_replica(0)
    }

    /// Starts (or restarts) predictor replica `i` and waits for `/readyz`.
    pub fn start_predictor_replica(&mut self, i: usize) -> anyhow::Result<()> {
        let bins = locate::bin_dir()?;
        let args = vec!["--config".to_string(), self.predictor_config(i).display().to_string()];
        let name = Self::replica_name("predictor", i);
        self.spawn(&name, &bins.join("headroom-predictor"), &args)?;
        let addr = self.state.predictors.get(i).copied().unwrap_or(self.state.predictor);
        self.wait_ready(&name, || http::get(addr, "/readyz").is_ok_and(|(c, _)| c == 200))
    }

    /// Starts (or restarts, on its port) server `i` in a process of its own, `server-<i>`,
    /// and waits until it answers.
    pub fn start_server(&mut self, i: usize) -> anyhow::Result<()> {
        match self.engine {
            Some(Engine::Simulator) => self.start_sim_server(i),
            Some(Engine::Vllm) => {
                self.spawn_vllm(i)?;
                self.wait_server(i)
            }
            None => anyhow::bail!("the stack fronts servers it did not start: it cannot start server {i}"),
        }
    }

    /// Starts real vLLM server `i`, `server-<i>`, on its port, without waiting for it.
    fn spawn_vllm(&mut self, i: usize) -> anyhow::Result<()> {
        let addr = *self.state.servers.get(i).ok_or_else(|| anyhow::anyhow!("no server {i}"))?;
        let args = vllm::server_args(&locate::vllm_model()?, addr);
        let name = format!("server-{i}");
        let log = self.run_dir.join(format!("{name}.log"));
        let (proc, child) =
            process::spawn_with(&name, &locate::vllm_python()?, &args, &vllm::server_env(i), &log, self.attached)?;
        self.state.procs.push(proc);
        self.children.push(Some(child));
        Ok(())
    }

    /// Waits until server `i` answers `/health` (a vLLM server for up to
    /// [`vllm::START_TIMEOUT_S`]).
    fn wait_server(&mut self, i: usize) -> anyhow::Result<()> {
        let addr = self.state.servers[i];
        let timeout = Duration::from_secs(vllm::START_TIMEOUT_S);
        self.wait_ready_for(&format!("server-{i}"), timeout, || http::get(addr, "/health").is_ok_and(|(c, _)| c == 200))
    }

    /// Starts simulated server `i` in a process of its own and waits until it answers.
    fn start_sim_server(&mut self, i: usize) -> anyhow::Result<()> {
        let spec = self.server_specs.get(i).cloned().ok_or_else(|| anyhow::anyhow!("no server {i}"))?;
        let args = vec!["--time-scale".to_string(), self.time_scale.to_string(), "--server".into(), spec];
        let name = format!("server-{i}");
        self.spawn(&name, &locate::bin_dir()?.join("headroom-sim"), &args)?;
        let addr = self.state.servers[i];
        self.wait_ready(&name, || http::get(addr, "/health").is_ok_and(|(c, _)| c == 200))
    }

    /// Kills server `i` (a vLLM one, or simulated with `server_processes`) as a crash would.
    pub fn kill_server(&mut self, i: usize) {
        self.kill_named(&format!("server-{i}"));
    }

    /// Kills the stack's processes named `name` without a grace period, as a crash would:
    /// open connections are cut, nothing is flushed or persisted.
    pub fn kill_named(&mut self, name: &str) {
        self.end_named(name, Duration::ZERO);
    }

    /// The pid of the stack's process named `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.state.procs.iter().find(|p| p.name == name).map(|p| p.pid)
    }

    /// Hot restart: a new Envoy process (the next epoch, `concurrency` workers, a new admin
    /// port) takes the gateway's listener over from the serving one, which drains and exits
    /// on its own. Needs `envoy_hot_restart`.
    pub fn hot_restart_envoy(&mut self, concurrency: usize) -> anyhow::Result<()> {
        let Some((base_id, epoch)) = self.envoy.hot_restart else {
            anyhow::bail!("this stack's Envoy was started without hot restart");
        };
        let admin = local(free_ports(1)?[0]);
        let launch = EnvoyLaunch {
            name: format!("envoy-epoch-{}", epoch + 1),
            concurrency,
            admin,
            hot_restart: Some((base_id, epoch + 1)),
            ..self.envoy.clone()
        };
        self.start_envoy(&launch)?;
        self.state.admin = admin;
        self.envoy = launch;
        Ok(())
    }

    /// Starts (or restarts, on its port) headroom-epp with the stack's filter configuration
    /// and waits for `/readyz`; Envoy's ext_proc filter calls it ([`Router::Epp`]).
    pub fn start_epp(&mut self) -> anyhow::Result<()> {
        let addr = match self.state.epp {
            Some(addr) => addr,
            None => *self.state.epp.insert(local(free_ports(1)?[0])),
        };
        // The picker's own token, from a file, as the manifests mount its Secret.
        let mut plugin = self.plugin.clone();
        plugin.remove("predictor_token");
        plugin.remove("predictor_token_env");
        let config = self.run_dir.join("epp.json");
        std::fs::write(&config, serde_json::to_string_pretty(&Value::Object(plugin))?)?;
        // No drain delay: nothing here routes around a picker that is going away, and every
        // test's teardown would wait it out.
        let mut args = vec![
            "--listen".to_string(),
            addr.to_string(),
            "--config".into(),
            config.display().to_string(),
            "--drain-delay-s".into(),
            "0".into(),
        ];
        if self.state.token.is_some() {
            let token = self.run_dir.join(PICKER_TOKEN);
            args.extend(["--predictor-token-file".to_string(), token.display().to_string()]);
        }
        let predictors = self.state.predictor_replicas().to_vec();
        // The clusters the configuration names: one per shard, or one for every replica
        // (Envoy balances those; the picker calls the first).
        let n = if self.plugin.contains_key("predictor_shards") { predictors.len() } else { 1 };
        for (i, p) in predictors.iter().take(n).enumerate() {
            args.extend(["--predictor".to_string(), format!("{}={p}", envoy_config::predictor_cluster(i, n))]);
        }
        self.spawn("epp", &locate::bin_dir()?.join("headroom-epp"), &args)?;
        self.wait_ready("epp", || http::get(addr, "/readyz").is_ok_and(|(c, _)| c == 200))
    }

    /// Stops headroom-epp (the rest keeps running).
    pub fn stop_epp(&mut self) {
        self.stop_named("epp");
    }

    /// Stops the running predictor-svc (the rest keeps running).
    pub fn stop_predictor(&mut self) {
        self.stop_named("predictor");
    }

    /// Stops predictor replica `i` (the rest keeps running).
    pub fn stop_predictor_replica(&mut self, i: usize) {
        self.stop_named(&Self::replica_name("predictor", i));
    }

    /// Stops every process of the stack named `name` (the rest keeps running).
    pub fn stop_named(&mut self, name: &str) {
        self.end_named(name, Duration::from_secs(5));
    }

    /// Ends the processes named `name` (SIGTERM, SIGKILL after `grace`; at once when zero)
    /// and forgets them.
    fn end_named(&mut self, name: &str, grace: Duration) {
        for (i, p) in self.state.procs.iter().enumerate() {
            if p.name == name {
                process::stop(p, self.children[i].as_mut(), grace);
            }
        }
        let keep: Vec<bool> = self.state.procs.iter().map(|p| p.name != name).collect();
        let mut k = keep.iter();
        self.children.retain(|_| *k.next().unwrap_or(&true));
        self.state.procs.retain(|p| p.name != name);
    }

    /// Stops every process, newest first, and removes the on-disk record.
    /// A detached stack has no processes left to stop and keeps its record.
    pub fn stop(&mut self) {
        if self.state.procs.is_empty() {
            return;
        }
        for (i, p) in self.state.procs.iter().enumerate().rev() {
            process::stop(p, self.children[i].as_mut(), Duration::from_secs(5));
        }
        self.state.procs.clear();
        self.children.clear();
        let _ = std::fs::remove_file(StackState::file(&self.run_dir));
    }

    /// Leaves the processes running (for `make up`); `StackState` can stop them later.
    pub fn detach(mut self) -> StackState {
        self.children.clear();
        let state = self.state.clone();
        self.state.procs.clear();
        state
    }

    /// Envoy's `/stats/prometheus` text (empty when the admin does not answer).
    pub fn envoy_stats(&self) -> String {
        self.envoy_prometheus().unwrap_or_default()
    }

    fn envoy_prometheus(&self) -> Option<String> {
        http::get(self.state.admin, "/stats/prometheus").ok().map(|(_, b)| b)
    }

    /// How often Envoy's circuit breakers held back a request to the model servers so far:
    /// connections not opened at the cap (`upstream_cx_overflow`, the request then waits for
    /// one) plus requests refused a place in the pending queue (`upstream_rq_pending_overflow`).
    /// Non-zero means the gateway's caps, not the servers or the routing, set latencies.
    /// `None` when the admin does not answer.
    pub fn gateway_overflow(&self) -> Option<u64> {
        let text = self.envoy_prometheus()?;
        let cluster = "envoy_cluster_name=\"model_servers\"";
        let count = |name: &str| http::metric_with(&text, name, cluster);
        Some((count("envoy_cluster_upstream_cx_overflow") + count("envoy_cluster_upstream_rq_pending_overflow")) as u64)
    }

    /// The predictor's observations (`/v1/observations`) taken since it had taken `seen`, of
    /// its newest `limit`, oldest first, and how many it has taken in all. `None` when it does
    /// not answer.
    pub fn observations_since(&self, seen: u64, limit: usize) -> Option<(u64, Vec<Value>)> {
        const PAGE: usize = headroom_protocol::limits::MAX_OBSERVATIONS_PAGE;
        // (total, the page's first number, the page).
        let page = |query: String| -> Option<(u64, u64, Vec<Value>)> {
            let path = format!("/v1/observations?{query}");
            let (status, body) = http::get_with_token(self.state.predictor, &path, self.state.token.as_deref()).ok()?;
            let mut log: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
            let list = log["observations"].as_array_mut().map(std::mem::take).unwrap_or_default();
            Some((log["total"].as_u64()?, log["first"].as_u64().unwrap_or(0), list))
        };
        let (total, _, mut newest) = page(format!("limit={}", limit.min(PAGE)))?;
        let want = usize::try_from(total.saturating_sub(seen)).unwrap_or(usize::MAX).min(limit);
        if want <= newest.len() {
            newest.drain(..newest.len() - want);
            return Some((total, newest));
        }
        // More than one page: from the oldest wanted on, a page at a time.
        let (mut after, mut list) = (total - want as u64, Vec::with_capacity(want));
        while list.len() < want {
            let (_, first, more) = page(format!("limit={PAGE}&after={after}"))?;
            if more.is_empty() {
                break;
            }
            after = first + more.len() as u64 - 1;
            list.extend(more);
        }
        list.truncate(want);
        Some((total, list))
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_fields_take_an_object_and_nothing_else() {
        let fields = plugin_fields(r#"{"flush_interval_ms":100}"#).unwrap();
        assert_eq!(fields.get("flush_interval_ms"), Some(&json!(100)));
        for bad in ["[1]", "100", "{", ""] {
            let e = plugin_fields(bad).unwrap_err().to_string();
            assert!(e.contains("--plugin must be a JSON object"), "{bad}: {e}");
        }
    }

    #[test]
    fn free_ports_are_distinct() {
        for _ in 0..20 {
            let mut ports = free_ports(16).unwrap_or_default();
            assert_eq!(ports.len(), 16);
            ports.sort_unstable();
            ports.dedup();
            assert_eq!(ports.len(), 16);
        }
    }
}
