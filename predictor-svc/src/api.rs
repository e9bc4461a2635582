//! The HTTP API: thin handlers that decode, call the domain, encode.
//!
//! Bodies are MessagePack or JSON by `content-type`; answers follow `accept`,
//! else the request's format. Every error is JSON `{"error": {"message", "field"}}`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use headroom_protocol::{
    codec, limits, paths, BatchAck, DispatchBatch, EndpointPrediction, ErrorBody, Format, Invalid, PredictRequest,
    PredictResponse, ReportBatch,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::model::features;
use crate::pool::Applied;
use crate::state::AppState;

pub fn router(state: Arc<AppState>) -> Router {
    // Guarded: what teaches the model, reveals traffic or hands out models (`crate::auth`).
    let guarded = Router::new()
        .route(paths::PREDICT, post(predict))
        .route(paths::DISPATCH, post(dispatch))
        .route(paths::REPORT, post(report))
        .route("/v1/observations", get(observations))
        .route("/v1/models/{file}", get(model_file))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::auth::require_token));
    let routes = Router::new()
        .merge(guarded)
        .route("/v1/pools", get(pools))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state.clone());
    guard(routes, state)
}

/// What every route gets: the body limit, and the last resort against a bug: a panic
/// in a handler is a `500` and a count in `headroom_handler_panics`, never a dropped
/// connection (which the filter would take for a transient failure and retry).
pub fn guard(routes: Router, state: Arc<AppState>) -> Router {
    let on_panic = move |_: Box<dyn std::any::Any + Send>| -> Response {
        state.metrics.panicked();
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, body: ErrorBody::message("internal error") }
            .into_response()
    };
    routes
        .layer(axum::extract::DefaultBodyLimit::max(limits::MAX_BODY_BYTES))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(on_panic))
}

/// An API error: status plus the JSON body naming the field at fault.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    fn field(status: StatusCode, field: &str, message: impl Into<String>) -> Self {
        ApiError { status, body: ErrorBody::field(field, message) }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.body).unwrap_or_default();
        (self.status, [(header::CONTENT_TYPE, codec::JSON)], body).into_response()
    }
}

fn decode_body<T: DeserializeOwned>(headers: &HeaderMap, body: &Bytes) -> Result<(T, Format), ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let format = Format::from_content_type(content_type).ok_or_else(|| {
        ApiError::field(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content-type",
            format!("must be {} or {}, got {content_type:?}", codec::MSGPACK, codec::JSON),
        )
    })?;
    let value = codec::decode(format, body)
        .map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, e.field.as_deref().unwrap_or("body"), e.message))?;
    Ok((value, format))
}

fn reply<T: Serialize>(headers: &HeaderMap, request_format: Format, value: &T) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let format = Format::from_accept(accept, request_format);
    match codec::encode(format, value) {
        Ok(bytes) => ([(header::CONTENT_TYPE, format.content_type())], bytes).into_response(),
        Err(e) => ApiError::field(StatusCode::INTERNAL_SERVER_ERROR, "response", e.message).into_response(),
    }
}

/// A body out of the contract's bounds (`headroom_protocol::limits`): `400` naming the field.
fn invalid(state: &AppState, route: &str, e: Invalid) -> ApiError {
    state.metrics.invalid(route);
    ApiError::field(StatusCode::BAD_REQUEST, &e.field, e.message)
}

fn unknown_pool(pool: &str) -> ApiError {
    ApiError::field(StatusCode::NOT_FOUND, "pool", format!("no pool named {pool:?}"))
}

async fn predict(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let started = Instant::now();
    let (req, format): (PredictRequest, Format) = decode_body(&headers, &body)?;
    req.check().map_err(|e| invalid(&state, paths::PREDICT, e))?;
    let now = Instant::now();
    let stale_ms = state.config.stale_after_ms;
    let (addresses, states) = state
        .pools
        .with(&req.pool, |pool| {
            let addresses: Vec<String> = pool.endpoints.iter().map(|e| e.address.clone()).collect();
            (addresses, pool.states_for(&req.request, now))
        })
        .ok_or_else(|| unknown_pool(&req.pool))?;
    // Endpoints without fresh engine metrics get no prediction: say nothing rather than guess.
    let fresh: Vec<usize> =
        (0..states.len()).filter(|&i| states[i].metrics_age_ms.is_some_and(|age| age <= stale_ms)).collect();
    let rows: Vec<features::Row> = fresh.iter().map(|&i| features::row(&req.request, &states[i])).collect();
    let (predicted, model_version) = state.models.predict(&rows);
    let mut endpoints: Vec<EndpointPrediction> = addresses
        .into_iter()
        .zip(states)
        .map(|(address, s)| EndpointPrediction { address, ttft_ms: None, tpot_ms: None, state: s })
        .collect();
    // A model or prior answer out of range says "unknown", never a number the filter cannot use.
    for (&i, (ttft, tpot)) in fresh.iter().zip(predicted) {
        endpoints[i].ttft_ms = limits::ms_or_none(Some(ttft));
        endpoints[i].tpot_ms = limits::ms_or_none(Some(tpot));
    }
    let answer = PredictResponse { pool: req.pool, model_version, endpoints };
    state.metrics.predicted(started.elapsed().as_secs_f64());
    Ok(reply(&headers, format, &answer))
}

async fn dispatch(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let (batch, format): (DispatchBatch, Format) = decode_body(&headers, &body)?;
    let now = Instant::now();
    // Validate the whole batch before applying any of it: a 400 leaves no half-applied batch.
    batch.check().map_err(|e| invalid(&state, paths::DISPATCH, e))?;
    let mut ack = BatchAck::default();
    for d in &batch.dispatches {
        let applied = state.pools.with(&d.pool, |p| p.dispatch(d, now));
        let result = match applied {
            Some(Applied::Accepted) => "accepted",
            Some(Applied::AlreadyFinished) => "already_finished",
            Some(Applied::UnknownEndpoint) => "unknown_endpoint",
            Some(Applied::PoolFull) => "pool_full",
            None => "unknown_pool",
        };
        if applied == Some(Applied::Accepted) {
            ack.accepted += 1;
        } else {
            ack.rejected += 1;
            tracing::debug!(request_id = %d.request_id, pool = %d.pool, endpoint = %d.endpoint, result, "dispatch not tracked");
        }
        state.metrics.dispatch(result, 1);
    }
    Ok(reply(&headers, format, &ack))
}

async fn report(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let (batch, format): (ReportBatch, Format) = decode_body(&headers, &body)?;
    batch.check().map_err(|e| invalid(&state, paths::REPORT, e))?;
    let now = Instant::now();
    let mut ack = BatchAck::default();
    for mut o in batch.observations {
        // Prefix hashes serve placement only; dropping them keeps the log small.
        o.request.prefix_hashes = Vec::new();
        let Some(tracked) = state.pools.with(&o.pool, |p| p.finish(&o.request_id, now)) else {
            ack.rejected += 1;
            state.metrics.report("unknown_pool", 1);
            continue;
        };
        ack.accepted += 1;
        state.metrics.report("accepted", 1);
        // Learn only from requests this predictor saw dispatched, to the endpoint that served
        // them: a report for a request never made teaches nothing.
        if tracked.as_deref() == Some(o.endpoint.as_str()) {
            state.metrics.observed(&o);
            if state.models.observe(&o) {
                state.metrics.report("sampled", 1);
            }
        } else {
            state.metrics.report("not_dispatched", 1);
        }
        state.observations.lock().unwrap_or_else(|p| p.into_inner()).push(o);
    }
    Ok(reply(&headers, format, &ack))
}

#[derive(Serialize)]
struct EndpointView {
    address: String,
    in_flight: usize,
    running: Option<u32>,
    waiting: Option<u32>,
    kv_usage: Option<f64>,
    metrics_age_ms: Option<u64>,
    scrape_errors: u64,
}

#[derive(Serialize)]
struct PoolView {
    name: String,
    endpoints: Vec<EndpointView>,
}

/// `GET /v1/pools`: every pool's endpoints with scraped metrics and in-flight counts (JSON).
async fn pools(State(state): State<Arc<AppState>>) -> Response {
    let now = Instant::now();
    let views: Vec<PoolView> = state
        .pools
        .names()
        .into_iter()
        .filter_map(|name| {
            state.pools.with(&name, |p| PoolView {
                name: p.name.clone(),
                endpoints: p
                    .endpoints
                    .iter()
                    .map(|e| EndpointView {
                        address: e.address.clone(),
                        in_flight: p.in_flight_on(&e.address),
                        running: e.metrics.map(|m| m.running),
                        waiting: e.metrics.map(|m| m.waiting),
                        kv_usage: e.metrics.map(|m| m.kv_usage),
                        metrics_age_ms: e.scraped_at.map(|t| now.duration_since(t).as_millis() as u64),
                        scrape_errors: e.scrape_errors,
                    })
                    .collect(),
            })
        })
        .collect();
    axum::Json(serde_json::json!({ "pools": views })).into_response()
}

#[derive(Deserialize)]
struct ObservationQuery {
    limit: Option<usize>,
}

/// `GET /v1/observations?limit=N`: the newest observations (JSON).
async fn observations(
    State(state): State<Arc<AppState>>,
    query: Result<Query<ObservationQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "limit", e.body_text()))?;
    let log = state.observations.lock().unwrap_or_else(|p| p.into_inner());
    let body = serde_json::json!({ "total": log.total, "observations": log.newest(q.limit.unwrap_or(100)) });
    Ok(axum::Json(body).into_response())
}

/// `GET /v1/models`: the active model and every kept version with its held-out error (JSON).
async fn models(State(state): State<Arc<AppState>>) -> Response {
    let (versions, active) = state.models.versions();
    let (train, holdout) = state.models.sample_counts();
    let body = serde_json::json!({
        "active": active,
        "training": state.models.trains(),
        "samples": {"train": train, "holdout": holdout, "since_training": state.models.samples_since_training()},
        "versions": versions,
    });
    axum::Json(body).into_response()
}

/// `GET /v1/models/v<N>.onnx`: a kept model as a standard ONNX file.
async fn model_file(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(file): axum::extract::Path<String>,
) -> Response {
    let Some(name) = file.strip_suffix(".onnx") else {
        return ApiError::field(StatusCode::NOT_FOUND, "file", "models download as v<N>.onnx").into_response();
    };
    match state.models.onnx_bytes(name) {
        Some(bytes) => ([(header::CONTENT_TYPE, "application/onnx")], bytes.to_vec()).into_response(),
        None => ApiError::field(StatusCode::NOT_FOUND, "file", format!("no kept model {name:?}")).into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    // Series of endpoints that left the pool go with them: per-endpoint series stay bounded.
    state.metrics.in_flight.clear();
    for name in state.pools.names() {
        state.pools.with(&name, |p| {
            for e in &p.endpoints {
                let label = crate::metrics::EndpointLabel { pool: name.clone(), endpoint: e.address.clone() };
                state.metrics.in_flight.get_or_create(&label).set(p.in_flight_on(&e.address) as i64);
            }
        });
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if state.scraped_once.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the first scrape").into_response()
    }
}
