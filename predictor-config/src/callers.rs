//! Who may call the predictor's guarded routes, and how much one caller may do.
//!
//! Each gateway (or gateway fleet) gets its own token, named in `callers_file`:
//!
//! ```text
//! # name       token
//! gateway-eu   3f9c…   # 16+ visible ASCII characters, e.g. `openssl rand -hex 32`
//! gateway-us   77a1…
//! gateway-us   c0de…   # a second token of the same caller: both work while it rotates
//! ```
//!
//! Why names: with one shared token a leaked copy is every gateway's, it can only be
//! revoked by rotating all of them at once, and what it does cannot be told from honest
//! traffic. Named, a caller's dispatches are counted and bounded on their own
//! ([`CallerQuotas`]), and its token is removed from the file alone. The predictor reads
//! the file again when it changes (a Kubernetes Secret's mount is updated in place), so a
//! rotation is: add the new token, move the gateway to it, remove the old one.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The manifests' placeholder token starts so; the predictor refuses to start with it.
pub const PLACEHOLDER_TOKEN_PREFIX: &str = "change-me";
/// Shortest token accepted: a guessable token is no protection.
pub const MIN_TOKEN_BYTES: usize = 16;
/// Longest caller name: it labels metrics and logs.
pub const MAX_CALLER_NAME_BYTES: usize = 64;
/// The caller a single token (`HEADROOM_PREDICTOR_TOKEN`, `auth_token_file`) names.
pub const SHARED_CALLER: &str = "gateway";

/// One caller's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerToken {
    pub caller: String,
    pub token: String,
}

/// The `[callers]` section: what one caller may do, whichever token it presents. A token
/// holder could otherwise post invented dispatches as fast as it likes: 100,000 of them in
/// 1.3 s filled the books, so every real dispatch was refused and every endpoint they named
/// looked loaded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CallerQuotas {
    /// Dispatches a caller may post per second, on average; beyond it a dispatch is not
    /// tracked (`headroom_dispatches{result="caller_rate"}`). One gateway replica routes a
    /// few thousand requests a second at most (docs/performance.md); a fleet of model
    /// servers serves far fewer.
    pub dispatches_per_s: f64,
    /// Dispatches a caller may post at once, above its rate (the bucket's depth).
    pub dispatch_burst: f64,
    /// Share of a pool's `max_in_flight` one caller's dispatches may hold; beyond it a
    /// dispatch is not tracked (`result="caller_full"`), so no caller can refuse another's.
    pub in_flight_share: f64,
}

impl Default for CallerQuotas {
    fn default() -> Self {
        CallerQuotas { dispatches_per_s: 5_000.0, dispatch_burst: 5_000.0, in_flight_share: 0.5 }
    }
}

impl CallerQuotas {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.dispatches_per_s.is_finite() && (1.0..=1e7).contains(&self.dispatches_per_s),
            "callers.dispatches_per_s must be within 1..=10000000"
        );
        anyhow::ensure!(
            self.dispatch_burst.is_finite() && (1.0..=1e7).contains(&self.dispatch_burst),
            "callers.dispatch_burst must be within 1..=10000000"
        );
        anyhow::ensure!(
            self.in_flight_share.is_finite() && self.in_flight_share > 0.0 && self.in_flight_share <= 1.0,
            "callers.in_flight_share must be within (0, 1]"
        );
        Ok(())
    }
}

/// `token` trimmed, checked as a token read from `from`.
pub fn checked_token(token: &str, from: &str) -> anyhow::Result<String> {
    let token = token.trim().to_string();
    anyhow::ensure!(
        token.len() >= MIN_TOKEN_BYTES && token.bytes().all(|b| b.is_ascii_graphic()),
        "{from}: the token must be at least {MIN_TOKEN_BYTES} visible ASCII characters"
    );
    anyhow::ensure!(
        !token.starts_with(PLACEHOLDER_TOKEN_PREFIX),
        "{from}: this is the placeholder the manifests ship with; generate a token (`openssl rand -hex 32`)"
    );
    Ok(token)
}

/// The callers of a `callers_file`'s text, read from `from`: one `name token` per line, `#`
/// to the end of a line a comment. A name may have several tokens; a token names one caller.
pub fn parse_callers(text: &str, from: &str) -> anyhow::Result<Vec<CallerToken>> {
    let mut callers: Vec<CallerToken> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("{from} line {}", i + 1);
        let mut words = line.split_whitespace();
        let (Some(caller), Some(token), None) = (words.next(), words.next(), words.next()) else {
            anyhow::bail!("{at}: expected `name token`");
        };
        anyhow::ensure!(
            caller.len() <= MAX_CALLER_NAME_BYTES
                && caller.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
            "{at}: a caller name is at most {MAX_CALLER_NAME_BYTES} of A-Z a-z 0-9 . _ -"
        );
        let token = checked_token(token, &at)?;
        if let Some(other) = callers.iter().find(|c| c.token == token) {
            anyhow::bail!("{at}: this token already names {:?}", other.caller);
        }
        callers.push(CallerToken { caller: caller.to_string(), token });
    }
    anyhow::ensure!(!callers.is_empty(), "{from}: names no caller");
    Ok(callers)
}

/// [`parse_callers`] of the file at `path`.
pub fn read_callers(path: &Path) -> anyhow::Result<Vec<CallerToken>> {
    let from = format!("callers_file {}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{from}: {e}"))?;
    parse_callers(&text, &from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_file_names_each_token_once_and_says_which_line_is_wrong() {
        let text =
            "# gateways\ngw-a 0123456789abcdef0123\n\ngw-b  fedcba9876543210fedc  # eu\ngw-a aaaaaaaaaaaaaaaaaaaa\n";
        let callers = parse_callers(text, "f").unwrap();
        let named: Vec<_> = callers.iter().map(|c| (c.caller.as_str(), c.token.len())).collect();
        assert_eq!(named, vec![("gw-a", 20), ("gw-b", 20), ("gw-a", 20)], "a caller may hold two tokens");
        for (bad, says) in [
            ("gw-a short", "f line 1: the token must be at least 16"),
            ("gw-a", "f line 1: expected `name token`"),
            ("gw-a 0123456789abcdef0123 extra", "f line 1: expected"),
            ("gw/a 0123456789abcdef0123", "f line 1: a caller name"),
            ("gw-a change-me-0123456789abcdef", "f line 1: this is the placeholder"),
            ("gw-a 0123456789abcdef0123\ngw-b 0123456789abcdef0123", "f line 2: this token already names \"gw-a\""),
            ("# nobody\n", "f: names no caller"),
        ] {
            let e = parse_callers(bad, "f").unwrap_err().to_string();
            assert!(e.starts_with(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn quotas_out_of_range_are_refused() {
        assert!(CallerQuotas::default().validate().is_ok());
        for q in [
            CallerQuotas { dispatches_per_s: 0.0, ..Default::default() },
            CallerQuotas { dispatch_burst: f64::NAN, ..Default::default() },
            CallerQuotas { in_flight_share: 0.0, ..Default::default() },
            CallerQuotas { in_flight_share: 1.5, ..Default::default() },
        ] {
            assert!(q.validate().is_err(), "{q:?}");
        }
    }
}
