//! The predict stream's lifecycle, per VM: one gRPC stream to the predictor replica in use
//! that carries the coalesced predict batches (`headroom_protocol::stream`, docs/protocol.md).
//!
//! Why a stream: Envoy's HTTP client spends about 100 us of CPU on each call the filter
//! makes, more than Envoy spends proxying a whole request; a message on an open stream is a
//! frame each way (docs/notebook/performance.md, "The predict stream").
//!
//! The stream is opened from the tick, never from a request, and carries batches only once
//! the predictor has answered its headers ([`PredictStream::on_headers`]): a predictor or a
//! cluster that cannot serve it (an older predictor, a cluster without HTTP/2) costs no
//! request anything, and until then, or while it is down, the batches go as HTTP calls.
//! A stream that closed before it carried an answer to a batch (headers alone prove nothing:
//! Envoy replies to a stream it cannot carry with headers and the close together) is retried
//! later and later (1 s doubling to 30 s); one that carried answers and then closed (the
//! predictor restarted) is reopened after 1 s.

use crate::host::{Event, Host, HostError, Level};

/// How soon a stream is reopened after one that worked closed.
pub const REOPEN_MS: u64 = 1_000;
/// The longest wait between attempts while streams never get answered.
pub const MAX_REOPEN_MS: u64 = 30_000;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Closed,
    /// Opened; the predictor has not answered its headers yet.
    Opening {
        token: u32,
        cluster: String,
    },
    Open {
        token: u32,
        cluster: String,
        /// It has carried an answer: it worked, and a close is an outage (the predictor
        /// restarted), not a refusal. Envoy answers a stream it cannot carry with headers and
        /// the close together (gRPC's trailers-only reply), so headers alone do not show
        /// that the stream works.
        answered: bool,
    },
}

/// One VM's predict stream. Each opening and closing (or reset) of it is counted as an
/// [`Event::PredictStream`] here, where the state changes.
#[derive(Debug)]
pub struct PredictStream {
    state: State,
    /// When the next attempt to open may go (ms, host clock).
    retry_at_ms: u64,
    /// The wait after the next failed attempt.
    backoff_ms: u64,
}

impl Default for PredictStream {
    fn default() -> Self {
        PredictStream { state: State::Closed, retry_at_ms: 0, backoff_ms: REOPEN_MS }
    }
}

impl PredictStream {
    /// On the tick: opens a stream to `cluster` when none is open or opening and the
    /// backoff has passed; a stream to another cluster (the replica failed over) is reset
    /// first, and its token returned: a call out on it will not be answered. `metadata` goes
    /// as the stream's initial headers (the token).
    pub fn maintain(&mut self, host: &mut dyn Host, cluster: &str, metadata: &[(&str, &str)]) -> Option<u32> {
        let mut reset = None;
        if let State::Opening { cluster: c, .. } | State::Open { cluster: c, .. } = &self.state {
            if c == cluster {
                return None;
            }
            // To the new replica at once: no wait, the old one's failure is not the new one's.
            reset = self.cancel(host);
        }
        let now = host.now_ms();
        if now < self.retry_at_ms {
            return reset;
        }
        use headroom_protocol::stream::{METHOD, SERVICE};
        match host.open_stream(cluster, SERVICE, METHOD, metadata) {
            Ok(token) => self.state = State::Opening { token, cluster: cluster.to_string() },
            Err(HostError(HostError::UNIMPLEMENTED)) => self.retry_at_ms = u64::MAX,
            Err(e) => {
                host.log(Level::Warn, &format!("headroom: cannot open the predict stream to {cluster}: {e:?}"));
                self.backed_off(now);
            }
        }
        reset
    }

    /// The predictor answered stream `token`'s headers: batches may go on it.
    pub fn on_headers(&mut self, host: &mut dyn Host, token: u32) {
        if let State::Opening { token: t, cluster } = &self.state {
            if *t == token {
                host.log(Level::Info, &format!("headroom: predict stream to {cluster} open"));
                host.record(Event::PredictStream { open: true });
                self.state = State::Open { token, cluster: cluster.clone(), answered: false };
            }
        }
    }

    /// The open stream carried an answer: it works (the backoff starts over).
    pub fn on_answer(&mut self) {
        if let State::Open { answered, .. } = &mut self.state {
            *answered = true;
            self.backoff_ms = REOPEN_MS;
        }
    }

    /// Stream `token` closed with gRPC `status`. `true` when it was this VM's stream; batches
    /// go as HTTP calls until the next one opens: after 1 s if it had carried an answer,
    /// else after the backoff.
    pub fn on_closed(&mut self, host: &mut dyn Host, token: u32, status: u32) -> bool {
        let now = host.now_ms();
        let (State::Opening { token: t, cluster } | State::Open { token: t, cluster, .. }) = &self.state else {
            return false;
        };
        if *t != token {
            return false;
        }
        if matches!(self.state, State::Open { answered: true, .. }) {
            host.log(Level::Warn, &format!("headroom: predict stream to {cluster} closed (grpc-status {status})"));
            self.retry_at_ms = now.saturating_add(REOPEN_MS);
        } else {
            host.log(
                Level::Warn,
                &format!(
                    "headroom: predict stream to {cluster} refused (grpc-status {status}; the cluster must speak \
                     HTTP/2 to predictor-svc); HTTP calls meanwhile, next try in {} ms",
                    self.backoff_ms
                ),
            );
            self.backed_off(now);
        }
        host.record(Event::PredictStream { open: false });
        self.state = State::Closed;
        true
    }

    /// Resets the stream (its answer is overdue, the replica failed over, streams were
    /// switched off): no callback of it comes after, so a late answer cannot be taken for
    /// the next batch's. Returns the token of the stream reset, if there was one.
    pub fn reset(&mut self, host: &mut dyn Host) -> Option<u32> {
        let token = self.cancel(host)?;
        self.retry_at_ms = host.now_ms().saturating_add(REOPEN_MS);
        Some(token)
    }

    /// Cancels the stream, if one is opening or open, and returns its token.
    fn cancel(&mut self, host: &mut dyn Host) -> Option<u32> {
        let (State::Opening { token, .. } | State::Open { token, .. }) = self.state else { return None };
        host.cancel_stream(token);
        host.record(Event::PredictStream { open: false });
        self.state = State::Closed;
        Some(token)
    }

    /// The open stream batches go on, with the cluster it reaches.
    pub fn open(&self) -> Option<(u32, &str)> {
        match &self.state {
            State::Open { token, cluster, .. } => Some((*token, cluster)),
            _ => None,
        }
    }

    /// The stream `token` is this VM's and open.
    pub fn is_open(&self, token: u32) -> bool {
        self.open().is_some_and(|(t, _)| t == token)
    }

    fn backed_off(&mut self, now: u64) {
        self.retry_at_ms = now.saturating_add(self.backoff_ms);
        self.backoff_ms = (self.backoff_ms * 2).min(MAX_REOPEN_MS);
    }
}
