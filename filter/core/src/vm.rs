//! State shared by every request of one Wasm VM (one Envoy worker thread), and
//! what the VM does on its own: configure, flush the outbox on the tick, and
//! keep the predictor replicas' health.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use headroom_protocol::health::PassiveHealth;
use headroom_protocol::{codec, paths};

use crate::coalesce::{CallId, Coalescer, Delivery, Ride};
use crate::fallback::StateCache;
use crate::host::{callout_status, Event, FallbackCause, Host, Level};
use crate::outbox::{Batch, Outbox, Outcome};
use crate::shards::Shards;
use crate::stream::PredictStream;
use crate::token_count::TokenCounts;
use crate::FilterConfig;
use headroom_protocol::rng::Rng;

/// Timeout of a dispatch or report batch call.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Requests one VM placed per endpoint and that have not ended.
#[derive(Debug, Default)]
pub struct Placed(HashMap<String, u32>);

impl Placed {
    /// A request was sent to `endpoint`.
    pub fn started(&mut self, endpoint: &str) {
        *self.0.entry(endpoint.to_string()).or_insert(0) += 1;
    }

    /// A request placed on `endpoint` ended; an endpoint with none left is forgotten, so
    /// the map holds only endpoints with requests open.
    pub fn ended(&mut self, endpoint: &str) {
        if let Some(n) = self.0.get_mut(endpoint) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.0.remove(endpoint);
            }
        }
    }

    /// Requests open on `endpoint`.
    pub fn at(&self, endpoint: &str) -> u32 {
        self.0.get(endpoint).copied().unwrap_or(0)
    }
}

/// One VM's state.
pub struct Vm {
    pub config: Rc<FilterConfig>,
    pub rng: Rng,
    /// Last endpoint states from the predictor, for the fallback.
    pub states: StateCache,
    /// Requests this VM placed on each endpoint and not yet ended: the one load figure
    /// that stays live when the predictor is gone and the fallback ranks frozen states.
    pub placed: Placed,
    /// What each endpoint answered this VM: one that keeps failing is left out of its
    /// choices, the fallback's included, for a while (`headroom_protocol::health`).
    pub health: PassiveHealth,
    /// Dispatches and reports waiting for the tick.
    pub outbox: Outbox,
    /// Predict calls coalesced per round trip (`coalesce`).
    pub predictions: Coalescer,
    /// The stream the coalesced calls go on while it is open (`stream`).
    pub stream: PredictStream,
    /// Each model's bytes per prompt token, learned from the responses' usage blocks.
    pub tokens: TokenCounts,
    /// Random per VM: with `next_request`, makes the ids the filter tracks requests by.
    vm_nonce: u64,
    next_request: u64,
    /// The predictor replica that owns this pool, with failover.
    shards: Shards,
    /// `Bearer <predictor_token>`, when one is configured.
    authorization: Option<String>,
    /// Batch calls under way: token -> (cluster called, batch).
    sending: HashMap<u32, (String, Batch)>,
    /// Batches riding on coalesced predict calls under way, by the call.
    riding: HashMap<CallId, Vec<Batch>>,
    /// When the oldest call sent since the predictor last answered anything went out.
    unanswered_since_ms: Option<u64>,
}

/// A predictor that has answered no call for this long, with one sent, is taken to be
/// silent (frozen, starved of CPU): new requests stop offering to wait in its flow queue
/// (whose calls may rightly stay open for `flow_max_wait_ms`), so they keep the short
/// callout budget and fall back within `predictor_timeout_ms`. Its first answer ends it.
pub const SILENT_MS: u64 = 1_000;

impl Vm {
    /// A VM configured from `config`; `seed` should differ per VM (it seeds the
    /// weighted picks and the request-id nonce).
    pub fn new(config: FilterConfig, seed: u64) -> Vm {
        let config = Rc::new(config);
        Vm {
            rng: Rng::new(seed),
            states: StateCache::default(),
            placed: Placed::default(),
            health: PassiveHealth::new(config.passive_health),
            outbox: Outbox::new(config.max_queued, config.max_batch, config.max_batch_bytes),
            predictions: Coalescer::default(),
            stream: PredictStream::default(),
            tokens: TokenCounts::default(),
            vm_nonce: Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15).next_u64(),
            next_request: 0,
            shards: Shards::new(config.predictor_clusters(), &config.pool),
            authorization: authorization(&config),
            sending: HashMap::new(),
            riding: HashMap::new(),
            unanswered_since_ms: None,
            config,
        }
    }

    /// Takes a new configuration and keeps what is queued: a reconfigure does not
    /// lose the dispatches and reports waiting for the tick.
    pub fn reconfigure(&mut self, config: FilterConfig) {
        self.outbox.set_limits(config.max_batch, config.max_batch_bytes);
        self.shards = Shards::new(config.predictor_clusters(), &config.pool);
        self.authorization = authorization(&config);
        self.health.set_policy(config.passive_health);
        self.config = Rc::new(config);
    }

    /// A request id unique per VM and request, never taken from the client: reused or
    /// forged `x-request-id`s cannot collide in the predictor's tracking or pick a
    /// request's holdout side.
    pub fn new_request_id(&mut self) -> String {
        self.next_request += 1;
        format!("{:016x}-{}", self.vm_nonce, self.next_request)
    }

    /// The headers of a call to the predictor: `path`, the body's format, the token.
    pub fn call_headers<'a>(&'a self, path: &'a str) -> Vec<(&'a str, &'a str)> {
        call_headers(&self.config, self.authorization.as_deref(), path)
    }

    /// The predictor cluster to call now.
    pub fn predictor_cluster(&self, now_ms: u64) -> String {
        self.shards.current(now_ms).to_string()
    }

    /// A call to the predictor went out at `now_ms`.
    pub fn asked(&mut self, now_ms: u64) {
        self.unanswered_since_ms.get_or_insert(now_ms);
    }

    /// Whether the predictor has answered nothing for [`SILENT_MS`] since a call went out.
    pub fn predictor_silent(&self, now_ms: u64) -> bool {
        self.unanswered_since_ms.is_some_and(|t| now_ms.saturating_sub(t) >= SILENT_MS)
    }

    /// Records how a call to `cluster` went: no answer, a timeout or a 5xx count
    /// against the replica; any other answer shows it alive.
    pub fn record_call(&mut self, host: &mut dyn Host, cluster: &str, status: Option<u16>) {
        // A 401 or 403 is a replica that refuses this filter's token: of no use to it, so it
        // counts as failing (and is named in the log when skipped), not as alive.
        let alive = status.is_some_and(|s| s != 0 && s < 500 && s != 401 && s != 403);
        if alive {
            self.unanswered_since_ms = None;
        }
        if self.shards.record(cluster, alive, host.now_ms()) {
            host.record(Event::PredictorEjected);
            host.log(Level::Warn, &format!("headroom: predictor cluster {cluster} failing; using the next replica"));
        }
    }

    /// Sends what the outbox has ready: one dispatch batch and one report batch at most
    /// under way at a time (dispatch batches must complete in order, `outbox` module).
    pub fn flush(&mut self, host: &mut dyn Host) {
        let (sending_dispatches, sending_reports) = self.under_way();
        let now = host.now_ms();
        let shards = &self.shards;
        let route = |home: Option<&str>| shards.route(home, now).to_string();
        let mut ready = Vec::new();
        if !sending_dispatches {
            ready.extend(self.outbox.next_dispatches(&route).map(|b| (paths::DISPATCH, b)));
        }
        if !sending_reports {
            ready.extend(self.outbox.next_reports(&route).map(|b| (paths::REPORT, b)));
        }
        for (path, (batch, body)) in ready {
            let cluster = batch.to().to_string();
            match host.http_call(&cluster, &self.call_headers(path), &body, FLUSH_TIMEOUT) {
                Ok(token) => {
                    self.asked(now);
                    self.sending.insert(token, (cluster.clone(), batch));
                }
                Err(_) => {
                    self.record_call(host, &cluster, None);
                    self.outbox.sent(batch, Outcome::Failed);
                }
            }
        }
        host.record(Event::Outbox(self.outbox.take_counts()));
    }

    /// The root's wake-up arrived (`Host::wake`): the coalesced predict calls waiting go.
    pub fn on_wake(&mut self, host: &mut dyn Host) -> Vec<Delivery> {
        self.predictions.woke();
        self.send_predictions(host)
    }

    /// The flush tick: the outbox goes; coalesced requests whose call never went (the one
    /// ahead of them hangs) fall back, as do those whose answer on the stream is overdue (the
    /// stream is reset); the stream is kept open; any left waiting go (a wake-up the host lost).
    pub fn on_tick(&mut self, host: &mut dyn Host) -> Vec<Delivery> {
        self.flush(host);
        let now = host.now_ms();
        let mut deliveries = self.predictions.expire(now, self.config.predictor_timeout_ms);
        if let Some(call) = self.predictions.overdue_on_stream(now, self.config.predictor_timeout_ms) {
            self.stream.reset(host);
            deliveries.extend(self.end_call(host, call, FallbackCause::Timeout));
        }
        // A stream reset here (the replica failed over, or streams were switched off) will
        // not answer the call out on it: its requests fall back now, not at its timeout.
        let reset = if self.config.predict_stream && self.config.batch_predictions {
            let cluster = self.predictor_cluster(now);
            let metadata: Vec<(&str, &str)> =
                self.authorization.as_deref().map(|auth| ("authorization", auth)).into_iter().collect();
            self.stream.maintain(host, &cluster, &metadata)
        } else {
            self.stream.reset(host)
        };
        if let Some(token) = reset {
            deliveries.extend(self.end_call(host, CallId::Stream(token), FallbackCause::Unavailable));
        }
        deliveries.extend(self.send_predictions(host));
        deliveries
    }

    /// The predictor answered the headers of stream `token`: the next calls go on it.
    pub fn on_stream_headers(&mut self, host: &mut dyn Host, token: u32) {
        self.stream.on_headers(host, token);
    }

    /// A message arrived on stream `token` (`size` bytes): the answer to the call out on it,
    /// each request's share, then the next call sent.
    pub fn on_stream_message(&mut self, host: &mut dyn Host, token: u32, size: usize) -> Vec<Delivery> {
        if !self.stream.is_open(token) {
            return Vec::new();
        }
        let Some(answered) = self.predictions.answered_on_stream(host, token, size) else {
            host.log(Level::Warn, "headroom: a predict stream message with no call out; ignored");
            return Vec::new();
        };
        self.stream.on_answer();
        self.unanswered_since_ms = None;
        self.settle(host, CallId::Stream(token), answered)
    }

    /// A coalesced call answered (the cluster it went to, the status, each request's share):
    /// the replica's health counts it, what rode on it is settled by the status, and the
    /// next call goes (before those requests resume, while the host still runs the root's
    /// callback).
    fn settle(
        &mut self,
        host: &mut dyn Host,
        call: CallId,
        (cluster, status, mut deliveries): (String, Option<u16>, Vec<Delivery>),
    ) -> Vec<Delivery> {
        self.record_call(host, &cluster, status);
        let outcome = Outcome::of(status);
        for batch in self.riding.remove(&call).unwrap_or_default() {
            self.outbox.sent(batch, outcome);
        }
        deliveries.extend(self.send_predictions(host));
        deliveries
    }

    /// Stream `token` closed with gRPC `status`: the call out on it falls back, and the next
    /// go as HTTP calls until the tick opens another stream.
    pub fn on_stream_closed(&mut self, host: &mut dyn Host, token: u32, status: u32) -> Vec<Delivery> {
        if !self.stream.on_closed(host, token, status) {
            return Vec::new();
        }
        let mut deliveries = self.end_call(host, CallId::Stream(token), FallbackCause::Unavailable);
        deliveries.extend(self.send_predictions(host));
        deliveries
    }

    /// Ends `call` without an answer: its requests fall back for `cause`, what rode on it
    /// is queued again, and the replica's health counts a failure.
    fn end_call(&mut self, host: &mut dyn Host, call: CallId, cause: FallbackCause) -> Vec<Delivery> {
        let Some((cluster, deliveries)) = self.predictions.fail(call, cause) else { return Vec::new() };
        self.record_call(host, &cluster, None);
        for batch in self.riding.remove(&call).unwrap_or_default() {
            self.outbox.sent(batch, Outcome::Failed);
        }
        deliveries
    }

    /// Whether a dispatch batch and a report batch are under way, alone or riding: each
    /// kind completes in order, one batch at a time (`outbox`).
    fn under_way(&self) -> (bool, bool) {
        let batches = self.sending.values().map(|(_, b)| b).chain(self.riding.values().flatten());
        batches.fold((false, false), |(d, r), b| match b {
            Batch::Dispatches { .. } => (true, r),
            Batch::Reports { .. } => (d, true),
        })
    }

    /// Sends the coalesced predict calls waiting, if none is out; what could not be sent
    /// comes back as failed. The outbox's dispatches and reports bound for the replica
    /// called ride along (a quarter of `max_batch_bytes` each), unless a batch of their kind
    /// is already under way.
    pub fn send_predictions(&mut self, host: &mut dyn Host) -> Vec<Delivery> {
        if !self.predictions.ready() {
            return Vec::new();
        }
        let (dispatching, reporting) = self.under_way();
        let budget = self.config.max_batch_bytes / 4;
        let now = host.now_ms();
        let cluster = self.predictor_cluster(now);
        // Riders go only where the call surely goes: a stream still open to another
        // replica (it is switched on the next tick) carries none.
        let open = self.stream.open().map(|(token, to)| (token, to.to_string()));
        let rides = open.as_ref().is_none_or(|(_, to)| *to == cluster);
        let (dispatching, reporting) = (dispatching || !rides, reporting || !rides);
        let shards = &self.shards;
        let route = |home: Option<&str>| shards.route(home, now).to_string();
        let only = Some(cluster.as_str());
        let dispatches = if dispatching { None } else { self.outbox.take_dispatches(budget, &route, only) };
        let riding_through = dispatches.as_ref().map_or(0, |(b, _)| b.last_seq());
        let reports = if reporting { None } else { self.outbox.take_reports(budget, riding_through, &route, only) };
        let (mut riders, mut ride) = (Vec::new(), Ride::default());
        if let Some((batch, message)) = dispatches {
            riders.push(batch);
            ride.dispatches = message.dispatches;
        }
        if let Some((batch, message)) = reports {
            riders.push(batch);
            ride.reports = Some(message);
        }
        let headers = call_headers(&self.config, self.authorization.as_deref(), paths::PREDICT_BATCH);
        let timeout = Duration::from_millis(self.config.predictor_timeout_ms);
        // On the stream while it is open; as an HTTP call otherwise, or when the stream
        // would not take the message (it is then reset, and reopened on a later tick).
        let mut stream_failed = false;
        let mut transport = |host: &mut dyn Host, body: &[u8]| {
            if let (Some((token, to)), false) = (&open, stream_failed) {
                match host.send_stream(*token, body) {
                    Ok(()) => return Ok((to.clone(), CallId::Stream(*token))),
                    Err(_) => stream_failed = true,
                }
            }
            host.http_call(&cluster, &headers, body, timeout)
                .map(|token| (cluster.clone(), CallId::Http(token)))
                .map_err(|_| FallbackCause::CallFailed)
        };
        let (failed, call) = self.predictions.send(host, self.config.max_batch_bytes, ride, &mut transport);
        if stream_failed {
            self.stream.reset(host);
        }
        if !failed.is_empty() {
            self.record_call(host, &cluster, None);
        }
        if call.is_some() {
            self.asked(host.now_ms());
        }
        match call {
            Some(call) if !riders.is_empty() => {
                self.riding.insert(call, riders);
            }
            Some(_) => {}
            None => riders.into_iter().for_each(|b| self.outbox.sent(b, Outcome::Failed)),
        }
        failed
    }

    /// The answer to a coalesced predict call `token`: each request's share, and then the
    /// next call sent (before those requests resume, while the host still runs the root's
    /// callback). `None` when `token` is not such a call.
    pub fn on_predictions_answer(
        &mut self,
        host: &mut dyn Host,
        token: u32,
        body_size: usize,
    ) -> Option<Vec<Delivery>> {
        let answered = self.predictions.answered(host, token, body_size)?;
        Some(self.settle(host, CallId::Http(token), answered))
    }

    /// The answer to batch call `token` arrived (its `:status` in the callout headers).
    pub fn on_batch_answer(&mut self, host: &mut dyn Host, token: u32) {
        let Some((cluster, batch)) = self.sending.remove(&token) else { return };
        let status = callout_status(host);
        let outcome = Outcome::of(status);
        let delivered_dispatches = outcome != Outcome::Failed && matches!(batch, Batch::Dispatches { .. });
        self.record_call(host, &cluster, status);
        self.outbox.sent(batch, outcome);
        // Reports waiting for these dispatches may go now rather than on the next tick.
        if delivered_dispatches {
            self.flush(host);
        }
    }
}

fn call_headers<'a>(
    config: &'a FilterConfig,
    authorization: Option<&'a str>,
    path: &'a str,
) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", config.predictor_authority.as_str()),
        ("content-type", codec::MSGPACK),
        ("accept", codec::MSGPACK),
    ];
    if let Some(auth) = authorization {
        headers.push(("authorization", auth));
    }
    headers
}

fn authorization(config: &FilterConfig) -> Option<String> {
    config.predictor_token.as_ref().map(|t| format!("Bearer {t}"))
}
