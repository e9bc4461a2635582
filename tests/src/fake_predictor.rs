//! A predictor that misbehaves on purpose: answers garbage, or sleeps past the
//! filter's timeout. Plain HTTP/1.1 with keep-alive, on 127.0.0.1, stopped on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How the fake answers `POST /v1/predict` (dispatch and report always get 200).
#[derive(Debug, Clone, Copy)]
pub enum Misbehaviour {
    /// 200 with a body that is not MessagePack.
    Garbage,
    /// Waits this long before answering (past the filter's timeout).
    Sleep(Duration),
}

pub struct FakePredictor {
    pub addr: SocketAddr,
    /// Predict calls received.
    pub predicts: Arc<AtomicU64>,
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
        let (s, p) = (stop.clone(), predicts.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (s, p) = (s.clone(), p.clone());
                        std::thread::spawn(move || serve(conn, mode, &s, &p));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(FakePredictor { addr, predicts, stop, thread: Some(thread) })
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

fn serve(conn: TcpStream, mode: Misbehaviour, stop: &AtomicBool, predicts: &AtomicU64) {
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
        let answer: &[u8] = if path == "/v1/predict" {
            predicts.fetch_add(1, Ordering::Relaxed);
            match mode {
                Misbehaviour::Garbage => b"\xc1 this is not messagepack \xff",
                Misbehaviour::Sleep(d) => {
                    std::thread::sleep(d);
                    b"\x80"
                }
            }
        } else {
            b"\x82\xa8accepted\x00\xa8rejected\x00"
        };
        let head =
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/msgpack\r\ncontent-length: {}\r\n\r\n", answer.len());
        if writer.write_all(head.as_bytes()).and_then(|_| writer.write_all(answer)).is_err() {
            return;
        }
    }
}
