//! The service's own Prometheus metrics (`GET /metrics`).
//!
//! `headroom_*` names, plus the names users of the Gateway API Inference Extension and
//! llm-d's router already chart, with their labels: `inference_objective_*` per model
//! (`model_name`, `target_model_name`: requests, errors, duration, tokens, observed and
//! predicted TTFT/TPOT, SLO violations by type) and `inference_pool_*` per pool (`name`:
//! ready endpoints, mean KV use, queue and running requests).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use headroom_protocol::{Observation, Report, RouteSource, Slo};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::model::store::TrainOutcome;
use crate::pool::PoolGauges;

/// At most this many model names get series of their own: names a model server lists in its
/// `/v1/models` ([`Metrics::model_served`]); requests for any other name count as
/// [`OTHER_MODEL`]. The name comes from the client's body: admitted on first sight, 3,000
/// invented names grew `/metrics` from 36 to 771 KB and the first 63 kept their series
/// until a restart, crowding out the real ones.
pub const MAX_MODEL_SERIES: usize = 64;
/// The `model_name` of requests for a model no server lists (or past [`MAX_MODEL_SERIES`]).
pub const OTHER_MODEL: &str = "other";

/// llm-d's and the GIE's model labels. headroom does not rewrite models, so the target
/// model is the one the client named.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model_name: String,
    pub target_model_name: String,
}

/// A violation's model and `type` (`ttft_slo_violation`, `tpot_slo_violation`), as llm-d names them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelTypeLabels {
    pub model_name: String,
    pub target_model_name: String,
    pub r#type: String,
}

/// A failed request's model and the model server's status (`0`: no response, or cut off).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelErrorLabels {
    pub model_name: String,
    pub target_model_name: String,
    pub error_code: String,
}

/// At most this many priorities get series of their own in `headroom_slo_requests`
/// (a trusted header or an objective may set any); the rest count as [`OTHER_PRIORITY`].
pub const MAX_PRIORITY_SERIES: usize = 16;
/// The `priority` of requests past [`MAX_PRIORITY_SERIES`].
pub const OTHER_PRIORITY: &str = "other";

/// A judged request's pool, priority and whether it met every SLO it stated (`met`, `missed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SloResultLabels {
    pub pool: String,
    pub priority: String,
    pub result: String,
}

/// The GIE's pool label: the pool's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolNameLabel {
    pub name: String,
}

/// The GIE's per-pod label, here the endpoint's address.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolPodLabels {
    pub name: String,
    pub model_server_pod: String,
}

/// Whether `value` gets series of its own: it has them already, or fewer than `max` values
/// have (then it joins them). A label value a client chooses is bounded this way.
fn admitted<T: Ord + ToOwned + ?Sized>(seen: &Mutex<BTreeSet<T::Owned>>, value: &T, max: usize) -> bool
where
    T::Owned: Ord + std::borrow::Borrow<T>,
{
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    seen.contains(value) || (seen.len() < max && seen.insert(value.to_owned()))
}

type ModelHistogram = Family<ModelLabels, Histogram, fn() -> Histogram>;

fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

fn token_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 18))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// A caller's name (from the callers file: as many values as it names) and a refusal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallerLabel {
    pub caller: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    pub pool: String,
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabel {
    pub target: String,
}

/// Recent absolute percentage errors and coverage of one target.
#[derive(Default)]
struct Window {
    ape: VecDeque<f64>,
    covered: VecDeque<f64>,
}

/// Observations kept for the live accuracy gauges.
const WINDOW: usize = 500;

impl Window {
    fn push(&mut self, predicted: f64, actual: f64) -> (f64, f64) {
        if self.ape.len() == WINDOW {
            self.ape.pop_front();
            self.covered.pop_front();
        }
        self.ape.push_back((predicted - actual).abs() / actual);
        self.covered.push_back(if predicted >= actual { 1.0 } else { 0.0 });
        let n = self.ape.len() as f64;
        (self.ape.iter().sum::<f64>() / n, self.covered.iter().sum::<f64>() / n)
    }
}

/// Recent placements by prediction tier, and whether each met its SLOs: the
/// per-decision quality routing depends on.
#[derive(Default)]
struct Decisions {
    /// (placed in the positive tier, met every judged SLO), newest last.
    recent: VecDeque<(bool, bool)>,
}

impl Decisions {
    /// Adds one placement; returns (precision, recall) over the window: the share of
    /// positive-tier placements that met their SLOs, and the share of placements that
    /// met their SLOs the filter had placed positive. `None` while undefined.
    fn push(&mut self, positive: bool, met: bool) -> (Option<f64>, Option<f64>) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back((positive, met));
        let count = |f: &dyn Fn(&(bool, bool)) -> bool| self.recent.iter().filter(|d| f(d)).count() as f64;
        let (positives, met, both) = (count(&|d| d.0), count(&|d| d.1), count(&|d| d.0 && d.1));
        ((positives > 0.0).then(|| both / positives), (met > 0.0).then(|| both / met))
    }
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct Metrics {
    registry: Registry,
    /// Held while `/metrics` refills its per-scrape gauges and renders (`render_refreshed`).
    rendering: Mutex<()>,
    predictions: Counter,
    predict_duration: Histogram,
    dispatches: Family<ResultLabel, Counter>,
    /// Dispatches tracked without this predictor's record of the request.
    without_record: Counter,
    reports: Family<ResultLabel, Counter>,
    scrapes: Family<ResultLabel, Counter>,
    trainings: Family<ResultLabel, Counter>,
    ttft: ModelHistogram,
    predicted_ttft: ModelHistogram,
    tpot: ModelHistogram,
    predicted_tpot: ModelHistogram,
    ttft_prediction_duration: Histogram,
    tpot_prediction_duration: Histogram,
    slo_violations: Family<ModelTypeLabels, Counter>,
    requests: Family<ModelLabels, Counter>,
    request_errors: Family<ModelErrorLabels, Counter>,
    request_duration: ModelHistogram,
    input_tokens: ModelHistogram,
    output_tokens: ModelHistogram,
    normalized_tpot: ModelHistogram,
    /// Model names with series of their own (at most [`MAX_MODEL_SERIES`]).
    models: Mutex<BTreeSet<String>>,
    slo_requests: Family<SloResultLabels, Counter>,
    /// Priorities with series of their own (at most [`MAX_PRIORITY_SERIES`]).
    priorities: Mutex<BTreeSet<i32>>,
    pub pool_ready: Family<PoolNameLabel, Gauge>,
    pub pool_kv_usage: Family<PoolNameLabel, FloatGauge>,
    pub pool_queue: Family<PoolNameLabel, FloatGauge>,
    pub pool_running: Family<PoolNameLabel, FloatGauge>,
    pub pool_pod_queue: Family<PoolPodLabels, Gauge>,
    live_mape: Family<TargetLabel, FloatGauge>,
    live_coverage: Family<TargetLabel, FloatGauge>,
    windows: Mutex<[Window; 2]>,
    tier_precision: FloatGauge,
    tier_recall: FloatGauge,
    decisions: Mutex<Decisions>,
    pub in_flight: Family<EndpointLabel, Gauge>,
    in_flight_expired: Counter,
    task_restarts: Family<TaskLabel, Counter>,
    unauthorized: Counter,
    panics: Counter,
    invalid: Family<RouteLabel, Counter>,
    pub flow_queued: Family<BandLabel, Gauge>,
    pub saturation: Family<PoolLabel, FloatGauge>,
    flow_wait: Histogram,
    flow_outcomes: Family<OutcomeLabel, Counter>,
    flow_expired: Family<PoolLabel, Counter>,
    flow_left: Family<PoolLabel, Counter>,
    endpoint_failures: Family<PoolLabel, Counter>,
    endpoint_ejections: Family<PoolLabel, Counter>,
    caller_refusals: Family<CallerLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BandLabel {
    pub pool: String,
    pub band: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub pool: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabel {
    pub task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: String,
}

impl Metrics {
    /// `persist_failures` and `substituted` are the model store's counts of failed writes to
    /// its data directory and of model values out of range that the prior replaced.
    pub fn new(persist_failures: Counter, substituted: Counter) -> Metrics {
        let mut r = Registry::default();
        let latency = latency_buckets;
        let model_latency = || ModelHistogram::new_with_constructor(latency_buckets);
        let duration = || Histogram::new(exponential_buckets(1e-6, 2.0, 20));
        let m = Metrics {
            predictions: Counter::default(),
            in_flight_expired: Counter::default(),
            task_restarts: Family::default(),
            predict_duration: duration(),
            dispatches: Family::default(),
            without_record: Counter::default(),
            reports: Family::default(),
            scrapes: Family::default(),
            trainings: Family::default(),
            ttft: model_latency(),
            predicted_ttft: model_latency(),
            tpot: model_latency(),
            predicted_tpot: model_latency(),
            ttft_prediction_duration: duration(),
            tpot_prediction_duration: duration(),
            slo_violations: Family::default(),
            requests: Family::default(),
            request_errors: Family::default(),
            request_duration: model_latency(),
            input_tokens: Family::new_with_constructor(token_buckets),
            output_tokens: Family::new_with_constructor(token_buckets),
            normalized_tpot: model_latency(),
            models: Mutex::new(BTreeSet::new()),
            slo_requests: Family::default(),
            priorities: Mutex::new(BTreeSet::new()),
            pool_ready: Family::default(),
            pool_kv_usage: Family::default(),
            pool_queue: Family::default(),
            pool_running: Family::default(),
            pool_pod_queue: Family::default(),
            live_mape: Family::default(),
            live_coverage: Family::default(),
            windows: Mutex::new([Window::default(), Window::default()]),
            tier_precision: FloatGauge::default(),
            tier_recall: FloatGauge::default(),
            decisions: Mutex::new(Decisions::default()),
            in_flight: Family::default(),
            unauthorized: Counter::default(),
            panics: Counter::default(),
            invalid: Family::default(),
            flow_queued: Family::default(),
            saturation: Family::default(),
            flow_wait: latency(),
            flow_outcomes: Family::default(),
            flow_expired: Family::default(),
            flow_left: Family::default(),
            endpoint_failures: Family::default(),
            caller_refusals: Family::default(),
            endpoint_ejections: Family::default(),
            registry: Registry::default(),
            rendering: Mutex::new(()),
        };
        r.register(
            "headroom_unauthorized_requests",
            "Calls to a guarded route without the right token (401)",
            m.unauthorized.clone(),
        );
        r.register(
            "headroom_handler_panics",
            "Requests whose handler panicked, answered 500 (a bug: please report it)",
            m.panics.clone(),
        );
        r.register("headroom_invalid_requests", "Bodies refused as invalid (400), by route", m.invalid.clone());
        r.register(
            "headroom_persist_failures",
            "Failed writes to the data directory (full, read-only, gone)",
            persist_failures,
        );
        r.register(
            "headroom_model_values_substituted",
            "Values (a TTFT or a TPOT of one endpoint) the serving model predicted out of range, served by the prior",
            substituted,
        );
        r.register("headroom_predictions", "Predict requests answered", m.predictions.clone());
        r.register(
            "headroom_predict_duration_seconds",
            "Time to answer one predict request",
            m.predict_duration.clone(),
        );
        let build = headroom_protocol::build::build_labels("predictor");
        r.register(
            headroom_protocol::build::BUILD_INFO.trim_end_matches("_info"),
            headroom_protocol::build::BUILD_INFO_HELP,
            prometheus_client::metrics::info::Info::new(build.map(|(k, v)| (k.to_string(), v.to_string())).to_vec()),
        );
        r.register(
            "headroom_dispatches",
            "Dispatch items by result: accepted, already_finished, unknown_endpoint, unknown_pool, \
             pool_full, caller_full (the caller holds its share of the books), caller_rate (past the \
             caller's dispatch rate)",
            m.dispatches.clone(),
        );
        r.register(
            "headroom_dispatches_without_record",
            "Dispatches accepted without this predictor's record of the request (predicted by another \
             replica, before a restart, or placed by the gateway's fallback): counted as load, their \
             reports teach nothing",
            m.without_record.clone(),
        );
        r.register("headroom_reports", "Observation items by result", m.reports.clone());
        r.register("headroom_scrapes", "Endpoint metric scrapes by result", m.scrapes.clone());
        r.register("headroom_model_trainings", "Training rounds by result", m.trainings.clone());
        r.register(
            "headroom_live_mape",
            "Mean absolute percentage error of the last 500 predictions",
            m.live_mape.clone(),
        );
        r.register(
            "headroom_live_coverage",
            "Share of the last 500 observations at or under the prediction",
            m.live_coverage.clone(),
        );
        r.register(
            "headroom_tier_precision",
            "Share of the last 500 positive-tier placements (predicted to meet their SLOs) that met them",
            m.tier_precision.clone(),
        );
        r.register(
            "headroom_tier_recall",
            "Share of the last 500 placements that met their SLOs which the filter had placed in the positive tier",
            m.tier_recall.clone(),
        );
        r.register("headroom_in_flight_requests", "Requests dispatched and not yet reported", m.in_flight.clone());
        r.register(
            "headroom_task_restarts",
            "Background tasks (scraper, expiry, trainer, flow) restarted after a panic, by task",
            m.task_restarts.clone(),
        );
        r.register(
            "headroom_in_flight_expired",
            "Requests dispatched and not reported, forgotten: past their expiry (in_flight_expiry_multiple times the predicted end-to-end time, within in_flight_min_s..=in_flight_ttl_s), or beyond what their engine showed running and waiting 10 s after they were dispatched",
            m.in_flight_expired.clone(),
        );
        r.register(
            "inference_objective_request_ttft_seconds",
            "Observed time to first token (streaming)",
            m.ttft.clone(),
        );
        r.register(
            "inference_objective_request_predicted_ttft_seconds",
            "Predicted time to first token",
            m.predicted_ttft.clone(),
        );
        r.register("inference_objective_request_tpot_seconds", "Observed time per output token", m.tpot.clone());
        r.register(
            "inference_objective_request_predicted_tpot_seconds",
            "Predicted time per output token",
            m.predicted_tpot.clone(),
        );
        r.register(
            "inference_objective_request_ttft_prediction_duration_seconds",
            "Time to predict TTFT (all candidates)",
            m.ttft_prediction_duration.clone(),
        );
        r.register(
            "inference_objective_request_tpot_prediction_duration_seconds",
            "Time to predict TPOT (all candidates)",
            m.tpot_prediction_duration.clone(),
        );
        r.register(
            "inference_objective_request_slo_violation",
            "Finished streaming requests that missed a stated SLO, by model and type (ttft_slo_violation, tpot_slo_violation)",
            m.slo_violations.clone(),
        );
        r.register(
            "headroom_slo_requests",
            "Complete streaming 200s with a stated SLO that was measured, by pool, priority and result: met (every such SLO) or missed. Attainment is met over all",
            m.slo_requests.clone(),
        );
        r.register(
            "inference_objective_request",
            "Requests reported finished by the gateway, by model",
            m.requests.clone(),
        );
        r.register(
            "inference_objective_request_error",
            "Reported requests that did not end in a complete 200, by model and the model server's status (0: none, or cut off)",
            m.request_errors.clone(),
        );
        r.register(
            "inference_objective_request_duration_seconds",
            "Time from forwarding upstream to the end of the response, by model (complete 200s)",
            m.request_duration.clone(),
        );
        r.register("inference_objective_input_tokens", "Prompt tokens per request, by model", m.input_tokens.clone());
        r.register(
            "inference_objective_output_tokens",
            "Completion tokens per request (from its usage block), by model",
            m.output_tokens.clone(),
        );
        r.register(
            "inference_objective_normalized_time_per_output_token_seconds",
            "Request duration over its completion tokens, by model (complete 200s with usage)",
            m.normalized_tpot.clone(),
        );
        r.register(
            "inference_pool_ready_pods",
            "Endpoints of the pool with fresh engine metrics (scraped within stale_after_ms)",
            m.pool_ready.clone(),
        );
        r.register(
            "inference_pool_average_kv_cache_utilization",
            "Mean KV-cache use (0..1) of the pool's ready endpoints",
            m.pool_kv_usage.clone(),
        );
        r.register(
            "inference_pool_average_queue_size",
            "Mean requests waiting in the engine queues of the pool's ready endpoints",
            m.pool_queue.clone(),
        );
        r.register(
            "inference_pool_average_running_requests",
            "Mean requests running on the pool's ready endpoints",
            m.pool_running.clone(),
        );
        r.register(
            "inference_pool_per_pod_queue_size",
            "Requests waiting in each ready endpoint's engine queue (model_server_pod: its address)",
            m.pool_pod_queue.clone(),
        );
        r.register(
            "headroom_flow_queued_requests",
            "Requests waiting in the flow-control queue, by pool and priority band",
            m.flow_queued.clone(),
        );
        r.register(
            "headroom_flow_wait_seconds",
            "Time requests waited in the flow-control queue (released or expired)",
            m.flow_wait.clone(),
        );
        r.register(
            "headroom_flow_outcomes",
            "Requests that offered to wait, by what flow control did (immediate, released, expired, saturated, queue_full)",
            m.flow_outcomes.clone(),
        );
        r.register(
            "headroom_flow_expired",
            "Queued requests whose deadline passed before an endpoint had headroom for them",
            m.flow_expired.clone(),
        );
        r.register(
            "headroom_flow_left",
            "Queued requests whose caller left (client gone, gateway cancelled the call) before an answer",
            m.flow_left.clone(),
        );
        r.register(
            "headroom_caller_refusals",
            "Dispatches not tracked because their caller was past a quota, by caller (the callers file's \
             names; \"\" when the routes are open) and result (caller_rate, caller_full): a caller counted \
             here is flooding, or its token leaked",
            m.caller_refusals.clone(),
        );
        r.register(
            "headroom_endpoint_failures",
            "Requests the gateways reported failed at an endpoint (a 5xx, or retried elsewhere after failing there)",
            m.endpoint_failures.clone(),
        );
        r.register(
            "headroom_endpoint_ejections",
            "Endpoints ejected for failing requests: they get no prediction for the ejection's term",
            m.endpoint_ejections.clone(),
        );
        r.register(
            "headroom_saturation",
            "Time to drain the queue at the current rate over the mean time its requests have left (0: nothing waits; above 1: they cannot all make their SLOs)",
            m.saturation.clone(),
        );
        Metrics { registry: r, ..m }
    }

    /// Metrics with one sample in every family, so each renders its name and its label
    /// names: what tools check a dashboard's or an alert's queries against
    /// (`headroom-deploy-check`), from the registry itself rather than a list kept beside it.
    pub fn specimen() -> Metrics {
        let m = Metrics::default();
        let mut o = Observation {
            report: Report {
                pool: "p".into(),
                request_id: "r".into(),
                endpoint: "e:1".into(),
                source: RouteSource::PredictedPositive,
                ttft_ms: Some(2.0),
                tpot_ms: Some(2.0),
                e2e_ms: 10.0,
                output_tokens: Some(2),
                cached_tokens: None,
                status: 200,
                failed_at: None,
            },
            request: headroom_protocol::RequestFeatures { model: "m".into(), streaming: true, ..Default::default() },
            state_at_dispatch: None,
            predicted_ttft_ms: Some(1.0),
            predicted_tpot_ms: Some(1.0),
        };
        o.request.slo = headroom_protocol::Slo { ttft_ms: Some(1.0), tpot_ms: Some(1.0) };
        m.model_served("m");
        m.observed(&o);
        m.observed(&Observation { report: Report { status: 503, ..o.report.clone() }, ..o });
        m.predicted(0.001);
        for family in [&m.dispatches, &m.reports, &m.scrapes, &m.trainings] {
            Self::count(family, "ok", 1);
        }
        m.flow_outcome("p", headroom_protocol::FlowOutcome::Expired, 1.0);
        m.flow_left("p");
        m.endpoint_failed("p", true);
        m.task_restarted("scraper");
        m.invalid("/v1/predict");
        m.in_flight.get_or_create(&EndpointLabel { pool: "p".into(), endpoint: "e:1".into() }).set(1);
        m.flow_queued.get_or_create(&BandLabel { pool: "p".into(), band: "0".into() }).set(1);
        m.saturation.get_or_create(&PoolLabel { pool: "p".into() }).set(0.5);
        let gauges = PoolGauges { ready: 1, waiting_by_endpoint: vec![("e:1".into(), 1)], ..Default::default() };
        m.set_pools(&[("p".into(), gauges)]);
        m
    }

    /// Flow control decided `outcome` for a request of `pool` after `waited_s` in the queue.
    pub fn flow_outcome(&self, pool: &str, outcome: headroom_protocol::FlowOutcome, waited_s: f64) {
        let label = OutcomeLabel { pool: pool.to_string(), outcome: outcome.name().to_string() };
        self.flow_outcomes.get_or_create(&label).inc();
        if matches!(outcome, headroom_protocol::FlowOutcome::Released | headroom_protocol::FlowOutcome::Expired) {
            self.flow_wait.observe(waited_s);
        }
        if outcome == headroom_protocol::FlowOutcome::Expired {
            self.flow_expired.get_or_create(&PoolLabel { pool: pool.to_string() }).inc();
        }
    }

    /// A request of `pool` joined the queue.
    pub fn flow_queued(&self, pool: &str) {
        let label = OutcomeLabel { pool: pool.to_string(), outcome: "queued".to_string() };
        self.flow_outcomes.get_or_create(&label).inc();
    }

    /// A queued request's caller left before its answer.
    pub fn flow_left(&self, pool: &str) {
        self.flow_left.get_or_create(&PoolLabel { pool: pool.to_string() }).inc();
    }

    /// `n` dispatches of `caller` refused `result` (`caller_rate`, `caller_full`); counted in
    /// `headroom_dispatches` too.
    pub fn caller_refused(&self, caller: &str, result: &str, n: u64) {
        self.dispatch(result, n);
        let label = CallerLabel { caller: caller.to_string(), result: result.to_string() };
        self.caller_refusals.get_or_create(&label).inc_by(n);
    }

    /// A request of `pool` failed at an endpoint, and whether that ejected it.
    pub fn endpoint_failed(&self, pool: &str, ejected: bool) {
        let label = PoolLabel { pool: pool.to_string() };
        self.endpoint_failures.get_or_create(&label).inc();
        if ejected {
            self.endpoint_ejections.get_or_create(&label).inc();
        }
    }

    /// One predict call (TTFT and TPOT of every candidate come from the same batched run).
    pub fn predicted(&self, seconds: f64) {
        self.predictions.inc();
        self.predict_duration.observe(seconds);
        self.ttft_prediction_duration.observe(seconds);
        self.tpot_prediction_duration.observe(seconds);
    }

    fn count(family: &Family<ResultLabel, Counter>, result: &str, n: u64) {
        family.get_or_create(&ResultLabel { result: result.to_string() }).inc_by(n);
    }

    /// `n` requests in flight were never reported and are no longer tracked.
    pub fn expired(&self, n: u64) {
        self.in_flight_expired.inc_by(n);
    }

    pub fn task_restarted(&self, task: &str) {
        self.task_restarts.get_or_create(&TaskLabel { task: task.to_string() }).inc();
    }

    pub fn unauthorized(&self) {
        self.unauthorized.inc();
    }

    pub fn panicked(&self) {
        self.panics.inc();
    }

    pub fn invalid(&self, route: &str) {
        self.invalid.get_or_create(&RouteLabel { route: route.to_string() }).inc();
    }

    pub fn dispatch(&self, result: &str, n: u64) {
        Self::count(&self.dispatches, result, n);
    }

    /// A dispatch accepted without a record of its request (also counted `accepted`).
    pub fn dispatched_without_record(&self) {
        self.without_record.inc();
    }

    pub fn report(&self, result: &str, n: u64) {
        Self::count(&self.reports, result, n);
    }

    pub fn scrape(&self, ok: bool) {
        Self::count(&self.scrapes, if ok { "ok" } else { "error" }, 1);
    }

    pub fn trained(&self, outcome: &TrainOutcome) {
        let result = match outcome {
            TrainOutcome::Skipped => return,
            TrainOutcome::Activated(_) => "activated",
            TrainOutcome::KeptActive { .. } => "kept_active",
        };
        Self::count(&self.trainings, result, 1);
    }

    /// A model server lists `model` in its `/v1/models`: requests for it get series of their
    /// own (the first [`MAX_MODEL_SERIES`] names served).
    pub fn model_served(&self, model: &str) {
        admitted(&self.models, model, MAX_MODEL_SERIES);
    }

    /// The series label of a model name: its own when a server serves it, else [`OTHER_MODEL`].
    fn model_labels(&self, model: &str) -> ModelLabels {
        let served = self.models.lock().unwrap_or_else(|p| p.into_inner()).contains(model);
        let name = if served { model } else { OTHER_MODEL }.to_string();
        ModelLabels { model_name: name.clone(), target_model_name: name }
    }

    /// The series label of a priority: its own while fewer than [`MAX_PRIORITY_SERIES`] have
    /// series, else [`OTHER_PRIORITY`].
    fn priority_label(&self, priority: i32) -> String {
        if admitted(&self.priorities, &priority, MAX_PRIORITY_SERIES) {
            priority.to_string()
        } else {
            OTHER_PRIORITY.to_string()
        }
    }

    /// A finished request: counts, sizes and duration by model; for complete streaming
    /// 200s also observed vs predicted latencies, live accuracy and SLO violations.
    pub fn observed(&self, o: &Observation) {
        let model = self.model_labels(&o.request.model);
        self.requests.get_or_create(&model).inc();
        self.input_tokens.get_or_create(&model).observe(f64::from(o.request.input_tokens));
        if o.report.status != 200 {
            let labels = ModelErrorLabels {
                model_name: model.model_name.clone(),
                target_model_name: model.target_model_name.clone(),
                error_code: o.report.status.to_string(),
            };
            self.request_errors.get_or_create(&labels).inc();
            return;
        }
        if o.report.e2e_ms.is_finite() && o.report.e2e_ms >= 0.0 {
            self.request_duration.get_or_create(&model).observe(o.report.e2e_ms / 1000.0);
            if let Some(n) = o.report.output_tokens.filter(|n| *n > 0) {
                self.normalized_tpot.get_or_create(&model).observe(o.report.e2e_ms / 1000.0 / f64::from(n));
            }
        }
        if let Some(n) = o.report.output_tokens {
            self.output_tokens.get_or_create(&model).observe(f64::from(n));
        }
        // Goals are per token: a whole response is not judged here (`Unstreamed::NotJudged`;
        // the benchmark judges it by its deadline), and a stream as `Slo::met_by` judges it.
        if !o.request.streaming {
            return;
        }
        let met = o.request.slo.met(o.report.ttft_ms, o.report.tpot_ms);
        let all = Slo::all_met(met);
        if let Some(all) = all {
            let result = if all { "met" } else { "missed" };
            let labels = SloResultLabels {
                pool: o.report.pool.clone(),
                priority: self.priority_label(o.request.priority),
                result: result.to_string(),
            };
            self.slo_requests.get_or_create(&labels).inc();
        }
        let pairs = [(o.report.ttft_ms, o.predicted_ttft_ms, met[0]), (o.report.tpot_ms, o.predicted_tpot_ms, met[1])];
        let names = ["ttft", "tpot"];
        self.judge_tier(o, all);
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for (k, (actual, predicted, met)) in pairs.into_iter().enumerate() {
            let Some(actual) = actual.filter(|a| a.is_finite() && *a > 0.0) else { continue };
            let (observed_h, predicted_h) =
                if k == 0 { (&self.ttft, &self.predicted_ttft) } else { (&self.tpot, &self.predicted_tpot) };
            observed_h.get_or_create(&model).observe(actual / 1000.0);
            if let Some(p) = predicted.filter(|p| p.is_finite()) {
                predicted_h.get_or_create(&model).observe(p / 1000.0);
                let (mape, coverage) = windows[k].push(p, actual);
                let label = TargetLabel { target: names[k].to_string() };
                self.live_mape.get_or_create(&label).set(mape);
                self.live_coverage.get_or_create(&label).set(coverage);
            }
            if met == Some(false) {
                let labels = ModelTypeLabels {
                    model_name: model.model_name.clone(),
                    target_model_name: model.target_model_name.clone(),
                    r#type: format!("{}_slo_violation", names[k]),
                };
                self.slo_violations.get_or_create(&labels).inc();
            }
        }
    }

    /// Sets the `inference_pool_*` gauges of every pool, dropping those of pools and
    /// endpoints gone (call inside [`Metrics::render_refreshed`]).
    pub fn set_pools(&self, pools: &[(String, PoolGauges)]) {
        for family in [&self.pool_kv_usage, &self.pool_queue, &self.pool_running] {
            family.clear();
        }
        self.pool_ready.clear();
        self.pool_pod_queue.clear();
        for (name, g) in pools {
            let label = PoolNameLabel { name: name.clone() };
            self.pool_ready.get_or_create(&label).set(g.ready as i64);
            self.pool_kv_usage.get_or_create(&label).set(g.kv_usage);
            self.pool_queue.get_or_create(&label).set(g.waiting);
            self.pool_running.get_or_create(&label).set(g.running);
            for (address, waiting) in &g.waiting_by_endpoint {
                let pod = PoolPodLabels { name: name.clone(), model_server_pod: address.clone() };
                self.pool_pod_queue.get_or_create(&pod).set(i64::from(*waiting));
            }
        }
    }

    /// Whether the tier the filter placed a request in came true, for requests placed by
    /// tier: `met` is whether its judged SLOs were met (`None`: none was judged).
    fn judge_tier(&self, o: &Observation, met: Option<bool>) {
        let positive = match o.report.source {
            RouteSource::PredictedPositive => true,
            RouteSource::PredictedNegative => false,
            _ => return,
        };
        let Some(met) = met else { return };
        let (precision, recall) = self.decisions.lock().unwrap_or_else(|p| p.into_inner()).push(positive, met);
        if let Some(p) = precision {
            self.tier_precision.set(p);
        }
        if let Some(r) = recall {
            self.tier_recall.set(r);
        }
    }

    /// Refills the gauges `/metrics` rebuilds on each scrape with `refresh`, then renders, as
    /// one step: a concurrent scrape waits rather than render a family the other cleared.
    pub fn render_refreshed(&self, refresh: impl FnOnce(&Metrics)) -> String {
        let _one_at_a_time = self.rendering.lock().unwrap_or_else(|p| p.into_inner());
        refresh(self);
        self.render()
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Counter::default(), Counter::default())
    }
}

#[cfg(test)]
mod tests;
