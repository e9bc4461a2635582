//! The contract between the headroom filter and predictor-svc.
//!
//! Every message both sides exchange is defined here, once. Bodies travel as
//! MessagePack (named fields, so fields can be added without breaking older
//! peers) or as JSON when a person asks for it with `content-type` / `accept`.
//! `docs/protocol.md` shows one example of each message. Also here, because every
//! component must agree on them: the header names (`headers`), the bounds of every
//! value (`limits`), what "headroom" is (`headroom`), when an endpoint is ejected for failing (`health`), the token approximation (`tokens`), OpenAI body parsing
//! (`openai`) and the response meter that reads TTFT/TPOT off a stream (`meter`), and the seeded
//! random generator every component draws from (`rng`), and what a binary says of its build (`build`).

pub mod build;
pub mod codec;
pub mod headers;
pub mod headroom;
pub mod health;
pub mod limits;
pub mod messages;
pub mod meter;
pub mod openai;
pub mod prefix;
pub mod rng;
pub mod stats;
pub mod stream;
pub mod tokens;

pub use codec::{decode, encode, CodecError, Format};
pub use limits::Invalid;
pub use messages::*;

/// Versioned HTTP paths served by predictor-svc (and the predict stream's, [`stream::PATH`]).
pub mod paths {
    /// `POST`: [`crate::PredictRequest`] -> [`crate::PredictResponse`].
    pub const PREDICT: &str = "/v1/predict";
    /// `POST`: [`crate::PredictBatch`] -> [`crate::PredictBatchResponse`], answered at once.
    pub const PREDICT_BATCH: &str = "/v1/predict/batch";
    /// `POST`: [`crate::DispatchBatch`] -> [`crate::BatchAck`]. Starts in-flight tracking.
    pub const DISPATCH: &str = "/v1/dispatch";
    /// `POST`: [`crate::ReportBatch`] -> [`crate::BatchAck`]. Ends in-flight tracking.
    pub const REPORT: &str = "/v1/report";
}
