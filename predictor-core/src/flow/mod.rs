//! Flow control: a request no endpoint has headroom for waits here instead of
//! joining a model server's FIFO queue (docs/flow-control.md).
//!
//! The filter offers to wait ([`FlowTerms`] in its predict call); `/v1/predict` then
//! answers when an endpoint has headroom for what is left of the request's TTFT SLO,
//! when its deadline passes, or at once with the reason it could not wait. The queue
//! lives here, not in the gateway, because this is the one place that sees every
//! gateway, every worker and every capacity signal (reports, first tokens, scrapes).
//!
//! A request goes when an endpoint has headroom for what is left of its SLOs and the
//! wait ahead of it there (its predicted TTFT less its own TTFT on that endpoint idle) is
//! within its `dispatch_horizon_ms` (its server's queue is short), or earlier than the
//! horizon allows when its own SLO is about to run out. One with room for its own SLOs
//! only where its decode would slow running requests past their tighter TPOT SLO waits
//! for them, and when its own SLO presses goes where it slows the fewest of them (the
//! busiest such endpoint among equals).
//! It expires at its deadline (arrival + TTFT SLO - its service time on an idle
//! endpoint): a sheddable request is then shed, any other placed as best it can be.
//!
//! Order: priority band (higher first; a band waiting blocks the bands below it, and a
//! new request never passes waiting ones of its band or above), then, within a band,
//! tenants take turns (fair queuing by releases) and each tenant's requests go by
//! deadline.
//!
//! Two rooms, neither reaching the predictor's state:
//! - [`queue`]: the plain data structure (one [`queue::Queue`] per pool, order, bounds,
//!   drain rate) and [`queue::Flows`], which holds them with the wake-up signal;
//! - [`decide`]: whether a waiting request goes now and where, from its predictions
//!   alone (no state, no clock: the times come in as numbers).
//!
//! What `/v1/predict` and the background task do with both, predicting through the
//! service's state, is `crate::admission`, a floor above the predictor that holds the queue.

pub mod decide;
pub mod queue;
