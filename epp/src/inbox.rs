//! What reaches a worker (Envoy's messages, the predictor's answers, wake-ups) and what a
//! worker sends back on a stream.

use tokio::sync::mpsc::UnboundedSender;

use crate::proto::{ProcessingRequest, ProcessingResponse};

/// A predictor call's answer, as the callback that takes it sees it.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// `None`: no answer (the predictor unreachable).
    pub status: Option<u16>,
    pub body: Vec<u8>,
}

/// One thing for a worker to handle, in arrival order.
#[derive(Debug)]
pub enum Input {
    /// Envoy opened an ext_proc stream (one per HTTP request); answers go to `out`.
    Open { stream: u32, out: UnboundedSender<ProcessingResponse> },
    /// A message on it.
    Message { stream: u32, message: Box<ProcessingRequest> },
    /// It ended (Envoy closed it, or reset it: the request is over either way).
    Closed { stream: u32 },
    /// The answer to predictor call `token`.
    Answer { token: u32, answer: Answer },
    /// The VM asked to be called back (`Host::wake`).
    Wake,
}
