//! The service's own Prometheus metrics (`GET /metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    pub pool: String,
    pub endpoint: String,
}

pub struct Metrics {
    registry: Registry,
    predictions: Counter,
    predict_duration: Histogram,
    dispatches: Family<ResultLabel, Counter>,
    reports: Family<ResultLabel, Counter>,
    scrapes: Family<ResultLabel, Counter>,
    observed_ttft: Histogram,
    observed_tpot: Histogram,
    pub in_flight: Family<EndpointLabel, Gauge>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("headroom");
        let predictions = Counter::default();
        let predict_duration = Histogram::new(exponential_buckets(1e-6, 2.0, 20));
        let dispatches = Family::<ResultLabel, Counter>::default();
        let reports = Family::<ResultLabel, Counter>::default();
        let scrapes = Family::<ResultLabel, Counter>::default();
        let observed_ttft = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let observed_tpot = Histogram::new(exponential_buckets(0.001, 2.0, 12));
        let in_flight = Family::<EndpointLabel, Gauge>::default();
        registry.register("predictions", "Predict requests answered", predictions.clone());
        registry.register("predict_duration_seconds", "Time to answer one predict request", predict_duration.clone());
        registry.register("dispatches", "Dispatch items by result", dispatches.clone());
        registry.register("reports", "Observation items by result", reports.clone());
        registry.register("scrapes", "Endpoint metric scrapes by result", scrapes.clone());
        registry.register("observed_ttft_seconds", "Observed time to first token (streaming)", observed_ttft.clone());
        registry.register("observed_tpot_seconds", "Observed time per output token", observed_tpot.clone());
        registry.register("in_flight_requests", "Requests dispatched and not yet reported", in_flight.clone());
        Metrics {
            registry,
            predictions,
            predict_duration,
            dispatches,
            reports,
            scrapes,
            observed_ttft,
            observed_tpot,
            in_flight,
        }
    }

    pub fn predicted(&self, seconds: f64) {
        self.predictions.inc();
        self.predict_duration.observe(seconds);
    }

    fn count(family: &Family<ResultLabel, Counter>, result: &str, n: u64) {
        family.get_or_create(&ResultLabel { result: result.to_string() }).inc_by(n);
    }

    pub fn dispatch(&self, result: &str, n: u64) {
        Self::count(&self.dispatches, result, n);
    }

    pub fn report(&self, result: &str, n: u64) {
        Self::count(&self.reports, result, n);
    }

    pub fn scrape(&self, ok: bool) {
        Self::count(&self.scrapes, if ok { "ok" } else { "error" }, 1);
    }

    pub fn observed(&self, ttft_ms: Option<f64>, tpot_ms: Option<f64>, streaming: bool) {
        if let (Some(t), true) = (ttft_ms, streaming) {
            self.observed_ttft.observe(t / 1000.0);
        }
        if let Some(t) = tpot_ms {
            self.observed_tpot.observe(t / 1000.0);
        }
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
        Self::new()
    }
}
