//! `/v1/predict/batch` and the predict stream's messages as the predictor answers them
//! (`api::answer_batch`): any body, MessagePack or JSON, decoded, checked against the
//! contract, and what passes applied (its dispatches, its reports) and predicted for, over
//! one long-lived service state whose endpoints have engine metrics, so every request
//! runs the model path. Never a panic; every answer holds its bounds.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use headroom_predictor::config::Config;
use headroom_predictor::scrape::parse_engine_metrics;
use headroom_predictor::{api, state::AppState};
use headroom_protocol::{codec, Format, PredictBatch};
use libfuzzer_sys::fuzz_target;

const METRICS: &str = "vllm:num_requests_running 12\nvllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.4\n";

fn state() -> &'static Arc<AppState> {
    static STATE: OnceLock<Arc<AppState>> = OnceLock::new();
    STATE.get_or_init(|| {
        let config = Config::parse("[[pool]]\nname = \"p\"\nendpoints = [\"10.0.0.1:8000\", \"10.0.0.2:8000\"]\n")
            .unwrap_or_else(|e| panic!("fuzz config: {e}"));
        Arc::new(AppState::new(config).unwrap_or_else(|e| panic!("fuzz state (is ORT_DYLIB_PATH set?): {e}")))
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let state = state();
    let now = Instant::now();
    // Fresh engine metrics on every endpoint, so each request is predicted for.
    if let Some(m) = parse_engine_metrics(METRICS) {
        state.core.pools.with("p", |p| p.endpoints.iter_mut().for_each(|e| e.scraped(m, now)));
    }
    let format = if selector & 1 == 0 { Format::MsgPack } else { Format::Json };
    let Ok(batch) = codec::decode::<PredictBatch>(format, body) else { return };
    let Ok(answered) = api::answer_batch(state, batch, "/v1/predict/batch", now) else { return };
    for answer in &answered.answers {
        for (i, e) in answer.endpoints.iter().enumerate() {
            assert!(e.check(&format!("endpoints[{i}]")).is_ok(), "an answer out of its bounds: {e:?}");
        }
    }
});
