//! A predictor that misbehaves on purpose: answers garbage, sleeps past the
//! filter's timeout, names an endpoint Envoy does not have, or favours the one endpoint
//! the test says. Plain HTTP/1.1
//! with keep-alive, on 127.0.0.1, stopped on drop; it keeps the reports it gets.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use headroom_protocol::codec::{decode, encode, Format};
use headroom_protocol::{
    EndpointPrediction, EndpointState, PredictBatch, PredictBatchResponse, PredictRequest, PredictResponse, Report,
    ReportBatch,
};

/// How the fake answers `POST /v1/predict` and `/v1/predict/batch` (dispatch and report
/// always get 200).
#[derive(Debug, Clone, Copy)]
pub enum Misbehaviour {
    /// 200 with a body that is not MessagePack.
    Garbage,
    /// Waits this long before answering (past the filter's timeout).
    Sleep(Duration),
    /// A well-formed answer whose only endpoint, [`UNKNOWN_ENDPOINT`], is in no
    /// Envoy cluster (a predictor pool out of step with the gateway's).
    UnknownEndpoint,
    /// A well-formed answer in which the first address of [`FakePredictor::ranking`] is the
    /// only one predicted to meet any SLO (TTFT 1 ms) and the others are hopeless (TTFT
    /// 1000 s): the filter picks the first, and lists the rest as fallbacks.
    Ranked,
}

/// The endpoint [`Misbehaviour::UnknownEndpoint`] predicts for (nothing listens there).
pub const UNKNOWN_ENDPOINT: &str = "127.0.0.1:9";

pub struct FakePredictor {
    pub addr: SocketAddr,
    /// Requests it was asked to predict, alone or in batches.
    pub predicts: Arc<AtomicU64>,
    /// Reports sent to it, decoded.
    pub reports: Arc<Mutex<Vec<Report>>>,
    /// The addresses [`Misbehaviour::Ranked`] answers with, best first (set by the test
    /// once it knows them).
    pub ranking: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakePredictor {
    pub fn start(mode: Misbehaviour) -> std::io::Result<FakePredictor> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let predicts = Arc::new(AtomicU64::new(0));
        let reports = Arc::new(Mutex::new(Vec::new()));
        let ranking = Arc::new(Mutex::new(Vec::new()));
        let seen =
            Seen { stop: stop.clone(), predicts: predicts.clone(), reports: reports.clone(), ranking: ranking.clone() };
        let thread = std::thread::spawn(move || {
            while !seen.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let seen = seen.clone();
                        std::thread::spawn(move || serve(conn, mode, &seen));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(FakePredictor { addr, predicts, reports, ranking, stop, thread: Some(thread) })
    }
}

impl Drop for FakePredictor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the connection threads share with the test.
#[derive(Clone)]
struct Seen {
    stop: Arc<AtomicBool>,
    predicts: Arc<AtomicU64>,
    reports: Arc<Mutex<Vec<Report>>>,
    ranking: Arc<Mutex<Vec<String>>>,
}

/// Predictions for `ranking`: a fast one for the first address, a hopeless one for each
/// of the others.
fn ranked_answer(pool: String, ranking: &[String]) -> PredictResponse {
    let endpoints = ranking
        .iter()
        .enumerate()
        .map(|(i, address)| {
            let ttft = if i == 0 { 1.0 } else { 1e6 };
            EndpointPrediction {
                address: address.clone(),
                ttft_ms: Some(ttft),
                tpot_ms: Some(1.0),
                state: EndpointState { running: 1, kv_usage: 0.5, ..Default::default() },
            }
        })
        .collect();
    PredictResponse { pool, model_version: "fake".into(), endpoints, flow: None }
}

/// What `mode` answers for the requests of `pools` (one per request), or `None` when it
/// answers no predictions (garbage, or nothing after sleeping).
fn answers(mode: Misbehaviour, pools: Vec<String>, ranking: &Mutex<Vec<String>>) -> Option<Vec<PredictResponse>> {
    let ranking = match mode {
        Misbehaviour::Garbage => return None,
        Misbehaviour::Sleep(d) => {
            std::thread::sleep(d);
            return None;
        }
        Misbehaviour::UnknownEndpoint => vec![UNKNOWN_ENDPOINT.to_string()],
        Misbehaviour::Ranked => ranking.lock().unwrap().clone(),
    };
    Some(pools.into_iter().map(|pool| ranked_answer(pool, &ranking)).collect())
}

fn serve(conn: TcpStream, mode: Misbehaviour, seen: &Seen) {
    let Seen { stop, predicts, reports: kept, ranking } = seen;
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    let Ok(mut writer) = conn.try_clone() else { return };
    let mut reader = BufReader::new(conn);
    while !stop.load(Ordering::Relaxed) {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(_) => continue, // read timeout: check `stop`, keep the connection
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        const GARBAGE: &[u8] = b"\xc1 this is not messagepack \xff";
        let answer: Vec<u8> = if path == "/v1/predict" {
            predicts.fetch_add(1, Ordering::Relaxed);
            let pool = decode::<PredictRequest>(Format::MsgPack, &body).map(|r| r.pool).unwrap_or_default();
            match answers(mode, vec![pool], ranking).and_then(|mut a| a.pop()) {
                Some(answer) => encode(Format::MsgPack, &answer).unwrap_or_default(),
                None => GARBAGE.to_vec(),
            }
        } else if path == "/v1/predict/batch" {
            let batch = decode::<PredictBatch>(Format::MsgPack, &body).unwrap_or_default();
            predicts.fetch_add(batch.requests.len() as u64, Ordering::Relaxed);
            if let Some(reports) = batch.reports {
                kept.lock().unwrap().extend(reports.reports);
            }
            let pools = batch.requests.into_iter().map(|r| r.pool).collect();
            match answers(mode, pools, ranking) {
                Some(answers) => encode(Format::MsgPack, &PredictBatchResponse { answers }).unwrap_or_default(),
                None => GARBAGE.to_vec(),
            }
        } else {
            if path == "/v1/report" {
                if let Ok(batch) = decode::<ReportBatch>(Format::MsgPack, &body) {
                    kept.lock().unwrap().extend(batch.reports);
                }
            }
            b"\x82\xa8accepted\x00\xa8rejected\x00".to_vec()
        };
        let head =
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/msgpack\r\ncontent-length: {}\r\n\r\n", answer.len());
        if writer.write_all(head.as_bytes()).and_then(|_| writer.write_all(&answer)).is_err() {
            return;
        }
    }
}
