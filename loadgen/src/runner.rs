//! Sending a workload open-loop and measuring each request as the client sees it.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use headroom_protocol::meter::ResponseMeter;
use headroom_protocol::{headers, Served, Slo, Unstreamed};
use serde::{Deserialize, Serialize};

use crate::workload::RequestSpec;

/// Where and how to send.
#[derive(Debug, Clone)]
pub struct Target {
    /// Gateway base URL, e.g. `http://127.0.0.1:10000`.
    pub url: String,
    pub model: String,
    /// Send the SLO and priority headers.
    pub slo_headers: bool,
    /// Value of `x-prediction-based-scheduling` (`None`: header not sent).
    pub prediction_based: Option<bool>,
    /// Give up on one request after this long.
    pub timeout: Duration,
}

impl Target {
    /// SLO traffic through a gateway at `url`: SLO and priority headers, prediction-based
    /// scheduling asked for, the simulated model, two minutes per request at most.
    pub fn slo_routed(url: String) -> Target {
        Target {
            url,
            model: "sim-llama-8b".into(),
            slo_headers: true,
            prediction_based: Some(true),
            timeout: Duration::from_secs(120),
        }
    }
}

/// What happened to one request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    pub index: usize,
    pub class: String,
    pub at_s: f64,
    pub stream: bool,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub slo_ttft_ms: Option<f64>,
    pub slo_tpot_ms: Option<f64>,
    pub priority: i32,
    /// HTTP status (0: no response).
    pub status: u16,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    pub output_tokens: Option<u32>,
    /// `x-served-by` of the model server.
    pub served_by: Option<String>,
    /// `x-headroom-endpoint` (the filter's choice), when debug headers are on.
    pub chosen: Option<String>,
    /// `x-headroom-tier`, when debug headers are on.
    pub tier: Option<String>,
    /// The chosen endpoint's predicted TTFT and TPOT (ms; `x-headroom-predicted-*`), when
    /// debug headers are on: set beside `ttft_ms`/`tpot_ms` they show how far the
    /// predictions behind each placement were off, per request (absent in older files).
    #[serde(default)]
    pub predicted_ttft_ms: Option<f64>,
    #[serde(default)]
    pub predicted_tpot_ms: Option<f64>,
    /// Flow control's outcome for it (`x-headroom-flow`: immediate, released, unmeetable, ...)
    /// and the time it waited at the gateway (`x-headroom-queued-ms`), when debug headers are
    /// on and flow control answered: which requests a queue held, and what their wait cost.
    #[serde(default)]
    pub flow: Option<String>,
    #[serde(default)]
    pub queued_ms: Option<f64>,
    pub error: Option<String>,
    /// Its session and the conversation turn it was (from 0), in the workloads with
    /// sessions: whether a later turn went where its conversation is cached shows in the
    /// server it was served by and in the later turns' TTFT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
}

impl Outcome {
    /// Whether the request met its SLOs: a 200 that met every goal [`Slo::met_by`] judges,
    /// a request not streamed by the deadline its goals imply for the whole response
    /// ([`Unstreamed::ByDeadline`]: its client sees no first token).
    pub fn met_slo(&self) -> bool {
        let whole = Unstreamed::ByDeadline { max_tokens: self.max_tokens };
        self.status == 200 && self.slo().met_by(&self.served(), whole).unwrap_or(true)
    }

    /// The goals it stated.
    pub fn slo(&self) -> Slo {
        Slo { ttft_ms: self.slo_ttft_ms, tpot_ms: self.slo_tpot_ms }
    }

    /// What its client saw.
    pub fn served(&self) -> Served {
        Served { streamed: self.stream, ttft_ms: self.ttft_ms, tpot_ms: self.tpot_ms, e2e_ms: self.e2e_ms }
    }

    pub fn shed(&self) -> bool {
        self.status == 429
    }

    /// What a request that missed its SLOs missed, by [`Outcome::met_slo`]'s rule (`None`
    /// when it met them): `shed` (a 429), `failed` (no 200 otherwise), `e2e` (not streamed: its
    /// whole response came after the deadline), else `ttft`, `tpot` or `ttft+tpot`.
    pub fn missed(&self) -> Option<&'static str> {
        if self.met_slo() {
            return None;
        }
        if self.shed() {
            return Some("shed");
        }
        if self.status != 200 {
            return Some("failed");
        }
        if !self.stream {
            return Some("e2e");
        }
        let [ttft, tpot] = self.slo().met(self.ttft_ms, self.tpot_ms).map(|met| met == Some(false));
        Some(match (ttft, tpot) {
            (true, true) => "ttft+tpot",
            (false, true) => "tpot",
            _ => "ttft",
        })
    }
}

/// Sends every request of `workload` at its time (open loop) and waits for all.
pub async fn run(target: &Target, workload: &[RequestSpec]) -> anyhow::Result<Vec<Outcome>> {
    run_with_trailing(target, workload, workload.len()).await
}

/// [`run`] for the first `measured` requests of `workload`; the rest only keep the load on
/// while any of those is unfinished: each is sent at its time until the last measured
/// request has ended, then the ones still running are dropped, and none is returned. So
/// the last measured requests decode in a fleet as loaded as the first ones did, not in
/// one draining after the traffic stops (on short-long, the answers sent in a step's
/// last seconds decoded at 22 ms per token against 31 ms at its start).
pub async fn run_with_trailing(
    target: &Target,
    workload: &[RequestSpec],
    measured: usize,
) -> anyhow::Result<Vec<Outcome>> {
    let client = reqwest::Client::builder().timeout(target.timeout).pool_max_idle_per_host(256).build()?;
    let start = tokio::time::Instant::now();
    let measured = measured.min(workload.len());
    let mut tasks = Vec::with_capacity(measured);
    let mut trailing = tokio::task::JoinSet::new();
    // How many measured requests have ended.
    let (ended, mut all_ended) = tokio::sync::watch::channel(0usize);
    for (index, spec) in workload.iter().enumerate() {
        let due = start + Duration::from_secs_f64(spec.at_s);
        let (client, target, spec) = (client.clone(), target.clone(), spec.clone());
        if index < measured {
            tokio::time::sleep_until(due).await;
            let ended = ended.clone();
            tasks.push(tokio::spawn(async move {
                let outcome = send_one(&client, &target, index, &spec).await;
                ended.send_modify(|n| *n += 1);
                outcome
            }));
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = all_ended.wait_for(|n| *n >= measured) => break,
        }
        trailing.spawn(async move { send_one(&client, &target, index, &spec).await });
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await?);
    }
    trailing.shutdown().await;
    Ok(out)
}

/// The body a client sends for request `index` of a workload: an OpenAI completion, its
/// prompt [`RequestSpec::prompt`]. The simulated-time benchmark sends the same
/// (`headroom-bench sim`).
pub fn request_body(target: &Target, index: usize, spec: &RequestSpec) -> String {
    let mut body = serde_json::json!({
        "model": target.model,
        "prompt": spec.prompt(index),
        "max_tokens": spec.max_tokens,
        "stream": spec.stream,
    });
    if spec.stream {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body.to_string()
}

/// The headers a client sends beside `content-type`: the SLOs, the priority and the
/// prediction-based hint, as `target` says.
pub fn request_headers(target: &Target, spec: &RequestSpec) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    if target.slo_headers {
        if let Some(t) = spec.class.ttft_ms {
            headers.push((headers::SLO_TTFT[1], t.to_string()));
        }
        if let Some(t) = spec.class.tpot_ms {
            headers.push((headers::SLO_TPOT[1], t.to_string()));
        }
        headers.push((headers::PRIORITY, spec.class.priority.to_string()));
    }
    if let Some(p) = target.prediction_based {
        headers.push((headers::PREDICTION_BASED, p.to_string()));
    }
    if let Some(c) = &spec.conversation {
        headers.push((headers::SESSION_ID, c.session_id(spec.run)));
    }
    headers
}

impl Outcome {
    /// Request `index` as sent, before anything came back.
    pub fn sent(index: usize, spec: &RequestSpec) -> Outcome {
        Outcome {
            index,
            class: spec.class.name.clone(),
            at_s: spec.at_s,
            stream: spec.stream,
            prompt_tokens: spec.prompt_tokens,
            max_tokens: spec.max_tokens,
            slo_ttft_ms: spec.class.ttft_ms,
            slo_tpot_ms: spec.class.tpot_ms,
            priority: spec.class.priority,
            session: spec.conversation.as_ref().map(|c| c.session),
            turn: spec.conversation.as_ref().map(|c| c.turn),
            ..Default::default()
        }
    }

    /// Fills what the gateway's debug headers say of the request (`header` reads them): the
    /// chosen endpoint, its tier and predictions, flow control's outcome and the wait.
    pub fn read_debug_headers(&mut self, header: impl Fn(&str) -> Option<String>) {
        self.chosen = header(headers::DEBUG_ENDPOINT);
        self.tier = header(headers::DEBUG_TIER);
        let number = |name: &str| header(name).and_then(|v| v.parse::<f64>().ok());
        self.predicted_ttft_ms = number(headers::DEBUG_PREDICTED_TTFT);
        self.predicted_tpot_ms = number(headers::DEBUG_PREDICTED_TPOT);
        self.flow = header(headers::DEBUG_FLOW);
        self.queued_ms = number(headers::DEBUG_QUEUED);
    }
}

async fn send_one(client: &reqwest::Client, target: &Target, index: usize, spec: &RequestSpec) -> Outcome {
    let body = request_body(target, index, spec);
    let mut req = client.post(format!("{}/v1/completions", target.url)).header("content-type", "application/json");
    for (name, value) in request_headers(target, spec) {
        req = req.header(name, value);
    }
    let mut outcome = Outcome::sent(index, spec);
    let started = Instant::now();
    let since_start = |at: Instant| at.duration_since(started).as_nanos() as u64;
    let response = match req.body(body).send().await {
        Ok(r) => r,
        Err(e) => {
            outcome.error = Some(e.to_string());
            outcome.e2e_ms = started.elapsed().as_secs_f64() * 1000.0;
            return outcome;
        }
    };
    outcome.status = response.status().as_u16();
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    outcome.served_by = header(headers::SERVED_BY);
    outcome.read_debug_headers(header);
    let streaming = header("content-type").is_some_and(|c| c.starts_with("text/event-stream"));
    let mut meter = ResponseMeter::new(streaming, 0, 4 << 20);
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => meter.on_chunk(&bytes, since_start(Instant::now())),
            Err(e) => {
                outcome.error = Some(e.to_string());
                break;
            }
        }
    }
    let m = meter.finish(since_start(Instant::now()));
    outcome.e2e_ms = m.e2e_ms;
    outcome.ttft_ms = m.ttft_ms;
    outcome.tpot_ms = m.tpot_ms;
    outcome.output_tokens = m.output_tokens;
    outcome
}

#[cfg(test)]
mod tests {
    // Test code: a failed unwrap is a failed test.
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::workload::SloClass;

    /// A server on 127.0.0.1 answering every request after `delay`; counts what it received.
    async fn slow_server(delay: Duration) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(AtomicUsize::new(0));
        let count = received.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // One request: headers, then content-length bytes of body.
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match conn.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        while buf.len() < end + 4 + length {
                            match conn.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.drain(..end + 4 + length);
                        count.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(delay).await;
                        let body = r#"{"choices":[{"text":"x"}]}"#;
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, received)
    }

    #[test]
    fn a_miss_names_what_missed_and_only_a_miss_does() {
        let streamed = |ttft, tpot| Outcome {
            status: 200,
            stream: true,
            slo_ttft_ms: Some(100.0),
            slo_tpot_ms: Some(20.0),
            ttft_ms: ttft,
            tpot_ms: tpot,
            ..Default::default()
        };
        assert_eq!(streamed(Some(90.0), Some(19.0)).missed(), None);
        assert_eq!(streamed(Some(190.0), Some(19.0)).missed(), Some("ttft"));
        assert_eq!(streamed(None, None).missed(), Some("ttft"), "no first token is a late one");
        assert_eq!(streamed(Some(90.0), Some(21.0)).missed(), Some("tpot"));
        assert_eq!(streamed(Some(190.0), Some(21.0)).missed(), Some("ttft+tpot"));
        assert_eq!(Outcome { status: 429, ..streamed(None, None) }.missed(), Some("shed"));
        assert_eq!(Outcome { status: 503, ..streamed(None, None) }.missed(), Some("failed"));
        let whole = Outcome { stream: false, max_tokens: 10, e2e_ms: 400.0, ..streamed(None, None) };
        assert_eq!(whole.missed(), Some("e2e"), "100 + 10 x 20 = 300 ms for the whole response");
        // Without SLOs nothing can be missed, streamed or not.
        let free = Outcome { status: 200, e2e_ms: 1e6, ..Default::default() };
        assert!(free.met_slo() && free.missed().is_none());
    }

    fn at(at_s: f64) -> RequestSpec {
        RequestSpec {
            at_s,
            prompt_tokens: 10,
            max_tokens: 1,
            stream: false,
            class: SloClass::batch(),
            shared_prefix: None,
            conversation: None,
            run: 0,
        }
    }

    #[tokio::test]
    async fn the_trailing_traffic_keeps_the_load_on_until_the_measured_requests_end_and_no_longer() {
        let (url, received) = slow_server(Duration::from_millis(400)).await;
        let target = Target { timeout: Duration::from_secs(10), ..Target::slo_routed(url) };
        // Three measured requests at once, each answered 400 ms later; then one every 100 ms for 3 s.
        let workload: Vec<RequestSpec> = (0..3).map(|_| at(0.0)).chain((1..=30).map(|k| at(0.1 * k as f64))).collect();
        let started = Instant::now();
        let outcomes = run_with_trailing(&target, &workload, 3).await.unwrap();
        let took = started.elapsed();
        assert_eq!(outcomes.len(), 3, "only the measured requests are returned");
        assert!(outcomes.iter().all(|o| o.status == 200 && o.index < 3), "{outcomes:?}");
        // The trailing requests due while the measured ones ran were sent (about 4), none after.
        let sent = received.load(Ordering::SeqCst);
        assert!((5..=10).contains(&sent), "the load held while they ran, and stopped: {sent} received");
        assert!(took < Duration::from_millis(1500), "did not wait for the trailing requests: {took:?}");

        // With every request measured, `run` sends and waits for all.
        let (url, received) = slow_server(Duration::from_millis(100)).await;
        let target = Target { timeout: Duration::from_secs(10), ..Target::slo_routed(url) };
        let outcomes = run(&target, &workload).await.unwrap();
        assert_eq!((outcomes.len(), received.load(Ordering::SeqCst)), (33, 33));
    }
}
