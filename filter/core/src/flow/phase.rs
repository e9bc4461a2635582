//! The phases of a request's life through the filter, and what each holds.

use headroom_protocol::meter::ResponseMeter;
use headroom_protocol::{Dispatch, RouteSource};

use crate::host::Host;

/// The endpoint chosen and what was known about it.
#[derive(Debug, Clone)]
pub(super) struct Choice {
    pub(super) endpoint: String,
    /// Endpoints to try next on retry, in order.
    pub(super) fallbacks: Vec<String>,
    pub(super) source: RouteSource,
    /// What the predictor predicted there: the debug headers say it.
    pub(super) predicted_ttft_ms: Option<f64>,
    pub(super) predicted_tpot_ms: Option<f64>,
}

/// A predictor call under way.
#[derive(Debug, Clone)]
pub(crate) struct Callout {
    pub(super) token: u32,
    pub(super) started_ns: u64,
    pub(super) cluster: String,
}

/// Where a request is in its life through the filter. Each callback acts on the phase it
/// finds and moves it on:
///
/// ```text
/// Passing ─headers: an inference request─> Reading ─body whole─> Asking ─answer─> Forwarded
///                  (header-only routing: ─────────────────────> Asking)
/// Reading, Asking ─bad input, shed, no endpoint─> Answered
/// Reading, Asking ─predictor failed─> Forwarded (the fallback)
/// ```
#[derive(Debug, Default)]
pub(crate) enum Phase {
    /// Not an inference request the filter routes: it passes untouched.
    #[default]
    Passing,
    /// Answered by the gateway itself (a 400, 413, 429 or 503); nothing is reported.
    Answered,
    /// The headers held (and so the upstream choice) until the body is whole.
    Reading,
    /// Waiting for the predictor.
    Asking(Asking),
    /// Sent upstream: its destination set (or left to Envoy), its response measured.
    Forwarded(Box<Forwarded>),
}

/// How a request waits for the predictor.
#[derive(Debug)]
pub(crate) enum Asking {
    /// Its own call; `offered_wait`: it may wait in the predictor's flow-control queue.
    Call { callout: Callout, offered_wait: bool },
    /// Its share of a coalesced call, since this time (ns).
    Coalesced { since_ns: u64 },
}

/// A request sent upstream, and what its response showed so far.
#[derive(Debug, Default)]
pub(crate) struct Forwarded {
    /// The endpoint the filter chose; `None`: Envoy balances.
    pub(super) choice: Option<Choice>,
    /// When it was sent (ns).
    pub(super) at_ns: u64,
    /// Header-only routing: the request's dispatch, held until its body has passed, so the
    /// predictor books the prompt the body carried and not what `content-length` claimed.
    /// With the predictor replica current when it was placed: its dispatch goes there.
    pub(super) held_dispatch: Option<(Dispatch, String)>,
    /// The outbox's sequence number of this request's dispatch (0: none).
    pub(super) dispatch_seq: u64,
    pub(super) meter: Option<ResponseMeter>,
    pub(super) status: u16,
    /// The upstream that serves it, once the host said ([`Forwarded::served`]).
    pub(super) served: Option<String>,
    /// The first-token event is queued (once per request).
    pub(super) first_token_queued: bool,
}

impl Forwarded {
    /// Where the request runs (`upstream.address`), asked of the host until it is known:
    /// the first token and the log both need it, and it is fixed once the response began.
    pub(super) fn served(&mut self, host: &dyn Host) -> Option<String> {
        if self.served.is_none() {
            self.served = host.upstream_address();
        }
        self.served.clone()
    }
}
