//! Headroom: the slack between a request's stated SLOs and an endpoint's
//! predictions. Defined here because two components judge it: the filter's
//! policy (which tier an endpoint is in) and the predictor's flow control
//! (whether a queued request can go now). One definition, or they disagree on
//! when a request "fits".
//!
//! `ttft = slo_ttft - predicted_ttft`; for a streaming request with a TPOT SLO
//! `tpot = min(slo_tpot, tightest TPOT SLO running there) * buffer -
//! predicted_tpot`. Only the SLOs the request stated are judged.

use crate::messages::{EndpointPrediction, RequestFeatures};

/// Per-endpoint headroom of one request (`None`: that SLO is not judged).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headroom {
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
}

impl Headroom {
    /// Every judged SLO is predicted to be met.
    pub fn is_positive(&self) -> bool {
        self.ttft.is_none_or(|h| h >= 0.0) && self.tpot.is_none_or(|h| h >= 0.0)
    }
}

/// Headroom of `request` on one endpoint; `None` when a judged SLO has no prediction.
pub fn headroom(request: &RequestFeatures, endpoint: &EndpointPrediction, tpot_buffer: f64) -> Option<Headroom> {
    let ttft = match request.slo.ttft_ms {
        Some(slo) => Some(slo - endpoint.ttft_ms?),
        None => None,
    };
    // A non-streaming caller never sees tokens one by one: TPOT is not judged.
    let tpot = match request.slo.tpot_ms {
        Some(slo) if request.streaming => {
            // Only a real (positive) running SLO tightens the target; a missing
            // one never weakens it (the reference let "no SLO" enter as 0).
            let target = match endpoint.state.tightest_tpot_slo_ms {
                Some(running) if running > 0.0 => slo.min(running),
                _ => slo,
            };
            Some(target * tpot_buffer - endpoint.tpot_ms?)
        }
        _ => None,
    };
    Some(Headroom { ttft, tpot })
}
