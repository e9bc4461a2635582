//! The HTTP API: thin handlers that decode, call the domain, encode.
//!
//! Bodies are MessagePack or JSON by `content-type`; answers follow `accept`,
//! else the request's format. Every error is JSON `{"error": {"message", "field"}}`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Extension, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use headroom_protocol::{
    codec, limits, paths, CodecError, DispatchBatch, ErrorBody, Format, Invalid, PredictBatch, PredictBatchResponse,
    PredictRequest, ReportBatch,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use headroom_predictor_core::admission::{self, Admission};
use headroom_predictor_core::callers::Caller;

use crate::flow::Answer;
use crate::heartbeat::LIVENESS_FACTOR;
use crate::state::AppState;
use headroom_predictor_core::service;

/// An API error: status plus the JSON body naming the field at fault.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn field(status: StatusCode, field: &str, message: impl Into<String>) -> Self {
        ApiError { status, body: ErrorBody::field(field, message) }
    }
}

/// A body that does not decode: `400` naming the field at fault (the body, when none is known).
impl From<CodecError> for ApiError {
    fn from(e: CodecError) -> Self {
        ApiError::field(StatusCode::BAD_REQUEST, e.field.as_deref().unwrap_or("body"), e.message)
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
    let value = codec::decode(format, body)?;
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
    state.core.metrics.invalid(route);
    ApiError::field(StatusCode::BAD_REQUEST, &e.field, e.message)
}

fn unknown_pool(pool: &str) -> ApiError {
    ApiError::field(StatusCode::NOT_FOUND, "pool", format!("no pool named {pool:?}"))
}

pub(crate) async fn predict(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let now = state.core.clock.now();
    let (req, format): (PredictRequest, Format) = decode_body(&headers, &body)?;
    req.check().map_err(|e| invalid(&state, paths::PREDICT, e))?;
    let pool = req.pool.clone();
    let answer = service::predict(&state.core, req.clone(), now).ok_or_else(|| unknown_pool(&pool))?;
    state.core.metrics.predicted(started.elapsed().as_secs_f64());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let answer = match admission::admit(&state.core, req.clone(), answer, now, Box::new(Answer(tx))) {
        Admission::Now(answer) => answer,
        // Held until released or expired (`crate::flow::run`); if the caller leaves, the
        // ticket drops with this future and takes the request out of the queue.
        Admission::Wait(ticket) => {
            let longest = Duration::from_millis(state.core.config.flow.max_wait_ms) + FLOW_ANSWER_GRACE;
            match tokio::time::timeout(longest, rx).await {
                Ok(Ok(answer)) => answer,
                _ => ticket.expired(req, now, state.core.clock.now()).ok_or_else(|| unknown_pool(&pool))?,
            }
        }
    };
    Ok(reply(&headers, format, &answer))
}

/// Several requests' predictions in one call, answered at once (a gateway worker's
/// requests that arrived while its previous call was out; none may wait in the flow queue).
pub(crate) async fn predict_batch(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let (batch, format): (PredictBatch, Format) = decode_body(&headers, &body)?;
    let answer = answer_batch(&state, &caller, batch, paths::PREDICT_BATCH, started)?;
    Ok(reply(&headers, format, &answer))
}

/// What `/v1/predict/batch` and each message of the predict stream (`crate::stream`) answer.
/// The dispatches and reports riding along are applied first, as `/v1/dispatch` and
/// `/v1/report` would, so the predictions see them. `route` labels a refused batch's count.
pub fn answer_batch(
    state: &AppState,
    caller: &Caller,
    mut batch: PredictBatch,
    route: &str,
    started: Instant,
) -> Result<PredictBatchResponse, ApiError> {
    batch.check().map_err(|e| invalid(state, route, e))?;
    let now = state.core.clock.now();
    if !batch.dispatches.is_empty() {
        let dispatches = DispatchBatch { dispatches: std::mem::take(&mut batch.dispatches) };
        service::dispatch(&state.core, &dispatches, caller, now);
    }
    if let Some(reports) = batch.reports.take() {
        service::report(&state.core, reports, caller, now);
    }
    let answers = service::predict_batch(&state.core, batch.requests, now).map_err(|(i, pool)| {
        ApiError::field(StatusCode::NOT_FOUND, &format!("requests[{i}].pool"), format!("no pool named {pool:?}"))
    })?;
    state.core.metrics.predicted(started.elapsed().as_secs_f64());
    Ok(PredictBatchResponse { answers })
}

/// How long past the longest wait a queued call waits for the flow task (`crate::flow::run`) before answering
/// "expired" itself: the background task normally answers at the deadline.
const FLOW_ANSWER_GRACE: Duration = Duration::from_secs(1);

pub(crate) async fn dispatch(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (batch, format): (DispatchBatch, Format) = decode_body(&headers, &body)?;
    // Validate the whole batch before applying any of it: a 400 leaves no half-applied batch.
    batch.check().map_err(|e| invalid(&state, paths::DISPATCH, e))?;
    Ok(reply(&headers, format, &service::dispatch(&state.core, &batch, &caller, state.core.clock.now())))
}

pub(crate) async fn report(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (batch, format): (ReportBatch, Format) = decode_body(&headers, &body)?;
    batch.check().map_err(|e| invalid(&state, paths::REPORT, e))?;
    Ok(reply(&headers, format, &service::report(&state.core, batch, &caller, state.core.clock.now())))
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
pub(crate) async fn pools(State(state): State<Arc<AppState>>) -> Response {
    let now = state.core.clock.now();
    let views: Vec<PoolView> = state
        .core
        .pools
        .names()
        .into_iter()
        .filter_map(|name| {
            state.core.pools.with(&name, |p| PoolView {
                name: p.name.clone(),
                endpoints: p
                    .endpoints
                    .iter()
                    .zip(p.in_flight_by_endpoint())
                    .map(|(e, in_flight)| EndpointView {
                        address: e.address.clone(),
                        in_flight,
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
pub(crate) struct ObservationQuery {
    limit: Option<usize>,
    after: Option<u64>,
}

/// `GET /v1/observations?limit=N[&after=S]`: the newest `limit` observations, or with `after`
/// the first `limit` after the `S`-th (observations are numbered from 1 as they arrive; the
/// answer's `first` is its first one's number), oldest first (JSON).
pub(crate) async fn observations(
    State(state): State<Arc<AppState>>,
    query: Result<Query<ObservationQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "limit", e.body_text()))?;
    let limit = q.limit.unwrap_or(100);
    let max = limits::MAX_OBSERVATIONS_PAGE;
    if limit > max {
        let message = format!("must be at most {max} (page with `after`), got {limit}");
        return Err(ApiError::field(StatusCode::BAD_REQUEST, "limit", message));
    }
    // Copied under the lock, serialised after it.
    let (total, first, page) = state.core.observations.lock().unwrap_or_else(|p| p.into_inner()).page(q.after, limit);
    let body = serde_json::json!({ "total": total, "first": first, "observations": page });
    Ok(axum::Json(body).into_response())
}

/// `GET /v1/models`: the active model and every kept version with its held-out error (JSON).
pub(crate) async fn models(State(state): State<Arc<AppState>>) -> Response {
    let (versions, active) = state.core.models.versions();
    let body = serde_json::json!({
        "active": active,
        "objective": state.core.config.model.objective,
        "training": state.core.models.trains(),
        "samples": state.core.models.sample_counts(),
        "versions": versions,
        "calibration": state.core.models.calibration(),
        "prior_calibration": state.core.models.prior_calibration(),
        "serving": state.core.models.duel(),
        "drift": state.core.models.drift(),
    });
    axum::Json(body).into_response()
}

/// `GET /v1/models/v<N>.onnx`: a kept model as a standard ONNX file.
pub(crate) async fn model_file(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(file): axum::extract::Path<String>,
) -> Response {
    let Some(name) = file.strip_suffix(".onnx") else {
        return ApiError::field(StatusCode::NOT_FOUND, "file", "models download as v<N>.onnx").into_response();
    };
    match state.core.models.onnx_bytes(name) {
        Some(bytes) => ([(header::CONTENT_TYPE, "application/onnx")], bytes.to_vec()).into_response(),
        None => ApiError::field(StatusCode::NOT_FOUND, "file", format!("no kept model {name:?}")).into_response(),
    }
}

pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let asked = std::time::Instant::now();
    let page = state.metrics_page.since(asked, {
        let state = state.clone();
        move || render_metrics(&state)
    });
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], page.await.to_string()).into_response()
}

/// The `/metrics` page as of now.
fn render_metrics(state: &AppState) -> String {
    // A snapshot first, each pool's lock held for one pass over its requests; then the
    // gauges are refilled and rendered as one step, so concurrent scrapes never see each
    // other's half-cleared families.
    let names = state.core.pools.names();
    let in_flight: Vec<(String, Vec<(String, usize)>)> = names
        .iter()
        .filter_map(|name| {
            state.core.pools.with(name, |p| {
                let counts = p.in_flight_by_endpoint();
                (name.clone(), p.endpoints.iter().map(|e| e.address.clone()).zip(counts).collect())
            })
        })
        .collect();
    let now = state.core.clock.now();
    let stale_after = std::time::Duration::from_millis(state.core.config.stale_after_ms);
    let gauges: Vec<(String, headroom_predictor_core::pool::PoolGauges)> = names
        .iter()
        .filter_map(|name| state.core.pools.with(name, |p| (name.clone(), p.gauges(now, stale_after))))
        .collect();
    let flows = state.core.flows.snapshot(now);
    state.core.metrics.render_refreshed(|m| {
        m.set_pools(&gauges);
        // Series of endpoints that left the pool go with them: per-endpoint series stay bounded.
        m.in_flight.clear();
        for (pool, endpoints) in &in_flight {
            for (endpoint, n) in endpoints {
                let label =
                    headroom_predictor_core::metrics::EndpointLabel { pool: pool.clone(), endpoint: endpoint.clone() };
                m.in_flight.get_or_create(&label).set(*n as i64);
            }
        }
        // Bands that emptied go with the clear; every pool shows a saturation (0: nothing waits).
        m.flow_queued.clear();
        for pool in &names {
            let flow = flows.iter().find(|f| f.pool == *pool);
            for &(band, n) in flow.map_or(&[][..], |f| &f.bands) {
                let label = headroom_predictor_core::metrics::BandLabel { pool: pool.clone(), band: band.to_string() };
                m.flow_queued.get_or_create(&label).set(n as i64);
            }
            let saturation = flow.map_or(0.0, |f| f.saturation);
            m.saturation
                .get_or_create(&headroom_predictor_core::metrics::PoolLabel { pool: pool.clone() })
                .set(saturation);
        }
    })
}

/// Ready once every endpoint was scraped, while every background task goes round.
pub(crate) async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let silent = state.heartbeats.silent(&state.core.config, std::time::Instant::now(), 1);
    if !silent.is_empty() {
        let text = format!("background task(s) silent: {}", silent.join(", "));
        return (StatusCode::SERVICE_UNAVAILABLE, text).into_response();
    }
    if state.scraped_once.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the first scrape").into_response()
    }
}

/// Alive unless a background task has been silent for [`LIVENESS_FACTOR`] times its bound:
/// wedged, it will not come back by itself, and a restart is what mends it.
pub(crate) async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    let silent = state.heartbeats.silent(&state.core.config, std::time::Instant::now(), LIVENESS_FACTOR);
    if silent.is_empty() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("background task(s) wedged: {}", silent.join(", "))).into_response()
    }
}
