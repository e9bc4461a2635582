//! A minimal blocking HTTP/1.1 GET, enough for readiness probes and admin reads.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` on `addr`: (status, body). Errors on connection or parse failure.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    get_with_token(addr, path, None)
}

/// `GET path` with `authorization: Bearer <token>` when a token is given (the
/// predictor's guarded routes).
pub fn get_with_token(addr: SocketAddr, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
    let timeout = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Connection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP status line"))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// The sum of every series of metric `name` in a Prometheus text exposition (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of the series of `name` whose labels include `label` (e.g. `result="accepted"`).
pub fn metric_with(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_summed_by_exact_name_and_label() {
        let text = "# HELP a x\na_total{result=\"ok\"} 2\na_total{result=\"bad\"} 3\na_total_more 7\nb 1.5\n";
        assert_eq!(metric_sum(text, "a_total"), 5.0);
        assert_eq!(metric_with(text, "a_total", "result=\"ok\""), 2.0);
        assert_eq!(metric_sum(text, "b"), 1.5);
        assert_eq!(metric_sum(text, "c"), 0.0);
    }
}
