//! What the filter needs from its host, as a trait: the seam between the flow
//! (`flow`, `vm`) and Envoy.
//!
//! The Wasm adapter implements [`Host`] over the proxy-wasm ABI; the unit tests
//! implement it over maps and vectors, so every path a request can take runs
//! without Envoy. Host calls that fail return [`HostError`] values: the flow
//! logs and goes on, because a panic would kill the Wasm VM.
//!
//! Two host actions are not here but returned as a `Step` (module `flow`):
//! resuming a paused request and sending a local reply. The adapter carries them
//! out after the flow returns, with no state of the filter borrowed, in case the
//! host runs another callback of the filter inside them.

use std::time::Duration;

use headroom_protocol::{codec, FlowOutcome, Format, RouteSource};
use serde::de::DeserializeOwned;

use crate::header_map::HeaderMap;
use crate::outbox::Counts;

/// A header map the filter reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Map {
    RequestHeaders,
    ResponseHeaders,
    /// The headers of the answer to the filter's own call (`:status`).
    CalloutHeaders,
}

/// A body the filter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buffer {
    RequestBody,
    ResponseBody,
    CalloutBody,
    /// The message that arrived on a gRPC stream (`Vm::on_stream_message`).
    StreamMessage,
}

/// Log levels of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// A host call that did not succeed; the raw proxy-wasm status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub u32);

impl HostError {
    /// proxy-wasm's status for a call the host does not implement.
    pub const UNIMPLEMENTED: u32 = 12;
}

/// Why the filter could not route by prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackCause {
    /// The callout could not be started (e.g. cluster missing).
    CallFailed,
    /// The predictor did not answer within `predictor_timeout_ms` (504).
    Timeout,
    /// The predictor was unreachable (503) or answered another non-200.
    Unavailable,
    /// The answer could not be decoded, or broke the contract's bounds.
    BadAnswer,
    /// The answer held no prediction for any endpoint.
    NoPredictions,
}

impl FallbackCause {
    pub const ALL: [FallbackCause; 5] = [
        FallbackCause::CallFailed,
        FallbackCause::Timeout,
        FallbackCause::Unavailable,
        FallbackCause::BadAnswer,
        FallbackCause::NoPredictions,
    ];

    /// The cause's name in the filter's stats (`headroom.fallback.<name>`).
    pub fn name(self) -> &'static str {
        match self {
            FallbackCause::CallFailed => "call_failed",
            FallbackCause::Timeout => "timeout",
            FallbackCause::Unavailable => "unavailable",
            FallbackCause::BadAnswer => "bad_answer",
            FallbackCause::NoPredictions => "no_predictions",
        }
    }
}

/// Something the filter counts; the adapter maps each to a host stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A routed request, by how its endpoint was chosen.
    Routed(RouteSource),
    /// A sheddable request answered 429.
    Shed,
    /// A request answered 400 by the filter.
    BadRequest,
    /// A request answered 503: none of the endpoints the gateway allows it is known.
    NoEndpoints,
    /// A client's priority claim outside `client_priority_range`, held to it.
    PriorityClamped,
    Fallback(FallbackCause),
    /// A predictor callout's round trip.
    PredictorCallMs(u64),
    /// A predictor replica skipped after repeated failures.
    PredictorEjected,
    /// A request that would have offered to wait in the flow-control queue did not, because
    /// the predictor has answered no call for [`crate::vm::SILENT_MS`]: it gets the short
    /// callout budget, so a frozen predictor costs it at most `predictor_timeout_ms`.
    FlowWithheld,
    /// A routed request served by another endpoint than the chosen one (a retry,
    /// or a chosen endpoint missing from Envoy's cluster).
    ServedElsewhere,
    /// An endpoint failed a request (a 5xx, or Envoy retried it elsewhere), and whether
    /// that ejected it from this VM's choices (`headroom_protocol::health`).
    EndpointFailed {
        ejected: bool,
    },
    /// A 200 response cut off before its end (the server or its connection failed mid-body):
    /// reported with status 0, learnt from by nothing.
    CutOff,
    /// A finished streaming request missed its TTFT (`ttft`) and/or TPOT SLO.
    SloViolation {
        ttft: bool,
        tpot: bool,
    },
    /// What the predictor's flow control did with a request that offered to wait,
    /// and how long it waited there.
    Flow {
        outcome: FlowOutcome,
        waited_ms: u64,
    },
    /// What the outbox counted since the last tick.
    Outbox(Counts),
    /// A coalesced predict call went out carrying `requests` requests, on the predict
    /// stream (`stream`) or as an HTTP call.
    CoalescedCall {
        requests: usize,
        stream: bool,
    },
    /// The predict stream opened (the predictor answered its headers) or closed.
    PredictStream {
        open: bool,
    },
}

/// The `:status` of the answer to one of the filter's own calls (`None`: no answer).
pub fn callout_status(host: &dyn Host) -> Option<u16> {
    host.header(Map::CalloutHeaders, ":status").and_then(|s| s.parse::<u16>().ok())
}

/// What an answer of the predictor with `status` gives: its body (`body_size` bytes) decoded
/// as `T` on a 200, else why the request falls back (a 504 is Envoy's timeout; any other
/// status or none, the predictor unavailable; a 200 that does not decode, a bad answer).
pub fn predictor_answer<T: DeserializeOwned>(
    host: &dyn Host,
    status: Option<u16>,
    body_size: usize,
) -> Result<T, FallbackCause> {
    match status {
        Some(200) => host
            .buffer(Buffer::CalloutBody, body_size)
            .and_then(|body| codec::decode::<T>(Format::MsgPack, &body).ok())
            .ok_or(FallbackCause::BadAnswer),
        Some(504) => Err(FallbackCause::Timeout),
        _ => Err(FallbackCause::Unavailable),
    }
}

/// Makes a clock that may step back (a wall clock set by NTP or an operator) safe for
/// durations: a reading behind the last one continues from the last, so every later
/// reading moves on from there instead of standing still, or running a timer back, until
/// the clock has caught up. The filter's host adapter reads Envoy's monotonic clock and
/// needs none of this; a host with only a wall clock gets it through this.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SteadyClock {
    last: u64,
    offset: u64,
}

impl SteadyClock {
    pub const fn new() -> Self {
        SteadyClock { last: 0, offset: 0 }
    }

    /// The steady reading for the host clock's `raw` one.
    pub fn read(&mut self, raw: u64) -> u64 {
        let now = raw.saturating_add(self.offset);
        if now < self.last {
            self.offset = self.offset.saturating_add(self.last - now);
            return self.last;
        }
        self.last = now;
        now
    }
}

/// The host calls the filter makes.
pub trait Host {
    /// Monotonic time in nanoseconds from an arbitrary origin (the filter measures
    /// durations and sets deadlines with it, nothing else).
    fn now_ns(&self) -> u64;

    fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// A header value; `None` when absent or the map is gone.
    fn header(&self, map: Map, name: &str) -> Option<String>;

    /// The whole map in one call (empty when it is gone): cheaper than two reads of it.
    fn headers(&self, map: Map) -> HeaderMap;

    /// Sets (replacing) a header.
    fn set_header(&mut self, map: Map, name: &str, value: &str) -> Result<(), HostError>;

    /// Removes a header; absent is fine.
    fn remove_header(&mut self, map: Map, name: &str) -> Result<(), HostError>;

    /// Up to `size` bytes of a body from its start; `None` when there is none.
    fn buffer(&self, buffer: Buffer, size: usize) -> Option<Vec<u8>>;

    /// The upstream address that served the request (`upstream.address`), once known.
    fn upstream_address(&self) -> Option<String>;

    /// The endpoints the gateway allows this request (`ip:port`), when it restricts them:
    /// the Gateway API Inference Extension's subset hint, which an endpoint picker's data
    /// plane may send. `None`: any endpoint of the pool. The Wasm filter has none.
    fn endpoint_subset(&self) -> Option<Vec<String>> {
        None
    }

    /// Starts a call to an Envoy cluster; returns its token. The answer arrives in the
    /// context's callout callback with that token.
    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, HostError>;

    /// Asks the host to call the VM's root context back soon, outside this callback
    /// (`Vm::on_wake`: the coalesced predict calls go from there, `coalesce`). `Err` when
    /// the host cannot; the caller then does the work itself. Hosts without it (the unit
    /// tests' by default) keep one call per request.
    fn wake(&mut self) -> Result<(), HostError> {
        Err(HostError(HostError::UNIMPLEMENTED))
    }

    /// Opens a gRPC stream to `cluster`'s `service`/`method` with `metadata` as its initial
    /// headers; returns its token. Its headers, messages and close arrive at the root context
    /// (`Vm::on_stream_headers`, `on_stream_message`, `on_stream_closed`). Hosts without
    /// streams (the unit tests' by default) answer `UNIMPLEMENTED`: predict batches then go
    /// as HTTP calls.
    fn open_stream(
        &mut self,
        _cluster: &str,
        _service: &str,
        _method: &str,
        _metadata: &[(&str, &str)],
    ) -> Result<u32, HostError> {
        Err(HostError(HostError::UNIMPLEMENTED))
    }

    /// Sends one message on stream `stream`.
    fn send_stream(&mut self, _stream: u32, _message: &[u8]) -> Result<(), HostError> {
        Err(HostError(HostError::UNIMPLEMENTED))
    }

    /// Resets stream `stream`: none of its callbacks comes after.
    fn cancel_stream(&mut self, _stream: u32) {}

    fn log(&mut self, level: Level, message: &str);

    /// Counts an event in the host's stats.
    fn record(&mut self, event: Event);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_clock_set_back_neither_runs_time_back_nor_stops_it() {
        let mut clock = SteadyClock::default();
        assert_eq!(clock.read(1_000), 1_000);
        assert_eq!(clock.read(1_500), 1_500);
        // Set back an hour: time goes on from where it was, at the clock's pace.
        assert_eq!(clock.read(500), 1_500);
        assert_eq!(clock.read(700), 1_700);
        assert_eq!(clock.read(900), 1_900);
        // Set back again, and forward: forward steps cannot be told from a long wait.
        assert_eq!(clock.read(100), 1_900);
        assert_eq!(clock.read(10_100), 11_900);
        assert_eq!(SteadyClock::default().read(u64::MAX), u64::MAX);
    }
}
