//! The predictor API bodies, MessagePack and JSON, every route: decode, check against
//! the contract's bounds, and apply what passes to a pool as the handlers do.
#![no_main]

use std::time::{Duration, Instant};

use headroom_predictor_core::pool::Pool;
use headroom_protocol::{codec, DispatchBatch, Format, PredictRequest, PredictResponse, ReportBatch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let format = if selector & 1 == 0 { Format::MsgPack } else { Format::Json };
    let mut pool = Pool::new("p", &["10.0.0.1:8000".into(), "10.0.0.2:8000".into()], 64).with_max_in_flight(100);
    let now = Instant::now();
    if let Ok(req) = codec::decode::<PredictRequest>(format, body) {
        if req.check().is_ok() {
            let _ = pool.states_for(&req.request, now);
        }
    }
    if let Ok(batch) = codec::decode::<DispatchBatch>(format, body) {
        if batch.check().is_ok() {
            for d in &batch.dispatches {
                let _ = pool.dispatch(d, now);
            }
            let _ = pool.states_for(&Default::default(), now + Duration::from_secs(1));
        }
    }
    if let Ok(batch) = codec::decode::<ReportBatch>(format, body) {
        if batch.check().is_ok() {
            for o in &batch.reports {
                let _ = pool.finish(&o.request_id, now);
            }
        }
    }
    if let Ok(answer) = codec::decode::<PredictResponse>(format, body) {
        for (i, e) in answer.endpoints.iter().enumerate() {
            let _ = e.check(&format!("endpoints[{i}]"));
        }
    }
    pool.expire(now + Duration::from_secs(3600));
});
