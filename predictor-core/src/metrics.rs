//! The service's own Prometheus metrics (`GET /metrics`).
//!
//! `headroom_*` names, plus the `inference_objective_request_*` names users of
//! the Gateway API Inference Extension already chart (observed and predicted
//! TTFT/TPOT, prediction duration, SLO violations).

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use headroom_protocol::{Observation, RouteSource};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::model::store::TrainOutcome;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    pub r#type: String,
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
    ttft: Histogram,
    predicted_ttft: Histogram,
    tpot: Histogram,
    predicted_tpot: Histogram,
    ttft_prediction_duration: Histogram,
    tpot_prediction_duration: Histogram,
    slo_violations: Family<TypeLabel, Counter>,
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
        let latency = || Histogram::new(exponential_buckets(0.001, 2.0, 18));
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
            ttft: latency(),
            predicted_ttft: latency(),
            tpot: latency(),
            predicted_tpot: latency(),
            ttft_prediction_duration: duration(),
            tpot_prediction_duration: duration(),
            slo_violations: Family::default(),
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
        r.register("headroom_dispatches", "Dispatch items by result", m.dispatches.clone());
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
            "Requests dispatched and not reported within their expiry (in_flight_expiry_multiple times the predicted end-to-end time, within in_flight_min_s..=in_flight_ttl_s), forgotten",
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
            "Finished requests that missed a stated SLO",
            m.slo_violations.clone(),
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
            "headroom_saturation",
            "Time to drain the queue at the current rate over the mean time its requests have left (0: nothing waits; above 1: they cannot all make their SLOs)",
            m.saturation.clone(),
        );
        Metrics { registry: r, ..m }
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

    /// Observed vs predicted latencies of a finished request, live accuracy, SLO violations.
    pub fn observed(&self, o: &Observation) {
        if o.status != 200 || !o.request.streaming {
            return;
        }
        let met = o.request.slo.met(o.ttft_ms, o.tpot_ms);
        let pairs = [(o.ttft_ms, o.predicted_ttft_ms, met[0]), (o.tpot_ms, o.predicted_tpot_ms, met[1])];
        let names = ["ttft", "tpot"];
        self.judge_tier(o);
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for (k, (actual, predicted, met)) in pairs.into_iter().enumerate() {
            let Some(actual) = actual.filter(|a| a.is_finite() && *a > 0.0) else { continue };
            let (observed_h, predicted_h) =
                if k == 0 { (&self.ttft, &self.predicted_ttft) } else { (&self.tpot, &self.predicted_tpot) };
            observed_h.observe(actual / 1000.0);
            if let Some(p) = predicted.filter(|p| p.is_finite()) {
                predicted_h.observe(p / 1000.0);
                let (mape, coverage) = windows[k].push(p, actual);
                let label = TargetLabel { target: names[k].to_string() };
                self.live_mape.get_or_create(&label).set(mape);
                self.live_coverage.get_or_create(&label).set(coverage);
            }
            if met == Some(false) {
                self.slo_violations.get_or_create(&TypeLabel { r#type: names[k].to_string() }).inc();
            }
        }
    }

    /// Whether the tier the filter placed a request in came true: judged on the SLOs it
    /// stated that were measured (a TPOT needs two tokens), for requests placed by tier.
    fn judge_tier(&self, o: &Observation) {
        let positive = match o.source {
            RouteSource::PredictedPositive => true,
            RouteSource::PredictedNegative => false,
            _ => return,
        };
        let judged: Vec<bool> = o.request.slo.met(o.ttft_ms, o.tpot_ms).into_iter().flatten().collect();
        if judged.is_empty() {
            return;
        }
        let met = judged.iter().all(|&m| m);
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
mod tests {
    use super::*;
    use headroom_protocol::RequestFeatures;

    fn placed(source: RouteSource, slo_ttft: f64, ttft: f64) -> Observation {
        let mut request = RequestFeatures { streaming: true, ..Default::default() };
        request.slo.ttft_ms = Some(slo_ttft);
        Observation {
            pool: "p".into(),
            request_id: "r".into(),
            endpoint: "e:1".into(),
            request,
            state_at_dispatch: None,
            predicted_ttft_ms: Some(100.0),
            predicted_tpot_ms: None,
            source,
            ttft_ms: Some(ttft),
            tpot_ms: None,
            e2e_ms: ttft,
            output_tokens: Some(1),
            cached_tokens: None,
            status: 200,
        }
    }

    fn gauge(m: &Metrics, name: &str) -> f64 {
        let text = m.render();
        let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_default();
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
    }

    #[test]
    fn tier_precision_and_recall_judge_placements_by_their_outcome() {
        let m = Metrics::default();
        // Three positive placements, two met; one negative placement that met anyway.
        m.observed(&placed(RouteSource::PredictedPositive, 500.0, 300.0));
        m.observed(&placed(RouteSource::PredictedPositive, 500.0, 450.0));
        m.observed(&placed(RouteSource::PredictedPositive, 500.0, 900.0));
        m.observed(&placed(RouteSource::PredictedNegative, 500.0, 200.0));
        // Not a tier placement: ignored.
        m.observed(&placed(RouteSource::Fallback, 500.0, 900.0));
        assert!((gauge(&m, "headroom_tier_precision") - 2.0 / 3.0).abs() < 1e-9);
        assert!((gauge(&m, "headroom_tier_recall") - 2.0 / 3.0).abs() < 1e-9);
    }
}
