//! Helpers for the end-to-end tests: start a stack, send requests, read the
//! predictor's view.

pub mod burst;
pub mod fake_predictor;
pub mod load;

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use headroom_protocol::headers as names;
pub use headroom_stack::{wait_until, Stack, StackOptions};
use serde_json::Value;

/// One stack at a time on a 2-core machine, even if the harness runs tests in parallel.
static ONE_STACK: Mutex<()> = Mutex::new(());

/// A running stack plus a blocking HTTP client; stops the stack when dropped.
pub struct Harness {
    pub stack: Stack,
    pub http: reqwest::blocking::Client,
    _turn: MutexGuard<'static, ()>,
}

/// A finished response: status, headers we look at, body text.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub served_by: Option<String>,
    pub chosen: Option<String>,
    pub tier: Option<String>,
    pub content_type: Option<String>,
    pub retry_after: Option<String>,
    /// `x-llm-d-request-dropped-reason`, on the gateway's own 429s.
    pub dropped_reason: Option<String>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Stops the stack, then removes its run directory (logs, configs, the predictor's data)
/// unless the test is failing: then the directory stays for the post-mortem, and is named.
impl Drop for Harness {
    fn drop(&mut self) {
        self.stack.stop();
        if std::thread::panicking() {
            eprintln!("stack logs kept in {}", self.stack.run_dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.stack.run_dir);
        }
    }
}

impl Harness {
    /// Starts a stack with 3 simulated H100 servers and the given filter config fields.
    pub fn start(plugin: Value) -> anyhow::Result<Harness> {
        Self::start_with(plugin, None)
    }

    /// Like [`Harness::start`], with the filter talking to a predictor already at `predictor`.
    pub fn start_with(plugin: Value, predictor: Option<SocketAddr>) -> anyhow::Result<Harness> {
        Self::start_opts(StackOptions {
            plugin: plugin.as_object().cloned().unwrap_or_default(),
            external_predictor: predictor,
            ..Default::default()
        })
    }

    /// A stack built from `opts` (its run directory and attachment are the harness's own).
    pub fn start_opts(mut opts: StackOptions) -> anyhow::Result<Harness> {
        // The only external predictor the suite uses is `fake_predictor`, which speaks
        // HTTP/1.1 alone: no predict stream, so the stack keeps its cluster HTTP/1.1.
        if opts.external_predictor.is_some() {
            opts.plugin.entry("predict_stream").or_insert(Value::Bool(false));
        }
        let turn = ONE_STACK.lock().unwrap_or_else(|p| p.into_inner());
        let run_dir = std::env::temp_dir().join(format!("headroom-e2e-{}", std::process::id()));
        let stack = Stack::start(StackOptions { run_dir, attached: true, ..opts })?;
        let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build()?;
        Ok(Harness { stack, http, _turn: turn })
    }

    pub fn gateway(&self) -> String {
        format!("http://{}", self.stack.state.gateway)
    }

    pub fn predictor(&self) -> String {
        format!("http://{}", self.stack.state.predictor)
    }

    /// POSTs `body` (raw) to `path` on the gateway with extra headers.
    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &str) -> anyhow::Result<Reply> {
        let mut req = self.http.post(format!("{}{path}", self.gateway())).body(body.to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Self::reply(req.send()?)
    }

    pub fn get(&self, url: &str) -> anyhow::Result<Reply> {
        Self::reply(self.http.get(url).send()?)
    }

    /// GET on a predictor's guarded route, with the stack's token.
    pub fn get_guarded(&self, url: &str) -> anyhow::Result<Reply> {
        let mut req = self.http.get(url);
        if let Some(token) = &self.stack.state.token {
            req = req.bearer_auth(token);
        }
        Self::reply(req.send()?)
    }

    fn reply(r: reqwest::blocking::Response) -> anyhow::Result<Reply> {
        let h = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (served_by, chosen, tier, content_type, retry_after) =
            (h(names::SERVED_BY), h(names::DEBUG_ENDPOINT), h(names::DEBUG_TIER), h("content-type"), h("retry-after"));
        let dropped_reason = h(names::DROPPED_REASON);
        let status = r.status().as_u16();
        Ok(Reply { status, served_by, chosen, tier, content_type, retry_after, dropped_reason, body: r.text()? })
    }

    /// A completion through the gateway with SLO headers (`stream` adds include_usage).
    pub fn completion(&self, max_tokens: u32, stream: bool, headers: &[(&str, &str)]) -> anyhow::Result<Reply> {
        let body = serde_json::json!({
            "model": "sim-llama-8b",
            "prompt": "The quick brown fox jumps over the lazy dog. ".repeat(20),
            "max_tokens": max_tokens,
            "stream": stream,
            "stream_options": {"include_usage": stream},
        });
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.post("/v1/completions", &all, &body.to_string())
    }

    /// A counter or gauge from a simulated server's `/metrics` (0 when absent).
    pub fn server_metric(&self, server: SocketAddr, name: &str) -> f64 {
        let text = self.get(&format!("http://{server}/metrics")).map(|r| r.body).unwrap_or_default();
        headroom_stack::http::metric_sum(&text, name)
    }

    /// `POST /v1/predict` straight to the predictor, with the stack's token: its answer.
    pub fn predict(&self, body: &Value) -> Value {
        self.http
            .post(format!("{}/v1/predict", self.predictor()))
            .bearer_auth(self.stack.state.token.as_deref().unwrap_or_default())
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .and_then(|r| r.json())
            .unwrap_or_default()
    }

    /// The predictor's newest observations.
    pub fn observations(&self) -> Vec<Value> {
        let url = format!("{}/v1/observations?limit=1000", self.predictor());
        self.get_guarded(&url)
            .map(|r| r.json()["observations"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default()
    }

    /// In-flight count the predictor holds for `endpoint`.
    pub fn in_flight(&self, endpoint: &str) -> Option<u64> {
        let pools = self.get(&format!("{}/v1/pools", self.predictor())).ok()?.json();
        pools["pools"]
            .as_array()?
            .iter()
            .flat_map(|p| p["endpoints"].as_array().cloned().unwrap_or_default())
            .find_map(|e| (e["address"].as_str() == Some(endpoint)).then(|| e["in_flight"].as_u64()).flatten())
    }

    /// Value of an Envoy stat (summed over its series), 0 when absent.
    pub fn envoy_stat(&self, name: &str) -> f64 {
        headroom_stack::http::metric_sum(&self.stack.envoy_stats(), name)
    }

    /// Value of one of headroom's stats (`headroom_shed`, ...): Envoy's, or with the endpoint
    /// picker in front its `/metrics` (the same names).
    pub fn headroom_stat(&self, name: &str) -> f64 {
        match self.stack.state.epp {
            Some(epp) => {
                let text = headroom_stack::http::get(epp, "/metrics").map(|(_, body)| body).unwrap_or_default();
                headroom_stack::http::metric_sum(&text, name)
            }
            None => self.envoy_stat(name),
        }
    }
}

/// `plugin` with a callout budget of a second, for tests that read the routed path on a
/// stack's first requests rather than the callout's time budget (`faults.rs` times that out
/// on purpose). A fresh stack's first call on a busy 2-core CI host once took longer than
/// the 50 ms default, and the request went to Envoy's balancing instead.
pub fn patient(mut plugin: Value) -> Value {
    if let Some(fields) = plugin.as_object_mut() {
        fields.entry("predictor_timeout_ms").or_insert(Value::from(1000));
    }
    plugin
}

/// The SLO headers most tests send.
pub const SLO: [(&str, &str); 3] =
    [("x-slo-ttft-ms", "2000"), ("x-slo-tpot-ms", "100"), ("x-prediction-based-scheduling", "true")];
