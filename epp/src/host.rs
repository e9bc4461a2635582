//! `filter/core`'s [`Host`] over one ext_proc stream: the request the picker sees as Envoy's
//! messages, the header changes it answers with, and the calls it makes to the predictor.
//!
//! The flow reads and writes headers as it would inside Envoy; here the maps are the copies
//! Envoy sent, and every change is also kept as a mutation for the next answer on the
//! stream ([`Io`]). The root's callbacks (tick, wake-ups, coalesced and batch calls) get a
//! host with no stream.

use std::time::{Duration, Instant};

use headroom_filter_core::header_map::HeaderMap;
use headroom_filter_core::host::{Buffer, Event, Host, HostError, Level, Map};

use crate::calls::Calls;
use crate::inbox::Answer;
use crate::proto::{BodySendMode, HeaderMutation, HeaderValue, HeaderValueOption, OVERWRITE_IF_EXISTS_OR_ADD};
use crate::stats::Stats;

/// A header map as Envoy sent it: names lower-case, in order.
pub type Headers = Vec<(String, String)>;

/// Header changes the flow made that Envoy has not been told of yet.
#[derive(Debug, Default)]
pub struct Mutations {
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
}

impl Mutations {
    fn set(&mut self, name: &str, value: &str) {
        self.remove.retain(|n| n != name);
        self.set.retain(|(n, _)| n != name);
        self.set.push((name.to_string(), value.to_string()));
    }

    fn remove(&mut self, name: &str) {
        self.set.retain(|(n, _)| n != name);
        if !self.remove.iter().any(|n| n == name) {
            self.remove.push(name.to_string());
        }
    }

    /// The changes as an ext_proc header mutation (`None`: no change), and forgotten.
    pub fn take(&mut self) -> Option<HeaderMutation> {
        if self.set.is_empty() && self.remove.is_empty() {
            return None;
        }
        let set_headers = self.set.drain(..).map(|(n, v)| set(&n, &v)).collect();
        Some(HeaderMutation { set_headers, remove_headers: std::mem::take(&mut self.remove) })
    }
}

/// Sets (replacing) header `name` in an ext_proc mutation; the value as raw bytes, as Envoy sends.
pub fn set(name: &str, value: &str) -> HeaderValueOption {
    let header = HeaderValue { key: name.to_string(), value: String::new(), raw_value: value.as_bytes().to_vec() };
    HeaderValueOption { header: Some(header), append_action: OVERWRITE_IF_EXISTS_OR_ADD }
}

/// One HTTP request as the picker knows it from its ext_proc stream.
#[derive(Debug)]
pub struct Io {
    /// How Envoy sends the request body (the stream's first message says).
    pub request_body_mode: BodySendMode,
    pub response_body_mode: BodySendMode,
    pub request_headers: Headers,
    pub response_headers: Headers,
    pub request_mutations: Mutations,
    pub response_mutations: Mutations,
    /// The request body so far.
    pub body: Vec<u8>,
    /// The response body chunk being processed.
    pub chunk: Vec<u8>,
    /// The upstream that served the request (the `upstream.address` attribute).
    pub upstream: Option<String>,
    /// The endpoints the gateway allows the request (its subset hint), when it says.
    pub subset: Option<Vec<String>>,
    /// The header the flow names its pick in (`destination_header`), which the picker also
    /// gives as `envoy.lb` metadata.
    pub destination_header: String,
}

impl Io {
    pub fn new(destination_header: &str) -> Io {
        Io {
            destination_header: destination_header.to_string(),
            // Until the stream's first message says: what the shipped Envoy configuration sets.
            request_body_mode: BodySendMode::Buffered,
            response_body_mode: BodySendMode::Streamed,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
            request_mutations: Mutations::default(),
            response_mutations: Mutations::default(),
            body: Vec::new(),
            chunk: Vec::new(),
            upstream: None,
            subset: None,
        }
    }

    fn map(&self, map: Map) -> Option<&Headers> {
        match map {
            Map::RequestHeaders => Some(&self.request_headers),
            Map::ResponseHeaders => Some(&self.response_headers),
            Map::CalloutHeaders => None,
        }
    }
}

/// The host one callback of the flow or the VM runs against.
pub struct EppHost<'a> {
    pub origin: Instant,
    /// The stream the callback is for (none for the root's).
    pub io: Option<&'a mut Io>,
    /// The answer being delivered, in a callout callback.
    pub answer: Option<&'a Answer>,
    pub calls: &'a mut Calls,
    pub stats: &'a Stats,
    /// The host context the callback runs as (its calls' answers go back to it; 0 the root).
    pub context: u32,
}

impl EppHost<'_> {
    /// A header map the flow may change, with the changes Envoy is to be told of.
    fn writable(&mut self, map: Map) -> Result<(&mut Headers, &mut Mutations), HostError> {
        let io = self.io.as_mut().ok_or(HostError(HostError::UNIMPLEMENTED))?;
        match map {
            Map::RequestHeaders => Ok((&mut io.request_headers, &mut io.request_mutations)),
            Map::ResponseHeaders => Ok((&mut io.response_headers, &mut io.response_mutations)),
            Map::CalloutHeaders => Err(HostError(HostError::UNIMPLEMENTED)),
        }
    }
}

impl Host for EppHost<'_> {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn header(&self, map: Map, name: &str) -> Option<String> {
        if map == Map::CalloutHeaders {
            return match name {
                ":status" => self.answer.and_then(|a| a.status).map(|s| s.to_string()),
                _ => None,
            };
        }
        let pairs = self.io.as_ref()?.map(map)?;
        pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }

    fn headers(&self, map: Map) -> HeaderMap {
        let pairs = self.io.as_ref().and_then(|io| io.map(map)).cloned().unwrap_or_default();
        HeaderMap::new(pairs)
    }

    fn set_header(&mut self, map: Map, name: &str, value: &str) -> Result<(), HostError> {
        let (pairs, mutations) = self.writable(map)?;
        pairs.retain(|(n, _)| n != name);
        pairs.push((name.to_string(), value.to_string()));
        mutations.set(name, value);
        Ok(())
    }

    fn remove_header(&mut self, map: Map, name: &str) -> Result<(), HostError> {
        let (pairs, mutations) = self.writable(map)?;
        pairs.retain(|(n, _)| n != name);
        mutations.remove(name);
        Ok(())
    }

    fn buffer(&self, buffer: Buffer, size: usize) -> Option<Vec<u8>> {
        let bytes = match buffer {
            Buffer::RequestBody => &self.io.as_ref()?.body,
            Buffer::ResponseBody => &self.io.as_ref()?.chunk,
            Buffer::CalloutBody => &self.answer?.body,
            Buffer::StreamMessage => return None,
        };
        (!bytes.is_empty()).then(|| bytes[..size.min(bytes.len())].to_vec())
    }

    fn upstream_address(&self) -> Option<String> {
        self.io.as_ref()?.upstream.clone()
    }

    fn endpoint_subset(&self) -> Option<Vec<String>> {
        self.io.as_ref()?.subset.clone()
    }

    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, HostError> {
        self.calls.start(self.context, cluster, headers, body, timeout)
    }

    fn wake(&mut self) -> Result<(), HostError> {
        self.calls.wake();
        Ok(())
    }

    fn log(&mut self, level: Level, message: &str) {
        match level {
            Level::Info => tracing::info!("{message}"),
            Level::Warn => tracing::warn!("{message}"),
            Level::Error => tracing::error!("{message}"),
        }
    }

    fn record(&mut self, event: Event) {
        self.stats.record(event);
    }
}
