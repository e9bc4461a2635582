//! The predict stream over real sockets and HTTP/2 (docs/protocol.md, "The predict stream"):
//! answers in order, a refused batch answered in the stream without ending it, the token,
//! broken framing, and the service's shutdown ending the streams it holds open.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use headroom_predictor::config::Config;
use headroom_protocol::stream::{self as wire, Deframer, StreamAnswer};
use headroom_protocol::{codec, Format, PredictBatch, PredictRequest};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use tokio::sync::{mpsc, oneshot};

const TOKEN: &str = "stream-test-token-0123456789";

/// A predictor over one pool of two endpoints nobody serves (predictions come from the prior).
async fn predictor() -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    // One file per call: the tests run at once, and each removes its own.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let token_file = std::env::temp_dir().join(format!("headroom-stream-token-{}-{call}", std::process::id()));
    std::fs::write(&token_file, TOKEN).unwrap();
    let config = Config::parse(&format!(
        "auth_token_file = {:?}\n[[pool]]\nname = \"default\"\nendpoints = [\"127.0.0.1:9\", \"127.0.0.1:10\"]\n",
        token_file.display().to_string()
    ))
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let service = tokio::spawn(headroom_predictor::serve(config, listener, async move { stopped.await.unwrap_or(()) }));
    // The service reads the token before it answers anything: once it does, the file can go.
    let health = format!("http://{addr}/healthz");
    let mut up = false;
    for _ in 0..500 {
        up = reqwest::get(&health).await.is_ok_and(|r| r.status().is_success());
        if up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = std::fs::remove_file(&token_file);
    assert!(up, "the predictor did not answer /healthz within 10 s");
    (addr, stop, service)
}

/// One open predict stream: messages go in on `send`, answers and the end come out of `next`.
struct Stream {
    send: Option<mpsc::Sender<Bytes>>,
    body: Incoming,
    deframer: Deframer,
}

#[derive(Debug, PartialEq)]
enum Out {
    Answer(StreamAnswer),
    End(u32),
}

impl Stream {
    /// Opens a stream with `authorization`; `Err` holds the HTTP status when it is refused.
    async fn open(addr: SocketAddr, authorization: Option<&str>) -> Result<Stream, u16> {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        let (tx, rx) = mpsc::channel::<Bytes>(8);
        let frames = Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
        }));
        let mut request = hyper::Request::post(format!("http://{addr}{}", wire::PATH))
            .header("content-type", wire::CONTENT_TYPE)
            .header("te", "trailers");
        if let Some(auth) = authorization {
            request = request.header("authorization", auth);
        }
        let response = sender.send_request(request.body(StreamBody::new(frames)).unwrap()).await.unwrap();
        if response.status() != 200 {
            return Err(response.status().as_u16());
        }
        assert_eq!(response.headers()["content-type"], wire::CONTENT_TYPE);
        Ok(Stream { send: Some(tx), body: response.into_body(), deframer: Deframer::default() })
    }

    async fn send(&self, message: &[u8]) {
        self.send_raw(wire::frame(message)).await;
    }

    async fn send_raw(&self, bytes: Vec<u8>) {
        self.send.as_ref().unwrap().send(Bytes::from(bytes)).await.unwrap();
    }

    /// Ends the gateway's side.
    fn finish(&mut self) {
        self.send = None;
    }

    async fn next(&mut self) -> Out {
        loop {
            if let Some(message) = self.deframer.next_message().unwrap() {
                return Out::Answer(codec::decode(Format::MsgPack, &message).unwrap());
            }
            let frame =
                tokio::time::timeout(Duration::from_secs(5), self.body.frame()).await.unwrap().unwrap().unwrap();
            match frame.into_data() {
                Ok(data) => self.deframer.push(&data),
                Err(frame) => {
                    let trailers = frame.into_trailers().unwrap();
                    return Out::End(trailers["grpc-status"].to_str().unwrap().parse().unwrap());
                }
            }
        }
    }
}

fn batch(pools: &[&str]) -> Vec<u8> {
    let requests = pools
        .iter()
        .enumerate()
        .map(|(i, pool)| {
            serde_json::from_value::<PredictRequest>(serde_json::json!({"pool": pool, "request_id": format!("r{i}"),
                "request": {"model": "m", "input_tokens": 100 * (i + 1), "streaming": true, "priority": 0}}))
            .unwrap()
        })
        .collect();
    codec::encode(Format::MsgPack, &PredictBatch { requests, ..Default::default() }).unwrap()
}

fn answer(out: Out) -> StreamAnswer {
    match out {
        Out::Answer(a) => a,
        Out::End(code) => panic!("the stream ended with grpc-status {code}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_batch_is_answered_in_order_and_a_refused_one_does_not_end_the_stream() {
    let (addr, stop, service) = predictor().await;
    let mut stream = Stream::open(addr, Some(&format!("Bearer {TOKEN}"))).await.unwrap();

    stream.send(&batch(&["default", "default"])).await;
    let first = answer(stream.next().await);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.answers.len(), 2);
    assert!(first.answers.iter().all(|a| a.endpoints.len() == 2), "{first:?}");

    // Not a batch at all, then a pool nobody serves: each answered as the HTTP route would.
    stream.send(b"\xc1 not msgpack").await;
    let garbage = answer(stream.next().await);
    assert_eq!(garbage.status, 400, "{garbage:?}");
    assert!(garbage.answers.is_empty() && garbage.error.is_some());
    stream.send(&batch(&["default", "nowhere"])).await;
    let unknown = answer(stream.next().await);
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.error.unwrap().error.field.as_deref(), Some("requests[1].pool"));

    // The stream goes on, and ends cleanly when the gateway ends its side.
    stream.send(&batch(&["default"])).await;
    assert_eq!(answer(stream.next().await).answers.len(), 1);
    stream.finish();
    assert_eq!(stream.next().await, Out::End(wire::status::OK));
    stop.send(()).unwrap();
    service.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_needs_the_token_and_unbroken_framing() {
    let (addr, stop, service) = predictor().await;
    assert_eq!(Stream::open(addr, None).await.err(), Some(401));
    assert_eq!(Stream::open(addr, Some("Bearer wrong-token-0123456789")).await.err(), Some(401));

    let mut stream = Stream::open(addr, Some(&format!("Bearer {TOKEN}"))).await.unwrap();
    stream.send_raw(vec![1, 0, 0, 0, 2, 0, 0]).await;
    assert_eq!(stream.next().await, Out::End(wire::status::UNIMPLEMENTED));
    stop.send(()).unwrap();
    service.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_ends_the_open_streams() {
    let (addr, stop, service) = predictor().await;
    let mut stream = Stream::open(addr, Some(&format!("Bearer {TOKEN}"))).await.unwrap();
    stream.send(&batch(&["default"])).await;
    assert_eq!(answer(stream.next().await).status, 200);

    // The gateway never ends its stream: without the predictor ending it, a graceful
    // shutdown would wait for it forever.
    stop.send(()).unwrap();
    assert_eq!(stream.next().await, Out::End(wire::status::UNAVAILABLE));
    tokio::time::timeout(Duration::from_secs(5), service).await.expect("shut down").unwrap().unwrap();
}
