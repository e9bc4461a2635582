//! Every HTTP header name headroom reads or writes, defined once: the filter, the
//! simulated model server, the load generator and the tests all use these.

/// TTFT SLO headers, preferred first (the newer llm-d name, then its alias).
pub const SLO_TTFT: [&str; 2] = ["x-llm-d-slo-ttft-ms", "x-slo-ttft-ms"];
/// TPOT SLO headers, preferred first.
pub const SLO_TPOT: [&str; 2] = ["x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"];
/// `true` asks for SLO routing; `false` or absent, the default profile.
pub const PREDICTION_BASED: &str = "x-prediction-based-scheduling";
/// The caller's priority (the filter's default `priority_header`); below zero: sheddable.
pub const PRIORITY: &str = "x-request-priority";
/// The tenant a request belongs to (the filter's default `fairness_header`, llm-d's
/// name): within a priority band of the flow-control queue, tenants take turns.
pub const FAIRNESS_ID: &str = "x-llm-d-inference-fairness-id";
/// The Gateway API Inference Extension's older name for [`FAIRNESS_ID`], read when the
/// default header is configured and absent, as llm-d's router reads it.
pub const FAIRNESS_ID_ALIAS: &str = "x-gateway-inference-fairness-id";
/// The InferenceObjective a request belongs to (llm-d's name): its priority is the one the
/// filter's `objectives` gives that name, set by the operator, not claimed by the client.
pub const OBJECTIVE: &str = "x-llm-d-inference-objective";
/// The Gateway API Inference Extension's older name for [`OBJECTIVE`], read when it is absent.
pub const OBJECTIVE_ALIAS: &str = "x-gateway-inference-objective";
/// Where the gateway sends the request (the filter's default `destination_header`),
/// read by Envoy's override_host load balancer. Never accepted from a client.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// Debug response header: the endpoint the filter chose (`debug_headers`).
pub const DEBUG_ENDPOINT: &str = "x-headroom-endpoint";
/// Debug response header: the tier it came from ([`crate::RouteSource::tier`]).
pub const DEBUG_TIER: &str = "x-headroom-tier";
/// Debug response header: the chosen endpoint's predicted TTFT.
pub const DEBUG_PREDICTED_TTFT: &str = "x-headroom-predicted-ttft-ms";
/// Debug response header: the chosen endpoint's predicted TPOT.
pub const DEBUG_PREDICTED_TPOT: &str = "x-headroom-predicted-tpot-ms";
/// Debug response header: how long the request waited in the flow-control queue (ms),
/// when it waited.
pub const DEBUG_QUEUED: &str = "x-headroom-queued-ms";
/// Debug response header: how it left that queue (`released` or `expired`), when it waited.
pub const DEBUG_FLOW: &str = "x-headroom-flow";
/// Response header on every `429` the gateway answers itself: why the request was dropped
/// before it reached a model server, in llm-d's words ([`DroppedReason`]), so a client or a
/// dashboard written for an llm-d gateway reads headroom's refusals the same way.
pub const DROPPED_REASON: &str = "x-llm-d-request-dropped-reason";

/// The values of [`DROPPED_REASON`] headroom sends (a subset of llm-d's), on its 429s and 503s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DroppedReason {
    /// The fleet has no room for it within its SLO now: refused at admission by a saturated
    /// fleet, or shed because no endpoint can meet its SLO (`rejected-saturated`).
    Saturated,
    /// Its deadline passed while it waited in the flow-control queue (`rejected-ttl-expired`).
    TtlExpired,
    /// No endpoint it may go to is known: the gateway's subset hint names none the pool has
    /// (`rejected-no-endpoints`, a 503).
    NoEndpoints,
}

impl DroppedReason {
    pub fn name(self) -> &'static str {
        match self {
            DroppedReason::Saturated => "rejected-saturated",
            DroppedReason::TtlExpired => "rejected-ttl-expired",
            DroppedReason::NoEndpoints => "rejected-no-endpoints",
        }
    }
}

/// The client's conversation, as chat clients send one: headroom does not read it (a turn's
/// prompt says where its conversation is cached); the sticky-session baseline hashes it
/// (`envoy/baseline.yaml.tmpl`), as operators' session affinity does.
pub const SESSION_ID: &str = "x-session-id";

/// Envoy's per-try timeout (its router filter's header): the filter sets it from the
/// request's goals (`try_timeout_slo_factor`). It bounds a try until the response begins,
/// and a try past it is retried on the next endpoint.
pub const PER_TRY_TIMEOUT: &str = "x-envoy-upstream-rq-per-try-timeout-ms";

/// Response header naming the model server that answered (`ip:port`): the simulator sends its
/// own, and the local stack's Envoy configs add it where the server did not (vLLM).
pub const SERVED_BY: &str = "x-served-by";

/// True for a header a gateway routes by and must not forward to model servers
/// (`priority_header` is the configured priority header name).
pub fn is_routing_hint(name: &str, priority_header: &str) -> bool {
    SLO_TTFT.contains(&name) || SLO_TPOT.contains(&name) || name == PREDICTION_BASED || name == priority_header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_recognised_and_nothing_else() {
        for name in SLO_TTFT.iter().chain(SLO_TPOT.iter()).chain([PREDICTION_BASED, PRIORITY].iter()) {
            assert!(is_routing_hint(name, PRIORITY), "{name}");
        }
        for name in [DESTINATION, SERVED_BY, "x-request-id", "content-type"] {
            assert!(!is_routing_hint(name, PRIORITY), "{name}");
        }
    }
}
