//! Envoy as the filter sees it in a simulated-time run: an implementation of the filter's
//! [`Host`] over plain fields, set by the world before each callback and read back after,
//! so the filter's own code (`filter/core`: the flow, the VM, the outbox, the coalescer)
//! makes every decision. What Envoy itself would do with the filter's calls, wake-ups and
//! headers is left in the host for the world to carry out in simulated time.

use std::time::Duration;

use headroom_filter_core::header_map::HeaderMap;
use headroom_filter_core::host::{Buffer, Event, FallbackCause, Host, HostError, Level, Map};

/// A call the filter started: the world delivers it to the predictor and its answer back.
#[derive(Debug)]
pub struct Call {
    pub token: u32,
    pub path: String,
    pub body: Vec<u8>,
    pub timeout: Duration,
    /// The request context that made it (its answer goes back there), or `None`: the root.
    pub context: Option<u32>,
}

/// What a request's callbacks read and write.
#[derive(Debug, Default)]
pub struct Stream {
    pub request_headers: Vec<(String, String)>,
    pub request_body: Vec<u8>,
    pub response_headers: Vec<(String, String)>,
    pub response_body: Vec<u8>,
    pub upstream: Option<String>,
}

/// The host of one VM (one Envoy worker).
#[derive(Debug, Default)]
pub struct SimEnvoy {
    pub now_ns: u64,
    /// The effective context: a request's, or `None` for the root.
    pub context: Option<u32>,
    pub stream: Stream,
    pub callout_status: Option<u16>,
    pub callout_body: Vec<u8>,
    next_token: u32,
    /// Calls started since the world last took them.
    pub calls: Vec<Call>,
    /// The filter asked to be woken.
    pub woken: bool,
    /// Fallbacks, by cause, over the run (the predictor never fails here: a fallback is a
    /// decision path the world's delays drove the filter to, and the run says so).
    pub fallbacks: [u64; FallbackCause::ALL.len()],
}

fn get(map: &[(String, String)], name: &str) -> Option<String> {
    map.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

fn set(map: &mut Vec<(String, String)>, name: &str, value: &str) {
    match map.iter_mut().find(|(n, _)| n == name) {
        Some((_, v)) => *v = value.to_string(),
        None => map.push((name.to_string(), value.to_string())),
    }
}

impl SimEnvoy {
    fn map(&self, map: Map) -> Option<&Vec<(String, String)>> {
        match map {
            Map::RequestHeaders => Some(&self.stream.request_headers),
            Map::ResponseHeaders => Some(&self.stream.response_headers),
            Map::CalloutHeaders => None,
        }
    }

    fn map_mut(&mut self, map: Map) -> Result<&mut Vec<(String, String)>, HostError> {
        match map {
            Map::RequestHeaders => Ok(&mut self.stream.request_headers),
            Map::ResponseHeaders => Ok(&mut self.stream.response_headers),
            Map::CalloutHeaders => Err(HostError(HostError::UNIMPLEMENTED)),
        }
    }
}

impl Host for SimEnvoy {
    fn now_ns(&self) -> u64 {
        self.now_ns
    }

    fn header(&self, map: Map, name: &str) -> Option<String> {
        match map {
            Map::CalloutHeaders => (name == ":status").then(|| self.callout_status.map(|s| s.to_string())).flatten(),
            _ => self.map(map).and_then(|m| get(m, name)),
        }
    }

    fn headers(&self, map: Map) -> HeaderMap {
        HeaderMap::new(self.map(map).cloned().unwrap_or_default())
    }

    fn set_header(&mut self, map: Map, name: &str, value: &str) -> Result<(), HostError> {
        set(self.map_mut(map)?, name, value);
        Ok(())
    }

    fn remove_header(&mut self, map: Map, name: &str) -> Result<(), HostError> {
        self.map_mut(map)?.retain(|(n, _)| n != name);
        Ok(())
    }

    fn buffer(&self, buffer: Buffer, size: usize) -> Option<Vec<u8>> {
        let bytes = match buffer {
            Buffer::RequestBody => &self.stream.request_body,
            Buffer::ResponseBody => &self.stream.response_body,
            Buffer::CalloutBody => &self.callout_body,
            Buffer::StreamMessage => return None,
        };
        Some(bytes[..size.min(bytes.len())].to_vec())
    }

    fn upstream_address(&self) -> Option<String> {
        self.stream.upstream.clone()
    }

    fn http_call(
        &mut self,
        _cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, HostError> {
        self.next_token += 1;
        let path = headers.iter().find(|(n, _)| *n == ":path").map_or("", |(_, v)| v);
        self.calls.push(Call {
            token: self.next_token,
            path: path.to_string(),
            body: body.to_vec(),
            timeout,
            context: self.context,
        });
        Ok(self.next_token)
    }

    fn wake(&mut self) -> Result<(), HostError> {
        self.woken = true;
        Ok(())
    }

    fn log(&mut self, _level: Level, _message: &str) {}

    fn record(&mut self, event: Event) {
        if let Event::Fallback(cause) = event {
            if let Some(i) = FallbackCause::ALL.iter().position(|c| *c == cause) {
                self.fallbacks[i] += 1;
            }
        }
    }
}
