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

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use headroom_predictor_core::callers::Caller;
use headroom_predictor_core::config::CallerToken;
use headroom_protocol::{codec, ErrorBody};

use crate::heartbeat::Task;
use crate::state::AppState;

/// How often the callers file is looked at for a change.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// The tokens the guarded routes accept, each with the caller it names; none: the routes
/// are open (a trusted network only).
#[derive(Debug, Default)]
pub struct Tokens {
    callers: RwLock<Arc<Vec<(Caller, String)>>>,
}

impl Tokens {
    pub fn new(tokens: Vec<CallerToken>) -> Tokens {
        let kept = Tokens::default();
        kept.replace(tokens);
        kept
    }

    /// Replaces every token at once: a rotation never sees half a file.
    pub fn replace(&self, tokens: Vec<CallerToken>) {
        let named = tokens.into_iter().map(|t| (Caller::new(&t.caller), t.token)).collect();
        *self.callers.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(named);
    }

    /// Whether any token is configured: without one the guarded routes are open.
    pub fn guarded(&self) -> bool {
        !self.current().is_empty()
    }

    /// The caller `presented` (an `authorization` header value) names, if any.
    pub fn caller(&self, presented: Option<&str>) -> Option<Caller> {
        let given = presented?.strip_prefix("Bearer ")?.trim().as_bytes();
        // Every token compared, the match or not: the time taken says nothing of which
        // caller, or how much of a token, a guess hit.
        let mut found = None;
        for (caller, token) in self.current().iter() {
            if constant_time_eq(token.as_bytes(), given) {
                found = Some(caller.clone());
            }
        }
        found
    }

    fn current(&self) -> Arc<Vec<(Caller, String)>> {
        self.callers.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Compares without an early exit, so the time taken says nothing of where a guess went wrong.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn token(caller: &str, token: &str) -> CallerToken {
        CallerToken { caller: caller.into(), token: token.into() }
    }

    #[test]
    fn only_an_exact_bearer_token_names_its_caller() {
        let tokens = Tokens::new(vec![
            token("gw-a", "0123456789abcdef"),
            token("gw-b", "fedcba9876543210"),
            token("gw-a", "aaaaaaaaaaaaaaaa"),
        ]);
        let name = |presented| tokens.caller(presented).map(|c| c.name().to_string());
        assert_eq!(name(Some("Bearer 0123456789abcdef")).as_deref(), Some("gw-a"));
        assert_eq!(name(Some("Bearer aaaaaaaaaaaaaaaa")).as_deref(), Some("gw-a"), "its second token");
        assert_eq!(name(Some("Bearer fedcba9876543210")).as_deref(), Some("gw-b"));
        for wrong in [
            None,
            Some(""),
            Some("0123456789abcdef"),
            Some("Bearer 0123456789abcdeF"),
            Some("Bearer 0123456789abcde"),
            Some("Bearer 0123456789abcdef0"),
            Some("Basic 0123456789abcdef"),
        ] {
            assert_eq!(name(wrong), None, "{wrong:?}");
        }
        // A rotation replaces every token at once.
        tokens.replace(vec![token("gw-b", "bbbbbbbbbbbbbbbb")]);
        assert_eq!(name(Some("Bearer 0123456789abcdef")), None, "a removed token names nobody");
        assert_eq!(name(Some("Bearer bbbbbbbbbbbbbbbb")).as_deref(), Some("gw-b"));
        assert!(tokens.guarded());
        assert!(!Tokens::default().guarded(), "no token: open");
    }
}
