//! The filter's stats: every name, its kind, and what each [`Event`] adds to which. One
//! table for every host: the Wasm adapter defines them as Envoy stats (`headroom.<name>`,
//! `headroom_<name>` in Envoy's Prometheus page), the endpoint picker serves them on its
//! `/metrics` under the same names, so a dashboard reads either mode.

use headroom_protocol::{FlowOutcome, RouteSource};

use crate::host::{Event, FallbackCause};

/// How a stat adds up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    /// A distribution of values (milliseconds).
    Histogram,
}

/// Every stat an [`Event`] records, by its name under `headroom.`.
pub const STATS: [(&str, Kind); 33] = [
    ("routed.predicted_positive", Kind::Counter),
    ("routed.predicted_negative", Kind::Counter),
    ("routed.fallback", Kind::Counter),
    ("routed.composite", Kind::Counter),
    ("routed.envoy", Kind::Counter),
    ("shed", Kind::Counter),
    ("bad_request", Kind::Counter),
    ("no_endpoints", Kind::Counter),
    ("fallback.call_failed", Kind::Counter),
    ("fallback.timeout", Kind::Counter),
    ("fallback.unavailable", Kind::Counter),
    ("fallback.bad_answer", Kind::Counter),
    ("fallback.no_predictions", Kind::Counter),
    ("predictor_call_ms", Kind::Histogram),
    ("reports.sent", Kind::Counter),
    ("reports.dropped", Kind::Counter),
    ("reports.flush_failed", Kind::Counter),
    ("reports.refused", Kind::Counter),
    ("reports.oversized", Kind::Counter),
    ("predictor.ejected", Kind::Counter),
    ("flow.withheld", Kind::Counter),
    ("served_elsewhere", Kind::Counter),
    ("endpoint.failed", Kind::Counter),
    ("endpoint.ejected", Kind::Counter),
    ("response_cut_off", Kind::Counter),
    ("priority_clamped", Kind::Counter),
    ("slo_violation.ttft", Kind::Counter),
    ("slo_violation.tpot", Kind::Counter),
    ("flow.wait_ms", Kind::Histogram),
    ("predict_calls.coalesced", Kind::Counter),
    ("predict_calls.coalesced_requests", Kind::Counter),
    ("predict_calls.on_stream", Kind::Counter),
    ("predict_stream.opened", Kind::Counter),
];

/// The stat each flow outcome counts in (`flow.<outcome>`), in [`FlowOutcome::ALL`] order;
/// with [`STATS`] and [`PREDICT_STREAM_CLOSED`], every stat there is.
pub const FLOW_OUTCOMES: [&str; 6] =
    ["flow.immediate", "flow.released", "flow.expired", "flow.saturated", "flow.queue_full", "flow.unmeetable"];

/// The predict stream closed.
pub const PREDICT_STREAM_CLOSED: &str = "predict_stream.closed";

/// The endpoint picker's own series beside the table's (it has streams and worker threads
/// the Wasm filter does not), full names: ext_proc streams open now (a gauge).
pub const PICKER_OPEN_STREAMS: &str = "headroom_epp_open_streams";
/// Picker workers restarted after a step panicked, their streams ended (a counter).
pub const PICKER_WORKER_RESTARTS: &str = "headroom_epp_worker_restarts";

/// Every stat's name and kind: [`STATS`], the flow outcomes, the stream's close.
pub fn all() -> impl Iterator<Item = (&'static str, Kind)> {
    STATS
        .into_iter()
        .chain(FLOW_OUTCOMES.into_iter().map(|n| (n, Kind::Counter)))
        .chain(std::iter::once((PREDICT_STREAM_CLOSED, Kind::Counter)))
}

fn routed(source: RouteSource) -> &'static str {
    match source {
        RouteSource::PredictedPositive => "routed.predicted_positive",
        RouteSource::PredictedNegative => "routed.predicted_negative",
        RouteSource::Fallback => "routed.fallback",
        RouteSource::Composite => "routed.composite",
        RouteSource::Envoy => "routed.envoy",
    }
}

fn fallback(cause: FallbackCause) -> &'static str {
    match cause {
        FallbackCause::CallFailed => "fallback.call_failed",
        FallbackCause::Timeout => "fallback.timeout",
        FallbackCause::Unavailable => "fallback.unavailable",
        FallbackCause::BadAnswer => "fallback.bad_answer",
        FallbackCause::NoPredictions => "fallback.no_predictions",
    }
}

fn flow(outcome: FlowOutcome) -> &'static str {
    let i = FlowOutcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
    FLOW_OUTCOMES[i]
}

/// What `event` records: each stat it touches and the amount (a count to add, or a value
/// for a histogram), handed to `add`. Amounts of zero are left out.
pub fn record(event: Event, mut add: impl FnMut(&'static str, u64)) {
    let mut put = |name, by| {
        if by > 0 {
            add(name, by);
        }
    };
    match event {
        Event::Routed(source) => put(routed(source), 1),
        Event::Shed => put("shed", 1),
        Event::BadRequest => put("bad_request", 1),
        Event::NoEndpoints => put("no_endpoints", 1),
        Event::PriorityClamped => put("priority_clamped", 1),
        Event::Fallback(cause) => put(fallback(cause), 1),
        // A call answered within the millisecond is a value of 0, still recorded.
        Event::PredictorCallMs(ms) => add("predictor_call_ms", ms),
        Event::PredictorEjected => put("predictor.ejected", 1),
        Event::FlowWithheld => put("flow.withheld", 1),
        Event::ServedElsewhere => put("served_elsewhere", 1),
        Event::EndpointFailed { ejected } => {
            put("endpoint.failed", 1);
            put("endpoint.ejected", u64::from(ejected));
        }
        Event::CutOff => put("response_cut_off", 1),
        Event::SloViolation { ttft, tpot } => {
            put("slo_violation.ttft", u64::from(ttft));
            put("slo_violation.tpot", u64::from(tpot));
        }
        Event::Flow { outcome, waited_ms } => {
            put(flow(outcome), 1);
            if outcome != FlowOutcome::Immediate {
                add("flow.wait_ms", waited_ms);
            }
        }
        Event::Outbox(c) => {
            put("reports.sent", c.reported);
            put("reports.dropped", c.dropped);
            put("reports.oversized", c.oversized);
            put("reports.refused", c.refused);
            put("reports.flush_failed", c.failed);
        }
        Event::CoalescedCall { requests, stream } => {
            put("predict_calls.coalesced", 1);
            put("predict_calls.coalesced_requests", requests as u64);
            put("predict_calls.on_stream", u64::from(stream));
        }
        Event::PredictStream { open: true } => put("predict_stream.opened", 1),
        Event::PredictStream { open: false } => put(PREDICT_STREAM_CLOSED, 1),
    }
}

/// The kind of stat `name` (`None`: not one of the filter's).
pub fn kind(name: &str) -> Option<Kind> {
    all().find(|(n, _)| *n == name).map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::Counts;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_event_records_only_stats_in_the_table_and_names_are_unique() {
        let mut names: Vec<&str> = all().map(|(n, _)| n).collect();
        let before = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), before, "a stat named twice");
        let counts = Counts { reported: 1, dropped: 1, oversized: 1, refused: 1, failed: 1 };
        let mut events = vec![
            Event::Shed,
            Event::BadRequest,
            Event::NoEndpoints,
            Event::PriorityClamped,
            Event::PredictorCallMs(3),
            Event::PredictorEjected,
            Event::FlowWithheld,
            Event::ServedElsewhere,
            Event::EndpointFailed { ejected: true },
            Event::CutOff,
            Event::SloViolation { ttft: true, tpot: true },
            Event::Outbox(counts),
            Event::CoalescedCall { requests: 4, stream: true },
            Event::PredictStream { open: true },
            Event::PredictStream { open: false },
        ];
        events.extend(FallbackCause::ALL.map(Event::Fallback));
        events.extend(FlowOutcome::ALL.map(|outcome| Event::Flow { outcome, waited_ms: 5 }));
        for source in [
            RouteSource::PredictedPositive,
            RouteSource::PredictedNegative,
            RouteSource::Fallback,
            RouteSource::Composite,
            RouteSource::Envoy,
        ] {
            events.push(Event::Routed(source));
        }
        let mut touched = Vec::new();
        for event in events {
            record(event, |name, _| {
                assert!(kind(name).is_some(), "{event:?} records {name}, which is not in the table");
                touched.push(name);
            });
        }
        touched.sort_unstable();
        touched.dedup();
        assert_eq!(touched, names, "a stat no event records");
    }

    #[test]
    fn a_fallback_cause_counts_under_its_own_name() {
        for cause in FallbackCause::ALL {
            let mut got = Vec::new();
            record(Event::Fallback(cause), |name, by| got.push((name, by)));
            assert_eq!(got, vec![(fallback(cause), 1)]);
            assert_eq!(fallback(cause), format!("fallback.{}", cause.name()));
        }
        for outcome in FlowOutcome::ALL {
            assert_eq!(flow(outcome), format!("flow.{}", outcome.name()));
        }
    }
}
