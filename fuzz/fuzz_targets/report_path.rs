//! The report path through the model store and the flow queues, over one long-lived
//! predictor state (predictor-core, its models run natively): a sequence of operations, each a decoded body (MessagePack or JSON) or a
//! step of time: predict calls that offer to wait (`admission::admit`, queued while the engine
//! metrics say there is no headroom), dispatch and report batches (`service::dispatch`,
//! `service::report`: tracking, the flow queue's drain, samples filed in the store),
//! abandoned callers, fuzzed engine metrics, flow rounds (`admission::serve_pool`) and expiry.
//! Never a panic; tracking and queues stay within their caps.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use headroom_predictor::scrape::parse_engine_metrics;
use headroom_predictor_core::clock::WallClock;
use headroom_predictor_core::config::Config;
use headroom_predictor_core::admission::{self, Admission};
use headroom_predictor_core::flow::queue::Reply;
use headroom_predictor_core::model::native::Native;
use headroom_predictor_core::predictor::Predictor;
use headroom_predictor_core::service;
use headroom_protocol::{codec, DispatchBatch, Format, PredictRequest, PredictResponse, ReportBatch};
use libfuzzer_sys::fuzz_target;

const MAX_IN_FLIGHT: usize = 64;
const MAX_QUEUED: usize = 16;

/// A caller waiting for its answer; it leaves when its ticket is dropped.
#[derive(Debug)]
struct Caller;

impl Reply for Caller {
    fn send(self: Box<Self>, _answer: PredictResponse) {}
    fn is_closed(&self) -> bool {
        false
    }
}

fn state() -> &'static Arc<Predictor> {
    static STATE: OnceLock<Arc<Predictor>> = OnceLock::new();
    STATE.get_or_init(|| {
        let text = format!(
            "max_in_flight = {MAX_IN_FLIGHT}\n[flow]\nmax_queued = {MAX_QUEUED}\nmax_queued_per_band = 8\n\
             [[pool]]\nname = \"p\"\nendpoints = [\"10.0.0.1:8000\", \"10.0.0.2:8000\"]\n"
        );
        let config = Config::parse(&text).unwrap_or_else(|e| panic!("fuzz config: {e}"));
        let predictor = Predictor::new(config, Arc::new(Native), Arc::new(WallClock));
        Arc::new(predictor.unwrap_or_else(|e| panic!("fuzz state: {e}")))
    })
}

fuzz_target!(|data: &[u8]| {
    let state = state();
    let mut now = Instant::now();
    // Callers waiting in the queue: dropping a ticket is a caller that left.
    let mut waiting = Vec::new();
    let mut rest = data;
    while let [op, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (body, after) = tail.split_at(n);
        rest = after;
        let format = if op & 0x80 == 0 { Format::MsgPack } else { Format::Json };
        match op % 8 {
            0 => {
                let Ok(req) = codec::decode::<PredictRequest>(format, body) else { continue };
                if req.check().is_err() {
                    continue;
                }
                let Some(answer) = service::predict(state, req.clone(), now) else { continue };
                if let Admission::Wait(ticket) = admission::admit(state, req, answer, now, Box::new(Caller)) {
                    waiting.push(ticket);
                }
            }
            1 => {
                if let Ok(batch) = codec::decode::<DispatchBatch>(format, body) {
                    if batch.check().is_ok() {
                        service::dispatch(state, &batch, &headroom_predictor_core::callers::Caller::anonymous(), now);
                    }
                }
            }
            2 => {
                if let Ok(batch) = codec::decode::<ReportBatch>(format, body) {
                    if batch.check().is_ok() {
                        service::report(state, batch, &headroom_predictor_core::callers::Caller::anonymous(), now);
                    }
                }
            }
            3 => {
                let text = String::from_utf8_lossy(body);
                if let Some(m) = parse_engine_metrics(&text) {
                    let i = usize::from(*len % 2);
                    state.pools.with("p", |p| {
                        if let Some(e) = p.endpoints.get_mut(i) {
                            e.scraped(m, now);
                        }
                    });
                }
            }
            4 => admission::serve_pool(state, "p", now),
            5 => {
                if !waiting.is_empty() {
                    waiting.remove(usize::from(*len) % waiting.len());
                }
            }
            6 => now += Duration::from_millis(u64::from(*len) * 40),
            _ => {
                now += Duration::from_secs(u64::from(*len));
                state.pools.with("p", |p| p.expire(now));
            }
        }
    }
    let (tracked, finished) = state.pools.with("p", |p| p.tracked()).unwrap_or_default();
    assert!(tracked <= MAX_IN_FLIGHT && finished <= MAX_IN_FLIGHT, "tracking past its cap: {tracked}, {finished}");
    let queued = state.flows.with("p", |q| q.len());
    assert!(queued <= MAX_QUEUED, "the queue past its cap: {queued}");
    // The callers of this run leave; the next run starts with an empty queue.
    drop(waiting);
    admission::serve_pool(state, "p", now);
});
