//! The core's `Host` trait over Envoy: each method one binding of `host`, and
//! events counted in `stats`.

use std::time::Duration;

use headroom_filter_core::header_map::HeaderMap;
use headroom_filter_core::host::{Buffer, Event, Host, HostError, Level, Map};
use proxy_wasm::types::{BufferType, MapType};

use crate::host::{self, HostResult};
use crate::stats::Stats;

/// The core's `Host` over Envoy, counting events in `stats`.
pub struct Envoy<'a> {
    pub stats: &'a Stats,
    /// The VM's wake-up queue, once registered (`Host::wake`).
    pub wake: Option<u32>,
}

fn map_type(map: Map) -> MapType {
    match map {
        Map::RequestHeaders => MapType::HttpRequestHeaders,
        Map::ResponseHeaders => MapType::HttpResponseHeaders,
        Map::CalloutHeaders => MapType::HttpCallResponseHeaders,
    }
}

impl Host for Envoy<'_> {
    fn now_ns(&self) -> u64 {
        host::now_ns()
    }

    fn header(&self, map: Map, name: &str) -> Option<String> {
        host::header(map_type(map), name)
    }

    fn headers(&self, map: Map) -> HeaderMap {
        host::headers(map_type(map))
    }

    fn set_header(&mut self, map: Map, name: &str, value: &str) -> HostResult<()> {
        host::set_header(map_type(map), name, value)
    }

    fn remove_header(&mut self, map: Map, name: &str) -> HostResult<()> {
        host::remove_header(map_type(map), name)
    }

    fn buffer(&self, kind: Buffer, size: usize) -> Option<Vec<u8>> {
        let kind = match kind {
            Buffer::RequestBody => BufferType::HttpRequestBody,
            Buffer::ResponseBody => BufferType::HttpResponseBody,
            Buffer::CalloutBody => BufferType::HttpCallResponseBody,
            Buffer::StreamMessage => BufferType::GrpcReceiveBuffer,
        };
        host::buffer(kind, size).ok().flatten()
    }

    fn upstream_address(&self) -> Option<String> {
        host::property(&["upstream", "address"]).map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> HostResult<u32> {
        host::http_call(cluster, headers, body, timeout)
    }

    fn open_stream(
        &mut self,
        cluster: &str,
        service: &str,
        method: &str,
        metadata: &[(&str, &str)],
    ) -> HostResult<u32> {
        host::open_stream(cluster, service, method, metadata)
    }

    fn send_stream(&mut self, stream: u32, message: &[u8]) -> HostResult<()> {
        host::send_stream(stream, message)
    }

    fn cancel_stream(&mut self, stream: u32) {
        host::cancel_stream(stream);
    }

    fn wake(&mut self) -> HostResult<()> {
        match self.wake {
            Some(queue) => host::enqueue(queue, b"w"),
            None => Err(HostError(HostError::UNIMPLEMENTED)),
        }
    }

    fn log(&mut self, level: Level, message: &str) {
        host::log(level, message);
    }

    fn record(&mut self, event: Event) {
        self.stats.record(event);
    }
}
