//! Which contract the predictors of this VM speak (`headroom_protocol::messages`): a
//! predictor that keeps a record of each request it predicts says so in every answer
//! ([`headroom_protocol::CONTRACT`]), and then a dispatch need only name the request and
//! the endpoint, and a report carry only what the gateway measured. One that does not
//! (contract 1) needs the features, predictions and state echoed back, and cannot read a
//! lean message at all. So the lean messages go out only while every predictor heard from
//! keeps records: once one answer of an older predictor arrives (a rollout's overlap, a
//! rollback), the echoes go out again until none has been heard for [`ECHO_MEMORY_MS`].

use headroom_protocol::CONTRACT;

/// How long after the last answer of a contract-1 predictor the echoes keep going out:
/// past a rollout's overlap, calls balanced over its replicas no longer reach the old one.
pub const ECHO_MEMORY_MS: u64 = 60_000;

/// What the predictors' answers said of their contract.
#[derive(Debug, Default, Clone, Copy)]
pub struct Contract {
    /// A predictor that keeps records has answered.
    records: bool,
    /// When a predictor that needs the echoes last answered.
    echoing_at_ms: Option<u64>,
}

impl Contract {
    /// An answer of a predictor speaking `contract` arrived at `now_ms`.
    pub fn heard(&mut self, contract: u32, now_ms: u64) {
        if contract >= CONTRACT {
            self.records = true;
        } else {
            self.echoing_at_ms = Some(now_ms);
        }
    }

    /// Whether dispatches and reports may leave out what the predictor keeps itself.
    pub fn lean(&self, now_ms: u64) -> bool {
        self.records && self.echoing_at_ms.is_none_or(|t| now_ms.saturating_sub(t) >= ECHO_MEMORY_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lean_only_while_no_predictor_that_needs_echoes_was_heard_lately() {
        let mut c = Contract::default();
        assert!(!c.lean(0), "nothing heard: the echoes every predictor reads");
        c.heard(0, 1_000);
        assert!(!c.lean(1_000), "a contract-1 predictor answers without `contract`");
        c.heard(CONTRACT, 2_000);
        assert!(!c.lean(2_000), "a rollout's overlap: both answer");
        assert!(c.lean(1_000 + ECHO_MEMORY_MS), "the old one unheard for a minute");
        c.heard(1, 70_000);
        assert!(!c.lean(70_000), "a rollback: echoes again at once");
    }
}
