//! What the predictor keeps of each request it predicts, for its dispatch and its report.

use std::time::Duration;

use headroom_protocol::{EndpointState, RequestFeatures};

/// What the predictor itself saw of a request at the endpoint it was dispatched to, at
/// predict time: what a report of it is completed with before the predictor learns from
/// it, so training rows and calibration come from the predictor's own values, never from
/// an echo of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    /// The request's features (prefix hashes dropped: they served placement).
    pub request: RequestFeatures,
    /// The endpoint's state then: the model's input.
    pub state: EndpointState,
    pub predicted_ttft_ms: Option<f64>,
    pub predicted_tpot_ms: Option<f64>,
}

/// What one predict answer said for a request: its features and, per endpoint address,
/// the state and the predictions (TTFT, TPOT) answered.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub(super) request: RequestFeatures,
    pub(super) endpoints: Vec<(String, EndpointState, Option<f64>, Option<f64>)>,
}

impl Record {
    /// About the bytes it holds: its prefix hashes and its endpoints' states grow with the
    /// prompt and the pool (a pool of 1,000 endpoints makes each record some 200 KB).
    pub(super) fn bytes(&self) -> usize {
        let endpoint = std::mem::size_of::<(String, EndpointState, Option<f64>, Option<f64>)>();
        std::mem::size_of::<Record>()
            + self.request.prefix_hashes.len() * std::mem::size_of::<u64>()
            + self.request.model.len()
            + self.endpoints.iter().map(|(a, ..)| endpoint + a.len()).sum::<usize>()
    }
}

/// Most bytes a pool's records hold ([`Record::bytes`]); past it the oldest are forgotten,
/// and their dispatches are tracked without a record. Counted alone, 100,000 records of
/// 4,096 prefix hashes held 3.3 GB.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// How long a predict answer's record waits for its dispatch: the gateway dispatches on
/// its next tick (20 ms by default) after the answer; a record not dispatched by then
/// belongs to a request the gateway placed without it, or never sent.
pub(super) const RECORD_TTL: Duration = Duration::from_secs(10);
