//! How far a set of relative errors reaches, as drift and the holdout comparisons judge
//! it. Its own module because a trained model's record (`registry::ModelInfo`) carries
//! it and a training round (`training`) computes it: each of those takes it from here.

use serde::{Deserialize, Serialize};

/// Held-out samples needed before a candidate can be refused for scoring worse.
pub const MIN_HOLDOUT_TO_COMPARE: usize = 20;

/// Relative errors as drift judges them: each capped at [`ErrorSpread::CAP`], their mean
/// and its standard error.
///
/// Why capped: a request that took a seventh of its prediction (it reached the engine
/// just before a step ended) is a 600% error, and two such raise the mean of a window of
/// 100 by 12 points, as much as a fleet grown 1.5x slower raises it from 20% (a slower
/// fleet's errors are bounded by 100%: it cannot stand out of such a tail). Capped, a slower
/// fleet stands out of the noise; uncapped, the mean of a held-out set of 40-60 and of the
/// live window moved so much by chance that a stationary fleet set drift off a few times
/// a run, each time throwing away the stratified reservoirs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ErrorSpread {
    pub capped_mape: f64,
    pub standard_error: f64,
}

impl ErrorSpread {
    /// An error counts at most this much (100%).
    pub const CAP: f64 = 1.0;

    /// `None` under [`MIN_HOLDOUT_TO_COMPARE`] errors: the mean and spread of a handful say
    /// too little to judge drift against. (A drift round's model judged on 0-15 held-out
    /// samples, its figure noise, set drift off again and again: 24 rounds in bursts in a
    /// 20-minute run, each resetting the live correction, the predictions running away.)
    pub fn of(ape: &[f64]) -> Option<ErrorSpread> {
        let n = ape.len();
        if n < MIN_HOLDOUT_TO_COMPARE {
            return None;
        }
        let capped = || ape.iter().map(|e| e.min(Self::CAP));
        let mean = capped().sum::<f64>() / n as f64;
        let var = capped().map(|e| (e - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        Some(ErrorSpread { capped_mape: mean, standard_error: (var / n as f64).sqrt() })
    }
}
