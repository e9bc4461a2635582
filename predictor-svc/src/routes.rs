//! The predictor's routes: which handler answers which path, behind which guard. Kept
//! apart from the handlers (`api`, `stream`) so that the streamed predict, which answers
//! with the batch handler's logic, and the router that lists it do not import each other.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use headroom_protocol::{limits, paths, ErrorBody};

use crate::api::{self, ApiError};
use crate::state::AppState;
use crate::stream;

/// Every route of the predictor on `state`, guarded.
pub fn router(state: Arc<AppState>) -> Router {
    // Guarded: what teaches the model, reveals traffic or hands out models (`crate::auth`).
    let guarded = Router::new()
        .route(paths::PREDICT, post(api::predict))
        .route(paths::PREDICT_BATCH, post(api::predict_batch))
        .route(headroom_protocol::stream::PATH, post(stream::predict_stream))
        .route(paths::DISPATCH, post(api::dispatch))
        .route(paths::REPORT, post(api::report))
        .route("/v1/observations", get(api::observations))
        .route("/v1/models/{file}", get(api::model_file))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::auth::require_token));
    let routes = Router::new()
        .merge(guarded)
        .route("/v1/pools", get(api::pools))
        .route("/v1/models", get(api::models))
        .route("/metrics", get(api::metrics))
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .with_state(state.clone());
    guard(routes, state)
}

/// What every route gets: the body limit, and the last resort against a bug: a panic
/// in a handler is a `500` and a count in `headroom_handler_panics`, never a dropped
/// connection (which the filter would take for a transient failure and retry).
pub fn guard(routes: Router, state: Arc<AppState>) -> Router {
    let on_panic = move |_: Box<dyn std::any::Any + Send>| -> Response {
        state.core.metrics.panicked();
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, body: ErrorBody::message("internal error") }
            .into_response()
    };
    routes
        .layer(axum::extract::DefaultBodyLimit::max(limits::MAX_BODY_BYTES))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(on_panic))
}
