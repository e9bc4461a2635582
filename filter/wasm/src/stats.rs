//! The filter's Envoy stats (shown in `/stats/prometheus` without the `envoy_` prefix).

use headroom_filter_core::host::{Event, FallbackCause};
use headroom_filter_core::outbox::Counts;
use headroom_protocol::{FlowOutcome, RouteSource};

use crate::host::{self, MetricKind};

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
    flow_withheld: Option<u32>,
    served_elsewhere: Option<u32>,
    cut_off: Option<u32>,
    priority_clamped: Option<u32>,
    slo_violation_ttft: Option<u32>,
    slo_violation_tpot: Option<u32>,
    /// Per flow outcome, in [`FlowOutcome::ALL`] order.
    flow: [Option<u32>; 6],
    flow_wait_ms: Option<u32>,
    coalesced_calls: Option<u32>,
    coalesced_requests: Option<u32>,
    /// Of the coalesced calls, those sent on the predict stream.
    calls_on_stream: Option<u32>,
    stream_opened: Option<u32>,
    stream_closed: Option<u32>,
    /// Linear memory of all of the plugin's VMs together (each adds its own changes).
    vm_memory: Option<u32>,
    /// The plugin's VMs that measure durations on the host's monotonic clock (each adds 1).
    monotonic_clock_vms: Option<u32>,
    /// This VM's share of `vm_memory` so far.
    vm_memory_seen: std::cell::Cell<u64>,
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
            flow_withheld: counter("flow.withheld"),
            served_elsewhere: counter("served_elsewhere"),
            cut_off: counter("response_cut_off"),
            priority_clamped: counter("priority_clamped"),
            slo_violation_ttft: counter("slo_violation.ttft"),
            slo_violation_tpot: counter("slo_violation.tpot"),
            flow: FlowOutcome::ALL.map(|o| counter(&format!("flow.{}", o.name()))),
            flow_wait_ms: host::define_metric(MetricKind::Histogram, "headroom.flow.wait_ms"),
            coalesced_calls: counter("predict_calls.coalesced"),
            coalesced_requests: counter("predict_calls.coalesced_requests"),
            calls_on_stream: counter("predict_calls.on_stream"),
            stream_opened: counter("predict_stream.opened"),
            stream_closed: counter("predict_stream.closed"),
            vm_memory: host::define_metric(MetricKind::Gauge, "headroom.vm_memory_bytes"),
            monotonic_clock_vms: host::define_metric(MetricKind::Gauge, "headroom.monotonic_clock_vms"),
            vm_memory_seen: std::cell::Cell::new(0),
        }
    }

    /// Counts this VM in `headroom.monotonic_clock_vms` when it reads the monotonic clock.
    pub fn clock(&self, monotonic: bool) {
        Self::inc(self.monotonic_clock_vms, u64::from(monotonic));
    }

    /// Adds `by` to a stat; no host call for nothing.
    fn inc(id: Option<u32>, by: u64) {
        if let Some(id) = id.filter(|_| by > 0) {
            host::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
        }
    }

    /// Counts one of the core's events.
    pub fn record(&self, event: Event) {
        match event {
            Event::Routed(source) => Self::inc(self.routed(source), 1),
            Event::Shed => Self::inc(self.shed, 1),
            Event::BadRequest => Self::inc(self.bad_request, 1),
            Event::Fallback(cause) => {
                let i = FallbackCause::ALL.iter().position(|c| *c == cause).unwrap_or(0);
                Self::inc(self.fallback[i], 1);
            }
            Event::PredictorCallMs(ms) => {
                if let Some(id) = self.predictor_call_ms {
                    host::record_metric(id, ms);
                }
            }
            Event::PredictorEjected => Self::inc(self.predictor_ejected, 1),
            Event::FlowWithheld => Self::inc(self.flow_withheld, 1),
            Event::ServedElsewhere => Self::inc(self.served_elsewhere, 1),
            Event::CutOff => Self::inc(self.cut_off, 1),
            Event::PriorityClamped => Self::inc(self.priority_clamped, 1),
            Event::SloViolation { ttft, tpot } => {
                Self::inc(self.slo_violation_ttft, u64::from(ttft));
                Self::inc(self.slo_violation_tpot, u64::from(tpot));
            }
            Event::Flow { outcome, waited_ms } => {
                let i = FlowOutcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
                Self::inc(self.flow[i], 1);
                if let Some(id) = self.flow_wait_ms.filter(|_| outcome != FlowOutcome::Immediate) {
                    host::record_metric(id, waited_ms);
                }
            }
            Event::Outbox(counts) => self.outbox(counts),
            Event::CoalescedCall { requests, stream } => {
                Self::inc(self.coalesced_calls, 1);
                Self::inc(self.coalesced_requests, requests as u64);
                Self::inc(self.calls_on_stream, u64::from(stream));
            }
            Event::PredictStream { open } => Self::inc(if open { self.stream_opened } else { self.stream_closed }, 1),
        }
    }

    /// This VM's linear memory is `bytes` now. The gauge is shared by every VM of the plugin
    /// (one per worker), so each adds the change since its last report: the gauge is their sum.
    pub fn vm_memory(&self, bytes: u64) {
        let Some(id) = self.vm_memory else { return };
        let change = i64::try_from(bytes).unwrap_or(i64::MAX) - i64::try_from(self.vm_memory_seen.get()).unwrap_or(0);
        if change != 0 {
            host::increment_metric(id, change);
            self.vm_memory_seen.set(bytes);
        }
    }

    fn routed(&self, source: RouteSource) -> Option<u32> {
        match source {
            RouteSource::PredictedPositive => self.routed_positive,
            RouteSource::PredictedNegative => self.routed_negative,
            RouteSource::Fallback => self.routed_fallback,
            RouteSource::Composite => self.routed_composite,
            RouteSource::Envoy => self.routed_envoy,
        }
    }

    /// What the outbox counted since the last tick: observations delivered, items dropped
    /// (queue full), items too large for any batch, items refused (4xx, never retried),
    /// batch calls failed (requeued).
    fn outbox(&self, c: Counts) {
        Self::inc(self.reports_sent, c.reported);
        Self::inc(self.reports_dropped, c.dropped);
        Self::inc(self.reports_oversized, c.oversized);
        Self::inc(self.reports_refused, c.refused);
        Self::inc(self.flush_failed, c.failed);
    }
}
