//! Restore of an arbitrary `samples.msgpack`: refused, or filed again under the
//! current caps with every kept sample usable.
#![no_main]

use headroom_predictor_core::model::sampler::Samples;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(restored) = rmp_serde::from_slice::<Samples>(data) {
        let s = Samples::rehome(restored, 50, 10);
        assert!(s.train.len() <= 50 * 100 * 4 && s.new_since_training <= s.train.len());
        assert!(s.train.samples().chain(s.holdout.samples()).all(|x| x.row.iter().all(|v| v.is_finite())));
    }
});
