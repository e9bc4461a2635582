//! One HTTP stream through the filter.
//!
//! headers: strip client routing headers, read SLO hints (400 when invalid), pause
//!          (with `read_body: false`: features from the headers, the callout starts here)
//! body:    parse the OpenAI body (400 when invalid), one predictor callout
//! callout: decide (route / shed 429 / fall back), set the destination header, resume
//! response: measure TTFT/TPOT as the body streams past
//! log:     queue the observation for the next flush

use std::time::Duration;

use headroom_filter_core::{error_json, fallback, headers as hints, policy};
use headroom_protocol::headers::{DEBUG_ENDPOINT, DEBUG_PREDICTED_TPOT, DEBUG_PREDICTED_TTFT, DEBUG_TIER};
use headroom_protocol::meter::{Measurement, ResponseMeter};
use headroom_protocol::{
    codec, limits, openai, paths, tokens, Dispatch, EndpointState, Format, Observation, PredictRequest,
    PredictResponse, RequestFeatures, RouteSource,
};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use crate::host::{self, Level};
use crate::root::SharedVm;
use crate::stats::FallbackCause;

/// The endpoint chosen and what was known about it.
struct Choice {
    endpoint: String,
    /// Endpoints to try next on retry, in order.
    fallbacks: Vec<String>,
    source: RouteSource,
    predicted_ttft_ms: Option<f64>,
    predicted_tpot_ms: Option<f64>,
    state: Option<EndpointState>,
}

pub struct Request {
    vm: SharedVm,
    /// Set once the request is known to be an inference request we route.
    routed: bool,
    /// The filter's own id for this request (`Vm::new_request_id`).
    request_id: String,
    /// The outbox's sequence number of this request's dispatch (0: none).
    dispatch_seq: u64,
    path: String,
    prediction_based: bool,
    features: RequestFeatures,
    /// Token, start time (ns) and cluster of the predictor call under way.
    callout: Option<(u32, u64, String)>,
    choice: Option<Choice>,
    forwarded_ns: u64,
    meter: Option<ResponseMeter>,
    status: u16,
}

impl Request {
    pub fn new(vm: SharedVm) -> Self {
        Request {
            vm,
            routed: false,
            request_id: String::new(),
            dispatch_seq: 0,
            path: String::new(),
            prediction_based: false,
            features: RequestFeatures::default(),
            callout: None,
            choice: None,
            forwarded_ns: 0,
            meter: None,
            status: 0,
        }
    }

    fn config(&self) -> std::rc::Rc<headroom_filter_core::FilterConfig> {
        self.vm.borrow().config.clone()
    }

    /// Answers locally with a JSON error naming `field`.
    fn reject(&mut self, status: u32, field: &str, message: &str) -> Action {
        self.vm.borrow().stats.bad_request();
        self.routed = false;
        let body = error_json(field, message);
        if host::send_response(status, &[("content-type", "application/json")], &body).is_err() {
            host::log(Level::Warn, "headroom: could not send local reply");
        }
        Action::Pause
    }

    /// Reads the body, starts the predictor callout. Returns the action for the body callback.
    fn on_full_body(&mut self, body_size: usize) -> Action {
        let config = self.config();
        let body = match host::buffer(BufferType::HttpRequestBody, body_size) {
            Ok(Some(b)) => b,
            _ => return self.reject(400, "body", "an inference request needs a JSON body"),
        };
        let chat = self.path.split('?').next().unwrap_or("").ends_with("/chat/completions");
        let parsed = match openai::parse_inference_body(&body, chat) {
            Ok(p) => p,
            Err(e) => return self.reject(400, &e.field, &e.message),
        };
        self.features.model = parsed.model;
        // Token counts are estimates: held to the contract's bound rather than refused.
        self.features.input_tokens = parsed.prompt_tokens.min(limits::MAX_TOKENS);
        self.features.prefix_hashes = tokens::prefix_block_hashes(&parsed.prompt_text, config.max_prefix_blocks);
        self.features.streaming = parsed.stream;
        self.features.max_tokens = parsed.max_tokens.map(|t| t.min(limits::MAX_TOKENS));
        // Anything else out of bounds (a 10 KB model name) is the client's to fix: a 400 here,
        // rather than a dispatch batch the predictor refuses with everyone else's in it.
        if let Err(e) = self.features.check("") {
            return self.reject(400, &e.field, &e.message);
        }
        self.start_callout()
    }

    /// Header-only routing: the input size estimated from `content-length`; streaming
    /// assumed when a TPOT SLO is given (it only means something for a stream).
    fn features_from_headers(&mut self) {
        let bytes =
            host::header(MapType::HttpRequestHeaders, "content-length").and_then(|v| v.trim().parse::<u64>().ok());
        self.features.input_tokens = bytes.map_or(0, tokens::estimate_tokens_from_bytes);
        self.features.streaming = self.features.slo.tpot_ms.is_some();
    }

    /// Sends the one predictor call; the answer arrives in `on_http_call_response`.
    fn start_callout(&mut self) -> Action {
        let config = self.config();
        let predict = PredictRequest {
            pool: config.pool.clone(),
            request_id: self.request_id.clone(),
            request: self.features.clone(),
        };
        let Ok(bytes) = codec::encode(Format::MsgPack, &predict) else {
            return self.fall_back(FallbackCause::CallFailed, false);
        };
        let timeout = Duration::from_millis(config.predictor_timeout_ms);
        let (cluster, called) = {
            let vm = self.vm.borrow();
            let cluster = vm.predictor_cluster();
            let called = host::http_call(&cluster, &vm.call_headers(paths::PREDICT), &bytes, timeout);
            (cluster, called)
        };
        match called {
            Ok(token) => {
                self.callout = Some((token, host::now_ns(), cluster));
                Action::Pause
            }
            Err(_) => {
                self.vm.borrow_mut().record_call(&cluster, None);
                self.fall_back(FallbackCause::CallFailed, false)
            }
        }
    }

    /// Routes without predictions. `resume` is true inside the callout callback.
    fn fall_back(&mut self, cause: FallbackCause, resume: bool) -> Action {
        let choice = {
            let mut vm = self.vm.borrow_mut();
            vm.stats.fallback(cause);
            let now = host::now_ms();
            let max_age = vm.config.fallback_state_max_age_ms;
            let vm = &mut *vm;
            let fresh = vm.states.fresh(now, max_age).map(|s| s.to_vec());
            let fallbacks = vm.config.fallback_endpoints;
            fresh.and_then(|states| {
                let refs: Vec<&EndpointState> = states.iter().map(|(_, s)| s).collect();
                let ranked = fallback::rank_composite(&refs, &mut vm.rng);
                let (&first, rest) = ranked.split_first()?;
                Some(Choice {
                    endpoint: states[first].0.clone(),
                    fallbacks: rest.iter().take(fallbacks).map(|&i| states[i].0.clone()).collect(),
                    source: RouteSource::Fallback,
                    predicted_ttft_ms: None,
                    predicted_tpot_ms: None,
                    state: Some(states[first].1.clone()),
                })
            })
        };
        self.route(choice, resume)
    }

    /// Sets (or clears) the destination, records the dispatch, continues the request.
    fn route(&mut self, choice: Option<Choice>, resume: bool) -> Action {
        let config = self.config();
        let source = choice.as_ref().map_or(RouteSource::Envoy, |c| c.source);
        if let Some(c) = &choice {
            let destination = std::iter::once(&c.endpoint).chain(&c.fallbacks).cloned().collect::<Vec<_>>().join(",");
            if host::set_header(MapType::HttpRequestHeaders, &config.destination_header, &destination).is_err() {
                host::log(Level::Warn, "headroom: could not set the destination header");
            }
            let mut vm = self.vm.borrow_mut();
            self.dispatch_seq = vm.outbox.dispatch(Dispatch {
                pool: config.pool.clone(),
                request_id: self.request_id.clone(),
                endpoint: c.endpoint.clone(),
                request: self.features.clone(),
                predicted_ttft_ms: c.predicted_ttft_ms,
            });
        }
        self.vm.borrow().stats.routed(source);
        self.choice = choice;
        self.forwarded_ns = host::now_ns();
        if resume {
            if host::resume_request().is_err() {
                host::log(Level::Warn, "headroom: could not resume the request");
            }
            Action::Pause
        } else {
            Action::Continue
        }
    }

    /// Handles the predictor's answer to the callout.
    /// `status`: the callout's `:status` (`None`: none or unreadable).
    fn on_predictions(&mut self, status: Option<u16>, body_size: usize) {
        match status {
            Some(200) => {}
            Some(504) => {
                self.fall_back(FallbackCause::Timeout, true);
                return;
            }
            _ => {
                self.fall_back(FallbackCause::Unavailable, true);
                return;
            }
        }
        let body = host::buffer(BufferType::HttpCallResponseBody, body_size).ok().flatten().unwrap_or_default();
        let answer: PredictResponse = match codec::decode(Format::MsgPack, &body) {
            Ok(a) => a,
            Err(_) => {
                self.fall_back(FallbackCause::BadAnswer, true);
                return;
            }
        };
        let mut answer = answer;
        // An address or state out of the contract's bounds: the answer is not to be trusted.
        let sane = answer.endpoints.iter().enumerate().all(|(i, e)| e.check(&format!("endpoints[{i}]")).is_ok());
        if answer.endpoints.is_empty() || !sane {
            self.fall_back(FallbackCause::BadAnswer, true);
            return;
        }
        // A prediction out of range (NaN, negative, beyond an hour) is read as "unknown".
        for e in &mut answer.endpoints {
            e.ttft_ms = limits::ms_or_none(e.ttft_ms);
            e.tpot_ms = limits::ms_or_none(e.tpot_ms);
        }
        let decision = {
            let mut vm = self.vm.borrow_mut();
            let states = answer.endpoints.iter().map(|e| (e.address.clone(), e.state.clone())).collect();
            vm.states.update(states, host::now_ms());
            let config = vm.config.clone();
            policy::decide(&self.features, &answer.endpoints, self.prediction_based, &config, &mut vm.rng)
        };
        match decision {
            policy::Decision::Route { ranked, source } => {
                let Some((e, rest)) =
                    ranked.split_first().and_then(|(&i, rest)| Some((answer.endpoints.get(i)?, rest)))
                else {
                    self.fall_back(FallbackCause::BadAnswer, true);
                    return;
                };
                let choice = Choice {
                    endpoint: e.address.clone(),
                    fallbacks: rest
                        .iter()
                        .filter_map(|&i| answer.endpoints.get(i))
                        .map(|f| f.address.clone())
                        .collect(),
                    source,
                    predicted_ttft_ms: e.ttft_ms,
                    predicted_tpot_ms: e.tpot_ms,
                    state: Some(e.state.clone()),
                };
                self.route(Some(choice), true);
            }
            policy::Decision::NoPrediction => {
                self.fall_back(FallbackCause::NoPredictions, true);
            }
            policy::Decision::Shed => {
                self.vm.borrow().stats.shed();
                self.routed = false;
                let config = self.config();
                let body = error_json(&config.priority_header, "sheddable request: no endpoint can meet its SLO now");
                let retry_after = config.shed_retry_after_s.to_string();
                let headers = [("content-type", "application/json"), ("retry-after", retry_after.as_str())];
                if host::send_response(429, &headers, &body).is_err() {
                    host::log(Level::Warn, "headroom: could not send 429");
                }
            }
        }
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, token_id: u32, _: usize, body_size: usize, _: usize) {
        let Some((token, started, cluster)) = self.callout.take() else { return };
        if token != token_id {
            return;
        }
        let status = host::header(MapType::HttpCallResponseHeaders, ":status").and_then(|s| s.parse::<u16>().ok());
        let mut vm = self.vm.borrow_mut();
        vm.record_call(&cluster, status);
        vm.stats.predictor_call(host::now_ns().saturating_sub(started) / 1_000_000);
        drop(vm);
        self.on_predictions(status, body_size);
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        let config = self.config();
        // A client never chooses its own endpoint.
        let _ = host::remove_header(MapType::HttpRequestHeaders, &config.destination_header);
        let method = host::header(MapType::HttpRequestHeaders, ":method").unwrap_or_default();
        self.path = host::header(MapType::HttpRequestHeaders, ":path").unwrap_or_default();
        if method != "POST" || !config.is_inference_path(&self.path) {
            return Action::Continue;
        }
        let parsed = hints::parse_hints(|name| host::header(MapType::HttpRequestHeaders, name), &config);
        for name in hints::hint_headers(&config.priority_header) {
            let _ = host::remove_header(MapType::HttpRequestHeaders, name);
        }
        let parsed = match parsed {
            Ok(h) => h,
            Err(e) => return self.reject(400, &e.header, &e.message),
        };
        self.features.slo = parsed.slo;
        self.features.priority = parsed.priority;
        self.prediction_based = parsed.prediction_based.unwrap_or(false);
        // Tracked by the filter's own id; the client's `x-request-id` stays a log field upstream.
        self.request_id = self.vm.borrow_mut().new_request_id();
        if !config.read_body {
            self.routed = true;
            self.features_from_headers();
            return self.start_callout();
        }
        if end_of_stream {
            return self.reject(400, "body", "an inference request needs a JSON body");
        }
        self.routed = true;
        // Hold the headers (and so the upstream choice) until the body is read.
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        // Header-only routing decided (or fell back) before the body.
        if !self.routed || self.choice.is_some() || !self.config().read_body {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.on_full_body(body_size)
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        if !self.routed {
            return Action::Continue;
        }
        let config = self.config();
        self.status = host::header(MapType::HttpResponseHeaders, ":status").and_then(|s| s.parse().ok()).unwrap_or(0);
        let streaming = host::header(MapType::HttpResponseHeaders, "content-type")
            .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("text/event-stream"));
        self.meter = Some(ResponseMeter::new(streaming, self.forwarded_ns, config.max_response_parse_bytes));
        if config.debug_headers {
            if let Some(c) = &self.choice {
                let _ = host::set_header(MapType::HttpResponseHeaders, DEBUG_ENDPOINT, &c.endpoint);
                let _ = host::set_header(MapType::HttpResponseHeaders, DEBUG_TIER, c.source.tier());
                if let Some(t) = c.predicted_ttft_ms {
                    let _ = host::set_header(MapType::HttpResponseHeaders, DEBUG_PREDICTED_TTFT, &format!("{t:.1}"));
                }
                if let Some(t) = c.predicted_tpot_ms {
                    let _ = host::set_header(MapType::HttpResponseHeaders, DEBUG_PREDICTED_TPOT, &format!("{t:.2}"));
                }
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _: bool) -> Action {
        if let Some(meter) = self.meter.as_mut() {
            if body_size > 0 {
                if let Ok(Some(chunk)) = host::buffer(BufferType::HttpResponseBody, body_size) {
                    meter.on_chunk(&chunk, host::now_ns());
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if !self.routed || self.forwarded_ns == 0 {
            return;
        }
        let now = host::now_ns();
        let measured = match self.meter.take() {
            Some(m) => m.finish(now),
            None => Measurement { e2e_ms: now.saturating_sub(self.forwarded_ns) as f64 / 1e6, ..Default::default() },
        };
        let served = host::property(&["upstream", "address"]).map(|b| String::from_utf8_lossy(&b).into_owned());
        let choice = self.choice.take();
        let mut vm = self.vm.borrow_mut();
        // Served elsewhere (a retry, or a chosen endpoint Envoy's cluster lacks): the
        // state and predictions of the chosen endpoint do not describe where it ran.
        let elsewhere = matches!((&served, &choice), (Some(s), Some(c)) if *s != c.endpoint);
        if elsewhere {
            vm.stats.served_elsewhere();
        }
        let chosen = choice.as_ref().filter(|_| !elsewhere);
        let endpoint = served.or_else(|| choice.as_ref().map(|c| c.endpoint.clone())).unwrap_or_default();
        let mut request = std::mem::take(&mut self.features);
        request.prefix_hashes = Vec::new();
        if self.status == 200 && request.streaming {
            let missed = |slo: Option<f64>, seen: Option<f64>| matches!((slo, seen), (Some(s), Some(v)) if v > s);
            vm.stats.slo_violations(
                missed(request.slo.ttft_ms, measured.ttft_ms),
                missed(request.slo.tpot_ms, measured.tpot_ms),
            );
        }
        let pool = vm.config.pool.clone();
        let seq = std::mem::take(&mut self.dispatch_seq);
        vm.outbox.report(
            seq,
            Observation {
                pool,
                request_id: std::mem::take(&mut self.request_id),
                endpoint,
                request,
                state_at_dispatch: chosen.and_then(|c| c.state.clone()),
                predicted_ttft_ms: chosen.and_then(|c| c.predicted_ttft_ms),
                predicted_tpot_ms: chosen.and_then(|c| c.predicted_tpot_ms),
                source: choice.as_ref().map_or(RouteSource::Envoy, |c| c.source),
                // Held to the contract's bounds (a stream open for over an hour).
                ttft_ms: limits::ms_or_none(measured.ttft_ms),
                tpot_ms: limits::ms_or_none(measured.tpot_ms),
                e2e_ms: measured.e2e_ms.clamp(0.0, limits::MAX_MS),
                output_tokens: measured.output_tokens,
                cached_tokens: measured.cached_tokens,
                status: self.status,
            },
        );
    }
}
