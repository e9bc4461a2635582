//! The host calls the filter makes, each returning `Result` instead of panicking.
//!
//! proxy-wasm 0.2.5's own wrappers panic on any status they did not expect, and
//! a panic kills the VM (every later request then fails open or closed). These
//! bindings take the raw status as a `u32` and map it to [`HostError`].
//! Only `dispatch_http_call` and the gRPC stream calls go through the SDK, because its
//! dispatcher must register the callout and stream tokens; those wrappers map the statuses
//! Envoy returns (see [`open_stream`] for the one they do not).

use std::time::Duration;

use headroom_filter_core::header_map::{self, HeaderMap};
use headroom_filter_core::host::{HostError, Level, SteadyClock};
use proxy_wasm::types::{BufferType, MapType};

pub type HostResult<T> = Result<T, HostError>;

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;

#[allow(clashing_extern_declarations)]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map_type: u32, return_map_data: *mut *mut u8, return_map_size: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(metric_type: u32, name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_register_shared_queue(name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_dequeue_shared_queue(queue_id: u32, return_value_data: *mut *mut u8, return_value_size: *mut usize)
        -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
}

fn check(status: u32) -> HostResult<()> {
    if status == OK {
        Ok(())
    } else {
        Err(HostError(status))
    }
}

/// Takes ownership of a buffer the host allocated through `proxy_on_memory_allocate`.
///
/// # Safety
/// `data`/`size` must come from a successful host call that returned a buffer.
unsafe fn take_host_buffer(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        None
    } else {
        Some(Vec::from_raw_parts(data, size, size))
    }
}

/// Writes to Envoy's log (errors from the log call itself are ignored).
pub fn log(level: Level, message: &str) {
    let level: u32 = match level {
        Level::Info => 2,
        Level::Warn => 3,
        Level::Error => 4,
    };
    unsafe {
        proxy_log(level, message.as_ptr(), message.len());
    }
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn clock_time_get(clock_id: u32, precision: u64, time: *mut u64) -> u16;
}

/// WASI's monotonic clock id.
const CLOCK_MONOTONIC: u32 = 1;

thread_local! {
    /// Whether the host serves WASI's monotonic clock: asked once, so one VM never mixes
    /// the two clocks' origins.
    static MONOTONIC: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    /// The wall clock made safe for durations, where it is all the host has.
    static WALL: std::cell::Cell<SteadyClock> = const { std::cell::Cell::new(SteadyClock::new()) };
}

/// Whether [`now_ns`] reads the host's monotonic clock (else its wall clock, guarded).
pub fn monotonic_clock() -> bool {
    now_ns();
    MONOTONIC.with(|m| m.get().unwrap_or(false))
}

/// Host time in nanoseconds from an arbitrary origin, for durations and deadlines: the
/// monotonic clock, which Envoy serves to WASI's `clock_time_get` from its dispatcher's
/// time source, so a wall clock set back or forward (NTP, an operator) moves no TTFT, no
/// wait and no replica's skip. A host without it gets its wall clock; 0 if neither answers.
pub fn now_ns() -> u64 {
    let monotonic = || {
        let mut t = 0u64;
        // SAFETY: the host writes one u64 through a valid pointer to a local.
        (unsafe { clock_time_get(CLOCK_MONOTONIC, 1, &mut t) } == 0).then_some(t)
    };
    let served = MONOTONIC.with(|m| match m.get() {
        Some(known) => known,
        None => {
            let known = monotonic().is_some();
            m.set(Some(known));
            known
        }
    });
    if let Some(t) = monotonic().filter(|_| served) {
        return t;
    }
    let mut t = 0u64;
    unsafe {
        if proxy_get_current_time_nanoseconds(&mut t) != OK {
            return 0;
        }
    }
    WALL.with(|w| {
        let mut clock = w.get();
        let steady = clock.read(t);
        w.set(clock);
        steady
    })
}

pub fn set_tick_period(period: Duration) -> HostResult<()> {
    let ms = u32::try_from(period.as_millis()).unwrap_or(u32::MAX);
    check(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// Up to `max` bytes of a buffer from its start; `None` when there is none.
pub fn buffer(kind: BufferType, max: usize) -> HostResult<Option<Vec<u8>>> {
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    match unsafe { proxy_get_buffer_bytes(kind as u32, 0, max, &mut data, &mut size) } {
        OK => Ok(unsafe { take_host_buffer(data, size) }),
        NOT_FOUND => Ok(None),
        status => Err(HostError(status)),
    }
}

/// A header value (lossy UTF-8); `None` when absent or the map is gone.
pub fn header(map: MapType, name: &str) -> Option<String> {
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    match unsafe { proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), &mut data, &mut size) } {
        OK => unsafe { take_host_buffer(data, size) }.map(|b| String::from_utf8_lossy(&b).into_owned()),
        _ => None,
    }
}

/// A whole header map in one call; empty when the map is gone or its bytes do not decode.
pub fn headers(map: MapType) -> HeaderMap {
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    match unsafe { proxy_get_header_map_pairs(map as u32, &mut data, &mut size) } {
        OK => unsafe { take_host_buffer(data, size) }.and_then(|b| header_map::decode(&b)).unwrap_or_default(),
        _ => HeaderMap::default(),
    }
}

/// Sets (replacing) a header.
pub fn set_header(map: MapType, name: &str, value: &str) -> HostResult<()> {
    check(unsafe { proxy_replace_header_map_value(map as u32, name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// Removes a header; absent is fine.
pub fn remove_header(map: MapType, name: &str) -> HostResult<()> {
    match unsafe { proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()) } {
        OK | NOT_FOUND => Ok(()),
        status => Err(HostError(status)),
    }
}

/// A property by path, e.g. `["upstream", "address"]`.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    let joined = path.join("\0");
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    match unsafe { proxy_get_property(joined.as_ptr(), joined.len(), &mut data, &mut size) } {
        OK => unsafe { take_host_buffer(data, size) },
        _ => None,
    }
}

/// Lets a paused request continue to the next filter.
pub fn resume_request() -> HostResult<()> {
    const HTTP_REQUEST: u32 = 0;
    check(unsafe { proxy_continue_stream(HTTP_REQUEST) })
}

/// Answers the request locally with `status`, `headers` and `body`.
pub fn send_response(status: u32, headers: &[(&str, &str)], body: &[u8]) -> HostResult<()> {
    let headers = header_map::encode(headers);
    check(unsafe {
        proxy_send_local_response(
            status,
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

/// Starts an HTTP call to an Envoy cluster; the answer arrives in `on_http_call_response`.
pub fn http_call(cluster: &str, headers: &[(&str, &str)], body: &[u8], timeout: Duration) -> HostResult<u32> {
    proxy_wasm::hostcalls::dispatch_http_call(cluster, headers.to_vec(), Some(body), vec![], timeout)
        .map_err(|status| HostError(status as u32))
}

/// `GrpcService { envoy_grpc: { cluster_name: cluster } }` in protobuf's wire format.
///
/// Envoy reads the stream's target as this message, and only when that fails to parse as a
/// plain cluster name; a name that happens to parse (any string is a byte sequence) would be
/// taken for a different message, so the filter always sends the message.
fn grpc_service(cluster: &str) -> Vec<u8> {
    fn field(number: u8, bytes: &[u8], out: &mut Vec<u8>) {
        out.push(number << 3 | 2); // length-delimited
        let mut len = bytes.len();
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(bytes);
    }
    let mut envoy_grpc = Vec::new();
    field(1, cluster.as_bytes(), &mut envoy_grpc);
    let mut service = Vec::new();
    field(1, &envoy_grpc, &mut service);
    service
}

/// Opens a gRPC stream to `cluster`; its callbacks come to the calling root context.
///
/// Envoy answers `BadArgument` only when it cannot make a gRPC client for a well-formed
/// `envoy_grpc` service (not for a missing cluster: the stream then closes with
/// `UNAVAILABLE`); the SDK would panic on that status, and there is no way around its
/// wrapper, which registers the token.
pub fn open_stream(cluster: &str, service: &str, method: &str, metadata: &[(&str, &str)]) -> HostResult<u32> {
    let target = grpc_service(cluster);
    // The SDK takes the target as `&str`; Envoy reads it as bytes. The message is ASCII when
    // the cluster name is (field tags and lengths under 128), which Envoy's names are.
    let Ok(target) = std::str::from_utf8(&target) else { return Err(HostError(2)) };
    let metadata = metadata.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    proxy_wasm::hostcalls::open_grpc_stream(target, service, method, metadata).map_err(|s| HostError(s as u32))
}

/// Sends `message` on stream `token`.
pub fn send_stream(token: u32, message: &[u8]) -> HostResult<()> {
    proxy_wasm::hostcalls::send_grpc_stream_message(token, Some(message), false).map_err(|s| HostError(s as u32))
}

/// Resets stream `token` (absent is fine).
pub fn cancel_stream(token: u32) {
    let _ = proxy_wasm::hostcalls::cancel_grpc_stream(token);
}

/// Registers (or takes over) the shared queue `name` for the calling root context: an
/// enqueue then calls its `on_queue_ready` on this worker's thread, soon and outside the
/// enqueuer's callback. Envoy keys queues by VM id and name, and the last to register a
/// name receives it, so each VM registers a name of its own.
pub fn register_queue(name: &str) -> HostResult<u32> {
    let mut id = 0u32;
    check(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Appends `value` to shared queue `queue` (wakes its root context).
pub fn enqueue(queue: u32, value: &[u8]) -> HostResult<()> {
    check(unsafe { proxy_enqueue_shared_queue(queue, value.as_ptr(), value.len()) })
}

/// Takes the oldest item of shared queue `queue`; `None` when it is empty.
pub fn dequeue(queue: u32) -> HostResult<Option<Vec<u8>>> {
    const EMPTY: u32 = 7;
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    match unsafe { proxy_dequeue_shared_queue(queue, &mut data, &mut size) } {
        OK => Ok(Some(unsafe { take_host_buffer(data, size) }.unwrap_or_default())),
        EMPTY => Ok(None),
        status => Err(HostError(status)),
    }
}

/// Makes `context` the one later host calls act on (a request's headers, its resume);
/// `Err` when it no longer exists.
pub fn set_effective_context(context: u32) -> HostResult<()> {
    check(unsafe { proxy_set_effective_context(context) })
}

/// Kinds of Envoy stats.
#[derive(Debug, Clone, Copy)]
pub enum MetricKind {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// Defines (or finds) a stat; `None` if the host refused it.
pub fn define_metric(kind: MetricKind, name: &str) -> Option<u32> {
    let mut id = 0u32;
    (unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) } == OK).then_some(id)
}

pub fn increment_metric(id: u32, by: i64) {
    unsafe {
        proxy_increment_metric(id, by);
    }
}

pub fn record_metric(id: u32, value: u64) {
    unsafe {
        proxy_record_metric(id, value);
    }
}
