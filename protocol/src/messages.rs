//! The messages of the filter <-> predictor contract.
//!
//! Each side sends only what it alone knows. The predictor keeps a record of every
//! request it predicts (its features, each endpoint's state and predictions); a dispatch
//! then names the request and the endpoint chosen, and a report carries only what the
//! gateway measured. The predictor learns from its own record, never from what the
//! gateway says the predictor said. Contract 1 (before records) echoed the features,
//! predictions and endpoint state back in every dispatch and report; a predictor
//! answers with its [`CONTRACT`], and a filter sends the lean messages only to a fleet of
//! predictors that all keep records ([`PredictResponse::contract`]), so either side can
//! be rolled out first.

use serde::{Deserialize, Serialize};

/// The contract version this build speaks: 2, dispatches and reports without echoes.
pub const CONTRACT: u32 = 2;

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

    /// Whether a request measured at `ttft_ms` and `tpot_ms` met each goal, `[ttft, tpot]`:
    /// `None` where the goal was not stated or the latency not measured (a TPOT needs two
    /// tokens), so it is not judged. The one definition of an SLO violation: the filter's
    /// `slo_violation` stats, the predictor's `inference_objective_request_slo_violation`
    /// and its tier precision all read it.
    pub fn met(&self, ttft_ms: Option<f64>, tpot_ms: Option<f64>) -> [Option<bool>; 2] {
        let judge = |goal: Option<f64>, seen: Option<f64>| Some(seen.filter(|v| v.is_finite())? <= goal?);
        [judge(self.ttft_ms, ttft_ms), judge(self.tpot_ms, tpot_ms)]
    }
}

/// What the filter knows about a request before routing it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestFeatures {
    /// The `model` field of the OpenAI body.
    pub model: String,
    /// Prompt length, by [`crate::tokens::estimate_tokens`].
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
    /// The tenant (the fairness header's value; empty: none): within a priority band,
    /// tenants take turns.
    #[serde(default)]
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
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FlowAnswer {
    pub outcome: FlowOutcome,
    /// Time spent in the queue: the filter judges headroom against the TTFT SLO minus it.
    pub waited_ms: f64,
}

/// What the predictor knows of one endpoint at predict time. These are the
/// model's input features; the filter echoes them back in its report so that
/// training sees exactly what prediction saw.
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
    /// The predictor's contract version ([`CONTRACT`]); absent (0 or 1): a predictor that
    /// keeps no record and needs the echoes.
    #[serde(default)]
    pub contract: u32,
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
    /// answer (its fallback), which the predictor may hold no record of, and always to a
    /// contract-1 predictor. Omitted (default), the predictor's record has them.
    #[serde(default, skip_serializing_if = "RequestFeatures::is_unset")]
    pub request: RequestFeatures,
    /// Contract 1 only (the predictor's own TTFT prediction, echoed): a predictor that
    /// keeps records reads its record instead and ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_ttft_ms: Option<f64>,
    /// Contract 1 only, as `predicted_ttft_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_tpot_ms: Option<f64>,
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

/// What was observed for one finished request. On the wire (a report) the gateway fills
/// only the measurements, the endpoint that served and the tier it chose from; the
/// predictor completes the rest from its own record of the request (what it predicted
/// there, the endpoint's state then, the features) before it learns from it, logs it or
/// serves it at `/v1/observations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub pool: String,
    pub request_id: String,
    /// The endpoint that actually served (Envoy's `upstream.address`).
    pub endpoint: String,
    /// The request's features (prefix hashes omitted): the predictor's record. From a
    /// contract-1 filter, as it sent them at dispatch.
    #[serde(default, skip_serializing_if = "RequestFeatures::is_unset")]
    pub request: RequestFeatures,
    /// The endpoint's state when the predictor predicted the request there: its record.
    /// (A contract-1 filter echoes it; a predictor that keeps records ignores the echo.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_at_dispatch: Option<EndpointState>,
    /// What the predictor predicted at the endpoint that served: its record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_tpot_ms: Option<f64>,
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

/// `POST /v1/report` body: first-token events and observations batched on the
/// filter's tick. First tokens are applied before the observations of a batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportBatch {
    pub observations: Vec<Observation>,
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

    /// The dispatch as a contract-1 predictor decodes it: `request` required.
    #[derive(Debug, Deserialize)]
    struct DispatchV1 {
        #[allow(dead_code)]
        request: RequestFeatures,
        predicted_ttft_ms: Option<f64>,
    }

    /// The observation as a contract-1 predictor decodes it.
    #[derive(Debug, Deserialize)]
    struct ObservationV1 {
        request: RequestFeatures,
        state_at_dispatch: Option<EndpointState>,
    }

    fn dispatch(lean: bool) -> Dispatch {
        let request = RequestFeatures {
            model: "m".into(),
            input_tokens: 10,
            prefix_hashes: (1..=256u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect(),
            ..Default::default()
        };
        Dispatch {
            pool: "p".into(),
            request_id: "r".into(),
            endpoint: "10.0.0.1:8000".into(),
            request: if lean { RequestFeatures::default() } else { request },
            predicted_ttft_ms: (!lean).then_some(100.0),
            predicted_tpot_ms: None,
        }
    }

    /// Either side may roll out first: a new filter sends a contract-1 predictor the echoed
    /// messages it reads, and a new predictor reads them too; the lean form, which only a
    /// predictor that keeps records is sent, is what an old one could not read.
    #[test]
    fn the_echoed_form_reads_on_both_contracts_and_the_lean_one_only_on_the_new() {
        for format in [Format::MsgPack, Format::Json] {
            let full = codec::encode(format, &dispatch(false)).unwrap_or_default();
            let old: DispatchV1 = codec::decode(format, &full).unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!(old.predicted_ttft_ms, Some(100.0));
            assert_eq!(codec::decode::<Dispatch>(format, &full).ok(), Some(dispatch(false)));
            let lean = codec::encode(format, &dispatch(true)).unwrap_or_default();
            assert!(codec::decode::<DispatchV1>(format, &lean).is_err(), "a contract-1 predictor refuses it");
            assert_eq!(codec::decode::<Dispatch>(format, &lean).ok(), Some(dispatch(true)));
            assert!(lean.len() * 10 < full.len(), "lean {} bytes, echoed {}", lean.len(), full.len());

            let o = Observation {
                pool: "p".into(),
                request_id: "r".into(),
                endpoint: "10.0.0.1:8000".into(),
                request: RequestFeatures { model: "m".into(), ..Default::default() },
                state_at_dispatch: Some(EndpointState::default()),
                predicted_ttft_ms: Some(100.0),
                predicted_tpot_ms: None,
                source: RouteSource::PredictedPositive,
                ttft_ms: Some(90.0),
                tpot_ms: None,
                e2e_ms: 900.0,
                output_tokens: Some(10),
                cached_tokens: None,
                status: 200,
                failed_at: None,
            };
            let old: ObservationV1 = codec::decode(format, &codec::encode(format, &o).unwrap_or_default())
                .unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!((old.request.model.as_str(), old.state_at_dispatch.is_some()), ("m", true));
            let lean = Observation {
                request: RequestFeatures::default(),
                state_at_dispatch: None,
                predicted_ttft_ms: None,
                ..o
            };
            let bytes = codec::encode(format, &lean).unwrap_or_default();
            assert!(codec::decode::<ObservationV1>(format, &bytes).is_err());
            assert_eq!(codec::decode::<Observation>(format, &bytes).ok(), Some(lean));
        }
    }
}
