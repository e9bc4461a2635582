//! The messages of Envoy's external processing protocol (`envoy.service.ext_proc.v3`) the
//! endpoint picker reads and writes, written out with `prost` derives: the fields are
//! numbered as in Envoy's protos (`api/envoy/service/ext_proc/v3/external_processor.proto`,
//! `config/core/v3/base.proto`, `type/v3/http_status.proto`, `google/protobuf/struct.proto`).
//!
//! Only what the picker uses is declared: protobuf decoding skips the fields a message
//! declares nowhere here (`observability_mode`, typed metadata), so Envoy may send them. Hand-written rather than generated because the protocol's closure of imports
//! (validate, xds, udpa annotations) would need `protoc` and a proto tree to build, for a
//! dozen messages that have been stable since v3.

use std::collections::BTreeMap;

/// The gRPC method Envoy's `ext_proc` filter opens one stream of per HTTP request.
pub const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";
/// gRPC's health service (`grpc.health.v1`), which Kubernetes' gRPC probes call.
pub const HEALTH_CHECK_PATH: &str = "/grpc.health.v1.Health/Check";
/// The ext_proc service's name, as a health check asks for it.
pub const PROCESS_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingRequest {
    #[prost(oneof = "processing_request::Request", tags = "2, 3, 4, 5, 6, 7")]
    pub request: Option<processing_request::Request>,
    /// Properties Envoy was asked to send (`request_attributes` / `response_attributes`),
    /// under the filter's name (`envoy.filters.http.ext_proc`).
    #[prost(btree_map = "string, message", tag = "9")]
    pub attributes: BTreeMap<String, Struct>,
    /// The dynamic metadata Envoy forwards (`metadata_options.forwarding_namespaces`).
    #[prost(message, optional, tag = "8")]
    pub metadata_context: Option<Metadata>,
    #[prost(message, optional, tag = "11")]
    pub protocol_config: Option<ProtocolConfiguration>,
}

pub mod processing_request {
    use super::{HttpBody, HttpHeaders, HttpTrailers};

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Request {
        #[prost(message, tag = "2")]
        RequestHeaders(HttpHeaders),
        #[prost(message, tag = "3")]
        ResponseHeaders(HttpHeaders),
        #[prost(message, tag = "4")]
        RequestBody(HttpBody),
        #[prost(message, tag = "5")]
        ResponseBody(HttpBody),
        #[prost(message, tag = "6")]
        RequestTrailers(HttpTrailers),
        #[prost(message, tag = "7")]
        ResponseTrailers(HttpTrailers),
    }
}

/// How Envoy sends bodies (`ProcessingMode.BodySendMode`), told in the stream's first message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum BodySendMode {
    None = 0,
    Streamed = 1,
    Buffered = 2,
    BufferedPartial = 3,
    FullDuplexStreamed = 4,
    Grpc = 5,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtocolConfiguration {
    #[prost(enumeration = "BodySendMode", tag = "1")]
    pub request_body_mode: i32,
    #[prost(enumeration = "BodySendMode", tag = "2")]
    pub response_body_mode: i32,
    #[prost(bool, tag = "3")]
    pub send_body_without_waiting_for_header_response: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpHeaders {
    #[prost(message, optional, tag = "1")]
    pub headers: Option<HeaderMap>,
    #[prost(bool, tag = "3")]
    pub end_of_stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpBody {
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

/// Trailers (`FULL_DUPLEX_STREAMED` needs Envoy to send them: they end the body).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpTrailers {
    #[prost(message, optional, tag = "1")]
    pub trailers: Option<HeaderMap>,
}

/// `config.core.v3.HeaderMap`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderMap {
    #[prost(message, repeated, tag = "1")]
    pub headers: Vec<HeaderValue>,
}

/// `config.core.v3.HeaderValue`: Envoy sends the value in `raw_value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
    #[prost(bytes = "vec", tag = "3")]
    pub raw_value: Vec<u8>,
}

impl HeaderValue {
    /// The value, from `raw_value` when set (Envoy's way), else `value`.
    pub fn text(&self) -> String {
        if self.raw_value.is_empty() {
            self.value.clone()
        } else {
            String::from_utf8_lossy(&self.raw_value).into_owned()
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingResponse {
    #[prost(oneof = "processing_response::Response", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub response: Option<processing_response::Response>,
    /// Emitted by Envoy as dynamic metadata, one namespace per top-level field.
    #[prost(message, optional, tag = "8")]
    pub dynamic_metadata: Option<Struct>,
}

pub mod processing_response {
    use super::{BodyResponse, HeadersResponse, ImmediateResponse, TrailersResponse};

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Response {
        #[prost(message, tag = "1")]
        RequestHeaders(HeadersResponse),
        #[prost(message, tag = "2")]
        ResponseHeaders(HeadersResponse),
        #[prost(message, tag = "3")]
        RequestBody(BodyResponse),
        #[prost(message, tag = "4")]
        ResponseBody(BodyResponse),
        #[prost(message, tag = "5")]
        RequestTrailers(TrailersResponse),
        #[prost(message, tag = "6")]
        ResponseTrailers(TrailersResponse),
        #[prost(message, tag = "7")]
        ImmediateResponse(ImmediateResponse),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeadersResponse {
    #[prost(message, optional, tag = "1")]
    pub response: Option<CommonResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyResponse {
    #[prost(message, optional, tag = "1")]
    pub response: Option<CommonResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TrailersResponse {
    #[prost(message, optional, tag = "1")]
    pub header_mutation: Option<HeaderMutation>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommonResponse {
    /// 0: CONTINUE (the only status the picker sends).
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(message, optional, tag = "2")]
    pub header_mutation: Option<HeaderMutation>,
    #[prost(message, optional, tag = "3")]
    pub body_mutation: Option<BodyMutation>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyMutation {
    #[prost(oneof = "body_mutation::Mutation", tags = "3")]
    pub mutation: Option<body_mutation::Mutation>,
}

pub mod body_mutation {
    use super::StreamedBodyResponse;

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Mutation {
        /// `FULL_DUPLEX_STREAMED` mode: the body chunk Envoy passes on.
        #[prost(message, tag = "3")]
        StreamedResponse(StreamedBodyResponse),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamedBodyResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderMutation {
    #[prost(message, repeated, tag = "1")]
    pub set_headers: Vec<HeaderValueOption>,
    #[prost(string, repeated, tag = "2")]
    pub remove_headers: Vec<String>,
}

/// `config.core.v3.HeaderValueOption`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValueOption {
    #[prost(message, optional, tag = "1")]
    pub header: Option<HeaderValue>,
    /// `HeaderAppendAction`: 2 is OVERWRITE_IF_EXISTS_OR_ADD.
    #[prost(int32, tag = "3")]
    pub append_action: i32,
}

/// `HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD`: a set replaces, as the filter's does.
pub const OVERWRITE_IF_EXISTS_OR_ADD: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImmediateResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<HttpStatus>,
    #[prost(message, optional, tag = "2")]
    pub headers: Option<HeaderMutation>,
    #[prost(bytes = "vec", tag = "3")]
    pub body: Vec<u8>,
    /// Shown in Envoy's access logs as `%RESPONSE_CODE_DETAILS%`.
    #[prost(string, tag = "5")]
    pub details: String,
}

/// `type.v3.HttpStatus`: the code is the HTTP status number.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
}

/// `config.core.v3.Metadata`: untyped metadata by namespace.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    #[prost(btree_map = "string, message", tag = "1")]
    pub filter_metadata: BTreeMap<String, Struct>,
}

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: BTreeMap<String, Value>,
}

/// `google.protobuf.Value`, the kinds the picker reads or writes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "value::Kind", tags = "2, 3, 4, 5, 6")]
    pub kind: Option<value::Kind>,
}

pub mod value {
    use super::{ListValue, Struct};

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(double, tag = "2")]
        NumberValue(f64),
        #[prost(string, tag = "3")]
        StringValue(String),
        #[prost(bool, tag = "4")]
        BoolValue(bool),
        #[prost(message, tag = "5")]
        StructValue(Struct),
        #[prost(message, tag = "6")]
        ListValue(ListValue),
    }
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Value {
    pub fn string(s: impl Into<String>) -> Value {
        Value { kind: Some(value::Kind::StringValue(s.into())) }
    }

    /// The strings of a list (GIE's subset hint), or of a comma-separated string.
    pub fn strings(&self) -> Option<Vec<String>> {
        match &self.kind {
            Some(value::Kind::ListValue(list)) => {
                Some(list.values.iter().filter_map(Value::as_str).map(str::to_string).collect())
            }
            Some(value::Kind::StringValue(s)) => {
                Some(s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
            }
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Some(value::Kind::StringValue(s)) => Some(s),
            _ => None,
        }
    }
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`: 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    pub status: i32,
}
