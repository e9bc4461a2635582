//! The tokens the guarded routes accept, each naming its caller (`predictor-config`'s
//! `callers.rs`), replaced at once when the callers file changes (`crate::auth::reload`).
//! Kept apart from the middleware so that the state that holds them and the middleware
//! that reads the state do not import each other.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use headroom_predictor_core::callers::Caller;
use headroom_predictor_core::config::CallerToken;

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
