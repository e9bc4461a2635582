//! The filter's Envoy stats (shown in `/stats/prometheus` without the `envoy_` prefix).

use crate::host::{self, MetricKind};

/// Why the filter could not route by prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackCause {
    /// The callout could not be started (e.g. cluster missing).
    CallFailed,
    /// The predictor did not answer within `predictor_timeout_ms` (504).
    Timeout,
    /// The predictor was unreachable (503) or answered another non-200.
    Unavailable,
    /// The answer could not be decoded.
    BadAnswer,
    /// The answer held no prediction for any endpoint.
    NoPredictions,
}

impl FallbackCause {
    fn name(self) -> &'static str {
        match self {
            FallbackCause::CallFailed => "call_failed",
            FallbackCause::Timeout => "timeout",
            FallbackCause::Unavailable => "unavailable",
            FallbackCause::BadAnswer => "bad_answer",
            FallbackCause::NoPredictions => "no_predictions",
        }
    }

    const ALL: [FallbackCause; 5] = [
        FallbackCause::CallFailed,
        FallbackCause::Timeout,
        FallbackCause::Unavailable,
        FallbackCause::BadAnswer,
        FallbackCause::NoPredictions,
    ];
}

/// Stat ids of one VM. A stat the host refused is `None` and simply not recorded.
#[derive(Debug, Default)]
pub struct Stats {
    routed_positive: Option<u32>,
    routed_negative: Option<u32>,
    routed_fallback: Option<u32>,
    routed_composite: Option<u32>,
    routed_envoy: Option<u32>,
    shed: Option<u32>,
    bad_request: Option<u32>,
    fallback: [Option<u32>; 5],
    predictor_call_ms: Option<u32>,
    reports_sent: Option<u32>,
    reports_dropped: Option<u32>,
    flush_failed: Option<u32>,
    reports_refused: Option<u32>,
    reports_oversized: Option<u32>,
    predictor_ejected: Option<u32>,
    served_elsewhere: Option<u32>,
    slo_violation_ttft: Option<u32>,
    slo_violation_tpot: Option<u32>,
}

impl Stats {
    /// Defines every stat.
    pub fn define() -> Stats {
        let counter = |name: &str| host::define_metric(MetricKind::Counter, &format!("headroom.{name}"));
        Stats {
            routed_positive: counter("routed.predicted_positive"),
            routed_negative: counter("routed.predicted_negative"),
            routed_fallback: counter("routed.fallback"),
            routed_composite: counter("routed.composite"),
            routed_envoy: counter("routed.envoy"),
            shed: counter("shed"),
            bad_request: counter("bad_request"),
            fallback: FallbackCause::ALL.map(|c| counter(&format!("fallback.{}", c.name()))),
            predictor_call_ms: host::define_metric(MetricKind::Histogram, "headroom.predictor_call_ms"),
            reports_sent: counter("reports.sent"),
            reports_dropped: counter("reports.dropped"),
            flush_failed: counter("reports.flush_failed"),
            reports_refused: counter("reports.refused"),
            reports_oversized: counter("reports.oversized"),
            predictor_ejected: counter("predictor.ejected"),
            served_elsewhere: counter("served_elsewhere"),
            slo_violation_ttft: counter("slo_violation.ttft"),
            slo_violation_tpot: counter("slo_violation.tpot"),
        }
    }

    fn inc(id: Option<u32>, by: u64) {
        if let Some(id) = id {
            host::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
        }
    }

    pub fn routed(&self, source: headroom_protocol::RouteSource) {
        use headroom_protocol::RouteSource::*;
        Self::inc(
            match source {
                PredictedPositive => self.routed_positive,
                PredictedNegative => self.routed_negative,
                Fallback => self.routed_fallback,
                Composite => self.routed_composite,
                Envoy => self.routed_envoy,
            },
            1,
        );
    }

    pub fn fallback(&self, cause: FallbackCause) {
        let i = FallbackCause::ALL.iter().position(|c| *c == cause).unwrap_or(0);
        Self::inc(self.fallback[i], 1);
    }

    pub fn shed(&self) {
        Self::inc(self.shed, 1);
    }

    pub fn bad_request(&self) {
        Self::inc(self.bad_request, 1);
    }

    pub fn predictor_call(&self, ms: u64) {
        if let Some(id) = self.predictor_call_ms {
            host::record_metric(id, ms);
        }
    }

    /// What the outbox counted since the last tick: observations delivered, items dropped
    /// (queue full), items too large for any batch, items refused (4xx, never retried),
    /// batch calls failed (requeued).
    pub fn outbox(&self, c: headroom_filter_core::outbox::Counts) {
        Self::inc(self.reports_sent, c.reported);
        Self::inc(self.reports_dropped, c.dropped);
        Self::inc(self.reports_oversized, c.oversized);
        Self::inc(self.reports_refused, c.refused);
        Self::inc(self.flush_failed, c.failed);
    }

    /// A predictor replica skipped after repeated failures.
    pub fn predictor_ejected(&self) {
        Self::inc(self.predictor_ejected, 1);
    }

    /// A routed request served by another endpoint than the chosen one (a retry,
    /// or a chosen endpoint missing from Envoy's cluster).
    pub fn served_elsewhere(&self) {
        Self::inc(self.served_elsewhere, 1);
    }

    /// Counts observed SLO misses of a finished streaming request.
    pub fn slo_violations(&self, ttft: bool, tpot: bool) {
        if ttft {
            Self::inc(self.slo_violation_ttft, 1);
        }
        if tpot {
            Self::inc(self.slo_violation_tpot, 1);
        }
    }
}
