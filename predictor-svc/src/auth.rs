//! Who may call what: the shared token that guards the routes which teach the
//! model, reveal traffic, or hand out models.
//!
//! Without it, anyone who reaches the predictor can post reports for requests
//! never made and train the model on them. The gateway's filter sends
//! `authorization: Bearer <token>` on every call (`predictor_token` in its
//! configuration); the predictor compares in constant time. Health, readiness,
//! `/metrics` and the read-only pool and model listings stay open for probes and
//! dashboards. `docs/reliability.md` states the trust model.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use headroom_protocol::{codec, ErrorBody};

use crate::state::AppState;

/// True when `presented` (an `authorization` header value) carries `token`.
pub fn permits(token: &str, presented: Option<&str>) -> bool {
    let Some(given) = presented.and_then(|v| v.strip_prefix("Bearer ")) else { return false };
    constant_time_eq(token.as_bytes(), given.trim().as_bytes())
}

/// Compares without an early exit, so the time taken says nothing of where a guess went wrong.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Middleware for the guarded routes: `401` with a JSON error unless the token matches
/// (or none is configured).
pub async fn require_token(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let Some(token) = state.token.as_deref() else { return next.run(request).await };
    let presented = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if permits(token, presented) {
        return next.run(request).await;
    }
    state.core.metrics.unauthorized();
    let body = serde_json::to_vec(&ErrorBody::field("authorization", "a valid `Bearer` token is required"))
        .unwrap_or_default();
    (StatusCode::UNAUTHORIZED, [(header::CONTENT_TYPE, codec::JSON), (header::WWW_AUTHENTICATE, "Bearer")], body)
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_permits() {
        let token = "0123456789abcdef";
        assert!(permits(token, Some("Bearer 0123456789abcdef")));
        for wrong in [
            None,
            Some(""),
            Some("0123456789abcdef"),
            Some("Bearer 0123456789abcdeF"),
            Some("Bearer 0123456789abcde"),
            Some("Bearer 0123456789abcdef0"),
            Some("Basic 0123456789abcdef"),
        ] {
            assert!(!permits(token, wrong), "{wrong:?}");
        }
    }
}
