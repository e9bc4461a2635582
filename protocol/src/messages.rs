//! The messages of the filter <-> predictor contract.
//!
//! Each side sends only what it alone knows. The predictor keeps a record of every
//! request it predicts (its features, each endpoint's state and predictions); a dispatch
//! then names the request and the endpoint chosen, and a report ([`Report`]) carries only
//! what the gateway measured. The predictor completes a report from its record into an
//! [`Observation`] and learns from that, never from what the gateway says the predictor said.

use serde::{Deserialize, Serialize};

/// Latency goals a caller stated for one request, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Time to first token goal.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Time per output token goal.
    #[serde(default)]
    pub tpot_ms: Option<f64>,
}

impl Slo {
    /// True when the caller stated at least one goal.
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some()
    }

    /// Whether a streamed request measured at `ttft_ms` and `tpot_ms` met each goal,
    /// `[ttft, tpot]`: `None` where the goal was not stated, or for TPOT not measured (it
    /// needs two tokens), so not judged. A stated TTFT goal with no first token seen is
    /// missed: the client saw none. The one definition of an SLO violation, with
    /// [`Slo::met_by`] for a whole request: the filter's `slo_violation` stats, the
    /// predictor's `inference_objective_request_slo_violation`, its tier precision and the
    /// benchmark's attainment all read it.
    pub fn met(&self, ttft_ms: Option<f64>, tpot_ms: Option<f64>) -> [Option<bool>; 2] {
        let seen = |v: Option<f64>| v.filter(|v| v.is_finite());
        let ttft = self.ttft_ms.map(|goal| seen(ttft_ms).is_some_and(|t| t <= goal));
        let tpot = self.tpot_ms.and_then(|goal| Some(seen(tpot_ms)? <= goal));
        [ttft, tpot]
    }

    /// Whether every goal judged in `judged` ([`Slo::met`]) was met (`None`: none was judged).
    pub fn all_met(judged: [Option<bool>; 2]) -> Option<bool> {
        judged.iter().any(Option::is_some).then(|| judged.iter().flatten().all(|m| *m))
    }

    /// Whether a finished request met every goal it stated that is judged (`None`: none is).
    /// Streamed, by [`Slo::met`]; not streamed, by `unstreamed`.
    pub fn met_by(&self, r: &Served, unstreamed: Unstreamed) -> Option<bool> {
        if r.streamed {
            return Slo::all_met(self.met(r.ttft_ms, r.tpot_ms));
        }
        match unstreamed {
            Unstreamed::NotJudged => None,
            Unstreamed::ByDeadline { max_tokens } => {
                let deadline = self.ttft_ms.unwrap_or(0.0) + self.tpot_ms.unwrap_or(0.0) * f64::from(max_tokens);
                (deadline > 0.0).then_some(r.e2e_ms <= deadline)
            }
        }
    }
}

/// What a finished request showed its client, as [`Slo::met_by`] judges it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Served {
    /// Streamed (SSE): its first token and the time between tokens are seen.
    pub streamed: bool,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
}

/// How a request that was not streamed is judged: its client sees no first token, only the
/// whole response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstreamed {
    /// Not judged. The gateway's and the predictor's counts (`slo_violation`,
    /// `inference_objective_request_slo_violation`, `headroom_slo_requests`): their goals are
    /// per token, and a whole response's first token is its last.
    NotJudged,
    /// By the deadline its goals imply for its whole response, `ttft + tpot * max_tokens`:
    /// the benchmark's rule, what its client waited for.
    ByDeadline { max_tokens: u32 },
}

/// What the filter knows about a request before routing it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestFeatures {
    /// The `model` field of the OpenAI body.
    pub model: String,
    /// Prompt length in tokens: the model's own count of token ids, else the gateway's
    /// estimate from the prompt's bytes ([`crate::openai::PromptSize`]).
    pub input_tokens: u32,
    /// Chained hashes of the prompt's blocks ([`crate::tokens::prefix_block_hashes`]).
    #[serde(default)]
    pub prefix_hashes: Vec<u64>,
    /// Whether the response is streamed (SSE).
    #[serde(default)]
    pub streaming: bool,
    /// `max_tokens` / `max_completion_tokens` of the body, when given.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub slo: Slo,
    /// Caller priority; below zero means the request may be shed.
    #[serde(default)]
    pub priority: i32,
    /// The caller asked to be placed by its goals (`x-prediction-based-scheduling: true`).
    /// Only then does its TPOT goal, while it runs, hold later requests on its endpoint to
    /// it (`predictor-core`'s books): a goal the router did not place by reserves nothing.
    #[serde(default)]
    pub prediction_based: bool,
    /// The sequences the engine runs for it (prompts of a list times `max(n, best_of)`),
    /// each booked as load; 0 is read as 1 ([`RequestFeatures::sequence_count`]).
    #[serde(default)]
    pub sequences: u32,
    /// The tenant (the fairness header's value, or the trusted header's when one is
    /// configured; empty: none). Flow control takes turns by it within a priority band, and
    /// a running TPOT goal holds later requests of its own tenant at its priority, and every
    /// tenant's below it, but not another tenant's at its priority: peers at one priority
    /// cannot reserve capacity from each other (`predictor-core`'s books).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
}

impl RequestFeatures {
    /// Nothing known of the request (a lean dispatch or report leaves its features out).
    pub fn is_unset(&self) -> bool {
        *self == RequestFeatures::default()
    }

    /// Whether the caller said the request may be refused (priority < 0): the one
    /// definition the filter's shedding and the predictor's queue both read.
    pub fn is_sheddable(&self) -> bool {
        self.priority < 0
    }

    /// The TPOT SLO that holds for this request: its stated one when it streams. A
    /// non-streaming caller never sees tokens one by one, so neither headroom nor the
    /// running requests' tightest TPOT SLO judges its TPOT.
    pub fn streamed_tpot_slo_ms(&self) -> Option<f64> {
        self.slo.tpot_ms.filter(|_| self.streaming)
    }

    /// The sequences the engine runs for it: at least one.
    pub fn sequence_count(&self) -> u32 {
        self.sequences.max(1)
    }
}

/// `POST /v1/predict` body: predict every endpoint of `pool` for one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictRequest {
    pub pool: String,
    pub request_id: String,
    pub request: RequestFeatures,
    /// Set when the filter lets the predictor hold this request in its flow-control
    /// queue (docs/flow-control.md): the answer then comes when an endpoint has
    /// headroom for it, when its deadline passes, or at once with the reason it
    /// could not wait. Absent: answered at once, as before flow control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowTerms>,
}

/// How long and on what terms a request may wait in the predictor's queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowTerms {
    /// The longest the filter will wait for the answer (its callout timeout is this
    /// plus its usual predictor timeout).
    pub max_wait_ms: u64,
    /// The filter's `tpot_buffer` and `ttft_buffer`, so "has headroom" means the same on both
    /// sides (a filter that predates `ttft_buffer` sends none: 1).
    pub tpot_buffer: f64,
    #[serde(default = "one")]
    pub ttft_buffer: f64,
    /// A request with headroom still waits while the queue ahead of it at its best endpoint
    /// (its predicted TTFT there less its own TTFT on that endpoint idle) is above this,
    /// unless its own SLO is about to run out (the filter's `flow_dispatch_horizon_ms`).
    pub dispatch_horizon_ms: u64,
    /// The tenant as filters before [`RequestFeatures::tenant`] sent it: read when the
    /// request names none, never sent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fairness_id: String,
}

fn one() -> f64 {
    1.0
}

/// What flow control did with a request that offered to wait ([`FlowTerms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowOutcome {
    /// An endpoint had headroom on arrival: not queued.
    Immediate,
    /// Waited, then an endpoint had headroom for what is left of its TTFT SLO.
    Released,
    /// Its deadline passed while it waited (or no endpoint freed in `max_wait_ms`):
    /// a sheddable request is shed, any other goes to the least bad endpoint.
    Expired,
    /// The fleet is saturated: the queue ahead would outlast its SLO. Sheddable
    /// requests are shed at once rather than after waiting.
    Saturated,
    /// The queue (its band or in total) is full: not queued, placed as without flow control.
    QueueFull,
    /// No endpoint can meet its SLO now, and waiting would not help (a model server serves
    /// prompts in order: sent later, it finishes no sooner): not queued, placed as without
    /// flow control (the least bad endpoint, or shed by the filter's policy).
    Unmeetable,
}

impl FlowOutcome {
    pub const ALL: [FlowOutcome; 6] = [
        FlowOutcome::Immediate,
        FlowOutcome::Released,
        FlowOutcome::Expired,
        FlowOutcome::Saturated,
        FlowOutcome::QueueFull,
        FlowOutcome::Unmeetable,
    ];

    /// Its name in stats and metrics (`headroom.flow.<name>`), as on the wire.
    pub fn name(self) -> &'static str {
        match self {
            FlowOutcome::Immediate => "immediate",
            FlowOutcome::Released => "released",
            FlowOutcome::Expired => "expired",
            FlowOutcome::Saturated => "saturated",
            FlowOutcome::QueueFull => "queue_full",
            FlowOutcome::Unmeetable => "unmeetable",
        }
    }
}

/// Flow control's part of a [`PredictResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowAnswer {
    pub outcome: FlowOutcome,
    /// Time spent in the queue: the filter judges headroom against the TTFT SLO minus it.
    pub waited_ms: f64,
    /// Where an `immediate` or `released` request was cleared to go (addresses, the one it
    /// was counted at first): the endpoints with room for it whose queue is within the
    /// dispatch horizon, or where its SLO presses. The filter's policy places it among these,
    /// so the horizon flow control checked holds where the request goes. Empty for the other
    /// outcomes, and from a predictor that does not say: the policy then places it anywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cleared: Vec<String>,
}

/// What the predictor knows of one endpoint at predict time. These are the
/// model's input features; the predictor keeps the state it predicted a request with in
/// its record of the request, so training sees exactly what prediction saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointState {
    /// `vllm:num_requests_running` at the last scrape.
    pub running: u32,
    /// `vllm:num_requests_waiting` at the last scrape.
    pub waiting: u32,
    /// `vllm:kv_cache_usage_perc` (or the older `gpu_cache_usage_perc`), 0..=1.
    pub kv_usage: f64,
    /// Share of this request's prefix blocks the endpoint is believed to hold, 0..=1.
    pub prefix_match: f64,
    /// Tightest TPOT SLO among requests in flight there, if any stated one.
    #[serde(default)]
    pub tightest_tpot_slo_ms: Option<f64>,
    /// Requests in flight there whose TPOT SLO is tighter than this request's own: the
    /// decodes its own would slow past theirs (0 unless it streams with a TPOT SLO).
    #[serde(default)]
    pub tighter_tpot_in_flight: u32,
    /// Requests dispatched there and not yet reported.
    pub in_flight: u32,
    /// Uncached prompt tokens of in-flight requests still expected to be in prefill.
    pub uncached_tokens_in_flight: u64,
    /// Of those, the tokens the engine has likely not prefilled yet: the prompts drained
    /// first come first served from their dispatch, at the endpoint's cost per prompt token
    /// (the analytic prior's, for its hardware class). A prompt sent 40 ms ago is mostly
    /// done; counted whole until its first token is seen, it read as work ahead of every
    /// request placed meanwhile. `None` from a predictor that predates it.
    #[serde(default)]
    pub prefill_backlog_tokens: Option<u64>,
    /// Prompt plus expected output tokens of all in-flight requests.
    pub tokens_in_flight: u64,
    /// Age of the scraped metrics in milliseconds (`None`: never scraped).
    #[serde(default)]
    pub metrics_age_ms: Option<u64>,
    /// The endpoint's hardware class from the pool configuration (0: unknown).
    #[serde(default)]
    pub hardware_class: u32,
    /// The time between tokens it runs at now: from its inter-token latency histogram
    /// between scrapes, or where it has none, a moving average of the TPOTs reported there
    /// (`None`: neither yet).
    #[serde(default)]
    pub recent_tpot_ms: Option<f64>,
    /// Uncached prompt tokens dispatched there per second, recently (decaying over
    /// seconds): prefill work that will share the steps of a request sent now.
    #[serde(default)]
    pub prefill_tokens_per_s: f64,
    /// The longest prompt plus answer the endpoint takes, in its model's tokens (vLLM's
    /// `max_model_len`, read from its `/v1/models`; `None`: not known).
    #[serde(default)]
    pub max_context_tokens: Option<u32>,
    /// What one uncached prompt token costs the endpoint to prefill (ms of wall time): its
    /// hardware class's cost, the one the predictor drains its prefill backlog at. What a
    /// request moved off an endpoint caching its prompt adds where it goes is the cached
    /// tokens at this cost (the filter's `stay_where_cached`). `None`: not known, or from a
    /// predictor that predates it.
    #[serde(default)]
    pub prefill_ms_per_token: Option<f64>,
}

/// One candidate endpoint with its predictions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointPrediction {
    /// `ip:port` of the model server.
    pub address: String,
    /// Predicted time to first token; `None` when the predictor cannot say.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Predicted time per output token; `None` when the predictor cannot say.
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    pub state: EndpointState,
}

/// `POST /v1/predict` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictResponse {
    pub pool: String,
    /// Which model produced the predictions (e.g. `analytic-prior`).
    pub model_version: String,
    pub endpoints: Vec<EndpointPrediction>,
    /// Present when the request offered to wait ([`PredictRequest::flow`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowAnswer>,
}

/// `POST /v1/predict/batch` body: several requests' predictions in one call, and what the
/// worker owes the predictor besides.
///
/// A gateway worker that has a predict call out sends the requests that arrive meanwhile
/// together in its next call: Envoy's cost of a call (its HTTP client, a request and a
/// response over a socket) is then paid once per batch, not per request
/// (docs/performance.md). The worker's queued dispatches and reports ride along, so they
/// need no calls of their own while predict calls flow, and the predictor applies them
/// (dispatches, then reports) before it predicts: these predictions see every placement
/// the worker made before them. Requests that may wait in the flow-control queue go alone
/// to `/v1/predict`, because each is answered when it can go.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PredictBatch {
    pub requests: Vec<PredictRequest>,
    /// As in `/v1/dispatch`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dispatches: Vec<Dispatch>,
    /// As in `/v1/report`; a report may follow its dispatch in the same call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reports: Option<ReportBatch>,
}

/// `POST /v1/predict/batch` answer: `answers[i]` is what `/v1/predict` answers for `requests[i]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PredictBatchResponse {
    pub answers: Vec<PredictResponse>,
}

/// One routing decision: `request_id` went to `endpoint`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dispatch {
    pub pool: String,
    pub request_id: String,
    pub endpoint: String,
    /// The request's features: sent when the filter placed it without the predictor's
    /// answer (its fallback), which the predictor may hold no record of. Omitted (default),
    /// the predictor's record has them. Header-only routing sends `input_tokens` alone, the
    /// prompt its body carried: where that is less than the record's (predicted from the
    /// `content-length` claimed), the predictor books the smaller.
    #[serde(default, skip_serializing_if = "RequestFeatures::is_unset")]
    pub request: RequestFeatures,
}

/// `POST /v1/dispatch` body: decisions made since the filter's last flush.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DispatchBatch {
    pub dispatches: Vec<Dispatch>,
}

/// How the filter chose the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteSource {
    /// From predictions, in the tier where every judged headroom was >= 0.
    PredictedPositive,
    /// From predictions, in the tier where some headroom was negative.
    PredictedNegative,
    /// From the fallback composite of endpoint state (predictor unavailable).
    Fallback,
    /// The default profile's composite of endpoint state (no SLO routing asked).
    Composite,
    /// The filter did not choose: Envoy's load balancer did.
    Envoy,
}

impl RouteSource {
    /// The tier's name in the `x-headroom-tier` debug header and in reports.
    pub fn tier(self) -> &'static str {
        match self {
            RouteSource::PredictedPositive => "positive",
            RouteSource::PredictedNegative => "negative",
            RouteSource::Fallback => "fallback",
            RouteSource::Composite => "composite",
            RouteSource::Envoy => "envoy",
        }
    }
}

/// What the gateway measured of one finished request, and where it was served: a report,
/// on the wire. The predictor completes it from its record into an [`Observation`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub pool: String,
    pub request_id: String,
    /// The endpoint that actually served (Envoy's `upstream.address`).
    pub endpoint: String,
    pub source: RouteSource,
    /// Streaming: time from forwarding upstream to the first token event.
    /// Non-streaming: the first token arrives with the whole body, so this
    /// equals `e2e_ms`; training uses TTFT from streaming requests only.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// (last token time - first token time) / (completion tokens - 1), from
    /// the usage block's token count (not from chunk counts). Streaming only.
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    /// Time from forwarding upstream to the end of the response.
    pub e2e_ms: f64,
    /// `usage.completion_tokens`, when the response carried it.
    #[serde(default)]
    pub output_tokens: Option<u32>,
    /// `usage.prompt_tokens_details.cached_tokens`, when given.
    #[serde(default)]
    pub cached_tokens: Option<u32>,
    /// HTTP status returned by the model server; 0: no response, or a 200 cut off before
    /// its end (the server or its connection failed mid-body). Only 200s teach the model.
    pub status: u16,
    /// The endpoint the gateway chose, when it failed there (a connect failure, a reset, a
    /// 5xx before any byte) and Envoy's retry served it at `endpoint`: that failure counts
    /// against the chosen endpoint's passive health (`health`) though the client never saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<String>,
}

/// One finished request as the predictor knows it: the gateway's [`Report`] completed from
/// the predictor's record of the request where it was dispatched. What the predictor learns
/// from, logs, and serves at `/v1/observations`; the record's fields are empty where it kept
/// none (a request it did not predict, or served elsewhere than dispatched).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    #[serde(flatten)]
    pub report: Report,
    /// The request's features (prefix hashes omitted).
    #[serde(default, skip_serializing_if = "RequestFeatures::is_unset")]
    pub request: RequestFeatures,
    /// The endpoint's state when the predictor predicted the request there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_at_dispatch: Option<EndpointState>,
    /// What the predictor predicted at the endpoint that served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_tpot_ms: Option<f64>,
}

impl Observation {
    /// A report the predictor holds no record for.
    pub fn unrecorded(report: Report) -> Observation {
        Observation {
            report,
            request: RequestFeatures::default(),
            state_at_dispatch: None,
            predicted_ttft_ms: None,
            predicted_tpot_ms: None,
        }
    }
}

/// A routed request's first token passed the gateway: it is past prefill. Sent
/// while the response still streams, so the predictor stops counting its prompt
/// as prefill work ahead of new requests when it happened, not when predicted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstToken {
    pub pool: String,
    pub request_id: String,
    /// The endpoint serving it (Envoy's `upstream.address`).
    pub endpoint: String,
    /// Time from forwarding upstream to the first token event.
    pub ttft_ms: f64,
}

/// A request that offered to wait in the flow-control queue ended (its client left)
/// before the predictor answered. Envoy does not cancel a Wasm filter's call when its
/// stream ends, so the filter says so: the predictor takes it out of the queue (or
/// drops what it reserved for it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Abandoned {
    pub pool: String,
    pub request_id: String,
}

/// `POST /v1/report` body: first-token events and reports batched on the filter's tick.
/// First tokens are applied before the reports of a batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportBatch {
    pub reports: Vec<Report>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_tokens: Vec<FirstToken>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub abandoned: Vec<Abandoned>,
}

/// Answer to a dispatch or report batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchAck {
    pub accepted: u32,
    /// Items refused (unknown pool, invalid values); details go to the log.
    pub rejected: u32,
}

/// Error body of every non-2xx answer: `{"error": {"message": ..., "field": ...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    /// The request field or header at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ErrorBody {
    /// An error naming the field at fault.
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorBody { error: ErrorDetail { message: message.into(), field: Some(field.into()) } }
    }

    /// An error not tied to one field.
    pub fn message(message: impl Into<String>) -> Self {
        ErrorBody { error: ErrorDetail { message: message.into(), field: None } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{self, Format};

    /// The one rule: a stated TTFT goal with no first token is missed, a TPOT unmeasured is
    /// not judged, and a whole response is judged only by the deadline its goals imply.
    #[test]
    fn goals_are_judged_by_one_rule_and_a_whole_response_only_by_its_deadline() {
        let slo = Slo { ttft_ms: Some(100.0), tpot_ms: Some(10.0) };
        assert_eq!(slo.met(Some(90.0), Some(12.0)), [Some(true), Some(false)]);
        assert_eq!(slo.met(None, None), [Some(false), None], "no first token seen: missed");
        assert_eq!(slo.met(Some(f64::NAN), Some(f64::NAN)), [Some(false), None]);
        assert_eq!(Slo { ttft_ms: None, tpot_ms: Some(10.0) }.met(Some(1.0), None), [None, None]);
        let stream = Served { streamed: true, ttft_ms: Some(90.0), tpot_ms: Some(9.0), e2e_ms: 5_000.0 };
        assert_eq!(slo.met_by(&stream, Unstreamed::NotJudged), Some(true));
        let whole = Served { streamed: false, ttft_ms: Some(150.0), tpot_ms: None, e2e_ms: 150.0 };
        assert_eq!(slo.met_by(&whole, Unstreamed::NotJudged), None);
        // 100 + 10 x 10 = 200 ms for the whole of a 10-token answer.
        assert_eq!(slo.met_by(&whole, Unstreamed::ByDeadline { max_tokens: 10 }), Some(true));
        let late = Served { e2e_ms: 201.0, ..whole };
        assert_eq!(slo.met_by(&late, Unstreamed::ByDeadline { max_tokens: 10 }), Some(false));
        assert_eq!(Slo::default().met_by(&late, Unstreamed::ByDeadline { max_tokens: 10 }), None, "no goal");
    }

    /// An observation reads and writes as one flat object, the report's fields beside the
    /// record's, in both formats: logs and `/v1/observations` keep one shape.
    #[test]
    fn an_observation_is_its_report_and_its_record_side_by_side() {
        let report = Report {
            pool: "p".into(),
            request_id: "r".into(),
            endpoint: "10.0.0.1:8000".into(),
            source: RouteSource::PredictedPositive,
            ttft_ms: Some(90.0),
            tpot_ms: None,
            e2e_ms: 900.0,
            output_tokens: Some(10),
            cached_tokens: None,
            status: 200,
            failed_at: None,
        };
        let o = Observation {
            request: RequestFeatures { model: "m".into(), ..Default::default() },
            state_at_dispatch: Some(EndpointState::default()),
            predicted_ttft_ms: Some(100.0),
            ..Observation::unrecorded(report.clone())
        };
        let json = serde_json::to_value(&o).unwrap_or_default();
        assert_eq!((json["request_id"].as_str(), json["predicted_ttft_ms"].as_f64()), (Some("r"), Some(100.0)));
        for format in [Format::MsgPack, Format::Json] {
            let bytes = codec::encode(format, &o).unwrap_or_default();
            assert_eq!(codec::decode::<Observation>(format, &bytes).ok(), Some(o.clone()));
            // A report on the wire reads as itself, and an observation's bytes as its report.
            assert_eq!(codec::decode::<Report>(format, &bytes).ok(), Some(report.clone()));
        }
    }
}
