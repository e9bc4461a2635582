//! Who may call what: the tokens that guard the routes which teach the model, reveal
//! traffic, or hand out models, and which caller each names.
//!
//! Without them, anyone who reaches the predictor can post reports for requests never
//! made and train the model on them. The gateway's filter sends `authorization: Bearer
//! <token>` on every call; the predictor compares in constant time against every caller's
//! tokens (`predictor-config`'s `callers.rs`: a single shared token, and a file of named
//! ones, read again when it changes). The caller a token names rides on the request
//! ([`Caller`]) to the dispatch quotas (`predictor-core`'s `callers`). Health, readiness,
//! `/metrics` and the read-only pool and model listings stay open for probes and
//! dashboards. `docs/reliability.md` states the trust model.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use headroom_predictor_core::callers::Caller;
use headroom_protocol::{codec, ErrorBody};

use crate::heartbeat::Task;
use crate::state::AppState;
use crate::tokens::RELOAD_INTERVAL;

/// Middleware for the guarded routes: `401` with a JSON error unless a token matches (or
/// none is configured); the caller it names goes on with the request.
pub async fn require_token(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    if !state.tokens.guarded() {
        request.extensions_mut().insert(Caller::anonymous());
        return next.run(request).await;
    }
    let presented = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if let Some(caller) = state.tokens.caller(presented) {
        request.extensions_mut().insert(caller);
        return next.run(request).await;
    }
    state.core.metrics.unauthorized();
    let body = serde_json::to_vec(&ErrorBody::field("authorization", "a valid `Bearer` token is required"))
        .unwrap_or_default();
    (StatusCode::UNAUTHORIZED, [(header::CONTENT_TYPE, codec::JSON), (header::WWW_AUTHENTICATE, "Bearer")], body)
        .into_response()
}

/// Reads the callers file again whenever it changes, every [`RELOAD_INTERVAL`]: a file that
/// no longer reads or parses keeps the tokens in force and says why in the log. Retired
/// when no callers file is configured.
pub async fn reload(state: Arc<AppState>) {
    let Some(path) = state.core.config.callers_file.clone() else {
        state.heartbeats.retire(Task::Tokens);
        return;
    };
    let modified = |path: &std::path::Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let mut seen: Option<SystemTime> = modified(&path);
    let mut ticker = tokio::time::interval(RELOAD_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        state.heartbeats.beat(Task::Tokens);
        let now = modified(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match state.core.config.caller_tokens() {
            Ok(tokens) => {
                tracing::info!(path = %path.display(), tokens = tokens.len(), "callers file read again");
                state.tokens.replace(tokens);
            }
            Err(e) => tracing::error!(error = %e, "callers file not read again; its previous tokens stay"),
        }
    }
}
