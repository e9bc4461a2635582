//! A minimal HTTP/1.1 keep-alive client over one TCP connection, for measuring the gateway.
//!
//! The gateway benchmark times differences of a few hundred microseconds; a general client
//! (reqwest's blocking client hands every request to a runtime thread) would add its own
//! jitter and, in the closed-loop runs, take CPU from the Envoy it measures. This one writes
//! a prepared request and reads one response (`content-length` or chunked) on the calling
//! thread.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One keep-alive connection; reconnects when the peer closed it.
pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

/// A request ready to write: the bytes of the request line, headers and body.
pub fn request_bytes(path: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut out = format!(
        "POST {path} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

impl Conn {
    pub fn new(addr: SocketAddr) -> Conn {
        Conn { addr, stream: None, buf: Vec::with_capacity(8192) }
    }

    /// Sends `request` and reads its response; returns the status. A failure drops the
    /// connection (the next call reconnects).
    pub fn send(&mut self, request: &[u8]) -> std::io::Result<u16> {
        let result = self.exchange(request);
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    fn exchange(&mut self, request: &[u8]) -> std::io::Result<u16> {
        if self.stream.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            self.stream = Some(s);
        }
        let Some(stream) = self.stream.as_mut() else { return Err(broken("no connection")) };
        stream.write_all(request)?;
        self.buf.clear();
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            read_more(stream, &mut self.buf)?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(|_| broken("response head is not UTF-8"))?;
        let status = head.split(' ').nth(1).and_then(|s| s.parse::<u16>().ok()).ok_or_else(|| broken("status line"))?;
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_ascii_lowercase())
            })
        };
        let close = header("connection").is_some_and(|v| v == "close");
        if let Some(len) = header("content-length") {
            let len: usize = len.parse().map_err(|_| broken("content-length"))?;
            while self.buf.len() < head_end + len {
                read_more(stream, &mut self.buf)?;
            }
        } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            let mut at = head_end;
            loop {
                let line_end = loop {
                    if let Some(i) = find(&self.buf[at..], b"\r\n") {
                        break at + i;
                    }
                    read_more(stream, &mut self.buf)?;
                };
                let size_text = std::str::from_utf8(&self.buf[at..line_end]).map_err(|_| broken("chunk size"))?;
                let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| broken("chunk size"))?;
                // The chunk, its CRLF (and for the last chunk, the CRLF that ends the trailers).
                let end = line_end + 2 + size + 2;
                while self.buf.len() < end {
                    read_more(stream, &mut self.buf)?;
                }
                at = end;
                if size == 0 {
                    break;
                }
            }
        }
        if close {
            self.stream = None;
        }
        Ok(status)
    }
}

fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk)?;
    if n == 0 {
        return Err(broken("connection closed mid-response"));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn broken(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers each request on one connection with the given raw responses in turn.
    fn serve(responses: Vec<&'static [u8]>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            for r in responses {
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while find(&got, b"\r\n\r\n").is_none() {
                    let n = s.read(&mut buf).unwrap();
                    got.extend_from_slice(&buf[..n]);
                }
                s.write_all(r).unwrap();
            }
        });
        addr
    }

    #[test]
    fn reads_length_and_chunked_responses_on_one_connection() {
        let addr = serve(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
            b"HTTP/1.1 429 Too Many\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ]);
        let mut c = Conn::new(addr);
        let req = request_bytes("/x", &[], "{}");
        assert_eq!(c.send(&req).unwrap(), 200);
        assert_eq!(c.send(&req).unwrap(), 429);
        assert_eq!(c.send(&req).unwrap(), 200);
    }
}
