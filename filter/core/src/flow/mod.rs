//! One HTTP stream through the filter, callback by callback.
//!
//! headers: strip client routing headers, read SLO hints (400 when invalid), pause
//!          (with `read_body: false`: features from the headers, the callout starts here)
//! body:    parse the OpenAI body (400 when invalid), one predictor callout (with
//!          `flow_control`, the predictor may hold it until an endpoint has headroom)
//! callout: decide (route / shed 429 / fall back) against the TTFT SLO left after any
//!          wait, set the destination header, resume
//! response: measure TTFT/TPOT as the body streams past
//! log:     queue the report for the next flush
//!
//! Each callback takes the host and the VM's state and returns a [`Step`] for the
//! adapter to carry out; where the request is in its life is one `Phase`
//! (`phase.rs`), each callback acting on the phase it finds.

use std::time::Duration;

use headroom_protocol::headers::{
    DroppedReason, DEBUG_ENDPOINT, DEBUG_FLOW, DEBUG_PREDICTED_TPOT, DEBUG_PREDICTED_TTFT, DEBUG_QUEUED, DEBUG_TIER,
    DROPPED_REASON, PER_TRY_TIMEOUT,
};
use headroom_protocol::headroom::after_waiting;
use headroom_protocol::health::{Outcome, Recorded};
use headroom_protocol::meter::{Measurement, ResponseMeter};
use headroom_protocol::openai::PromptSize;
use headroom_protocol::{
    codec, limits, openai, paths, tokens, Abandoned, Dispatch, EndpointState, FirstToken, FlowAnswer, FlowOutcome,
    FlowTerms, Format, PredictRequest, PredictResponse, Report, RequestFeatures, RouteSource,
};

use crate::config::FilterConfig;
use crate::header_map::HeaderMap;
use crate::host::{callout_status, predictor_answer, Buffer, Event, FallbackCause, Host, Level, Map};
use crate::token_count::TokenCounts;
use crate::vm::Vm;
use crate::{error_json, fallback, headers as hints, policy};

mod phase;
pub(crate) use phase::{Asking, Phase};
use phase::{Callout, Choice, Forwarded};

/// How far a learned token estimate may be over the model's own count before the gateway
/// refuses a request for its context: a prompt near a server's limit goes to the server,
/// which knows the exact count.
pub const CONTEXT_MARGIN: f64 = 0.1;

/// What the adapter does after a callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Let the stream go on.
    Continue,
    /// Hold the stream (the body is still coming, or the callout is under way).
    Pause,
    /// Resume the request paused for the callout.
    Resume,
    /// Answer locally; the stream stays held.
    Reply { status: u32, headers: Vec<(&'static str, String)>, body: Vec<u8> },
}

/// The state of one stream.
#[derive(Debug, Default)]
pub struct Flow {
    phase: Phase,
    /// The filter's own id for this request (`Vm::new_request_id`).
    request_id: String,
    path: String,
    /// What the filter knows of the request, `prediction_based` (routed by its goals) included.
    features: RequestFeatures,
    /// Bytes of prompt text whose tokens were estimated (0: none, or given as token ids):
    /// with the response's `usage.prompt_tokens`, what the VM learns bytes per token from.
    prompt_bytes: usize,
    /// The predictor pool it is predicted, placed and reported in: `pool`, or the one
    /// `model_pools` maps its model to.
    pool: String,
    /// How it left the predictor's flow-control queue and after how long, when it waited there.
    queued: Option<(FlowOutcome, f64)>,
    /// Header-only routing: body bytes seen so far, and whether the body has ended.
    body_bytes: u64,
    body_ended: bool,
    /// The host's id of this stream's context: a coalesced call's answer is handed to it
    /// by id. `None`: its predict calls are its own.
    context: Option<u32>,
    /// The endpoints the gateway allows it (`Host::endpoint_subset`); `None`: any.
    subset: Option<Vec<String>>,
    /// Its longest prompt's tokens (the filter's estimate), what must fit a context; 0 when
    /// the body was not read (`input_tokens` then).
    longest_prompt_tokens: u32,
}

impl Flow {
    /// A stream whose predict calls are its own (never coalesced: no context id).
    pub fn new() -> Flow {
        Flow::default()
    }

    /// The stream of host context `context`: its predict call may be coalesced with others.
    pub fn for_context(context: u32) -> Flow {
        Flow { context: Some(context), ..Flow::default() }
    }

    /// Where the request is in its life (the transitions' tests read it).
    #[cfg(test)]
    pub(crate) fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The request's headers arrived.
    pub fn on_request_headers(&mut self, host: &mut dyn Host, vm: &mut Vm, end_of_stream: bool) -> Step {
        let config = vm.config.clone();
        // The map in one host call: a request carries few of the names asked for below.
        let headers = host.headers(Map::RequestHeaders);
        // A client never chooses its own endpoint.
        if headers.contains(&config.destination_header) {
            let _ = host.remove_header(Map::RequestHeaders, &config.destination_header);
        }
        let method = headers.get(":method").unwrap_or_default();
        self.path = headers.get(":path").unwrap_or_default().to_string();
        if method != "POST" || !config.is_inference_path(&self.path) {
            return Step::Continue;
        }
        let parsed = hints::parse_hints(|name| headers.get(name).map(str::to_string), &config);
        for name in hints::hint_headers(&config.priority_header) {
            if headers.contains(name) {
                let _ = host.remove_header(Map::RequestHeaders, name);
            }
        }
        let parsed = match parsed {
            Ok(h) => h,
            Err(e) => return self.reject(host, 400, &e.header, &e.message),
        };
        self.features.slo = parsed.slo;
        self.features.priority = parsed.priority;
        if parsed.priority_clamped {
            host.record(Event::PriorityClamped);
        }
        // SLO routing on SLO headers alone, as llm-d's router does: a client that states a
        // goal wants it met. `x-prediction-based-scheduling: false` still opts a request out,
        // and `true` opts in a request that states none (lowest predicted latency, tiers empty).
        self.features.prediction_based = parsed.prediction_based.unwrap_or(parsed.slo.is_set());
        // The tenant: flow control takes turns by it, and a running goal holds only its own
        // tenant's requests at its priority (`RequestFeatures::tenant`).
        if config.flow_control || self.features.prediction_based {
            match hints::parse_tenant(|name| headers.get(name).map(str::to_string), &config) {
                Ok(tenant) => self.features.tenant = tenant,
                Err(e) => return self.reject(host, 400, &e.header, &e.message),
            }
        }
        self.pool = config.pool.clone();
        self.subset = host.endpoint_subset();
        if self.subset.as_ref().is_some_and(Vec::is_empty) {
            return self.no_endpoints(host, "the gateway allows this request no endpoint (an empty subset hint)");
        }
        // Tracked by the filter's own id; the client's `x-request-id` stays a log field upstream.
        self.request_id = vm.new_request_id();
        if !config.read_body {
            self.body_ended = end_of_stream;
            self.features_from_headers(&headers, &vm.tokens, config.max_claimed_body_bytes);
            return self.start_callout(host, vm);
        }
        if end_of_stream {
            return self.reject(host, 400, "body", "an inference request needs a JSON body");
        }
        // Hold the headers (and so the upstream choice) until the body is read.
        self.phase = Phase::Reading;
        Step::Pause
    }

    /// Part of the request body arrived (`body_size`: all of it buffered so far).
    pub fn on_request_body(&mut self, host: &mut dyn Host, vm: &mut Vm, body_size: usize, end: bool) -> Step {
        // Header-only routing decided (or fell back) before the body: the body passes as it
        // comes (each call sees only its own chunk), and is counted.
        if !vm.config.read_body {
            if matches!(self.phase, Phase::Asking(_) | Phase::Forwarded(_)) {
                self.body_bytes += body_size as u64;
                self.body_ended |= end;
                if end {
                    self.release_dispatch(vm);
                }
            }
            return Step::Continue;
        }
        if !matches!(self.phase, Phase::Reading) {
            return Step::Continue;
        }
        if body_size > vm.config.max_body_bytes {
            let message = format!("the request body is over {} bytes (max_body_bytes)", vm.config.max_body_bytes);
            return self.reject(host, 413, "body", &message);
        }
        if !end {
            return Step::Pause;
        }
        let config = vm.config.clone();
        let Some(body) = host.buffer(Buffer::RequestBody, body_size) else {
            return self.reject(host, 400, "body", "an inference request needs a JSON body");
        };
        let parsed = match openai::parse_inference_body(&body, openai::Api::of_path(&self.path)) {
            Ok(p) => p,
            Err(e) => return self.reject(host, 400, &e.field, &e.message),
        };
        // Text is counted once, at the bytes per token learned for this model; token ids are
        // the model's own count. Both are held to the contract's bound rather than refused.
        // The longest prompt of a list, in the same count: it alone must fit a context.
        if let PromptSize::Bytes { total, .. } = parsed.prompt_size {
            self.prompt_bytes = usize::try_from(total).unwrap_or(usize::MAX);
        }
        let (input, longest) = parsed.prompt_size.tokens(|bytes| vm.tokens.estimate(Some(&parsed.model), bytes));
        self.features.input_tokens = input.min(limits::MAX_TOKENS);
        self.longest_prompt_tokens = longest.min(self.features.input_tokens);
        if parsed.sequences > config.max_sequences {
            let message = format!(
                "the request asks {} sequences (prompts times max(n, best_of)); this gateway runs at most {} \
                 (max_sequences)",
                parsed.sequences, config.max_sequences
            );
            return self.reject(host, 400, "n", &message);
        }
        self.features.sequences = parsed.sequences;
        if let Some(pool) = config.model_pools.get(&parsed.model) {
            self.pool = pool.clone();
        }
        self.features.model = parsed.model;
        self.features.prefix_hashes = tokens::prefix_block_hashes(&parsed.prompt_text, config.max_prefix_blocks);
        self.features.streaming = parsed.stream;
        self.features.max_tokens = parsed.max_tokens.map(|t| t.min(limits::MAX_TOKENS));
        // Anything else out of bounds (a 10 KB model name) is the client's to fix: a 400 here,
        // rather than a dispatch batch the predictor refuses with everyone else's in it.
        if let Err(e) = self.features.check("") {
            return self.reject(host, 400, &e.field, &e.message);
        }
        self.start_callout(host, vm)
    }

    /// The answer to the filter's call `token` arrived (`:status` in the callout headers).
    pub fn on_callout_answer(&mut self, host: &mut dyn Host, vm: &mut Vm, token: u32, body_size: usize) -> Step {
        let callout = match std::mem::take(&mut self.phase) {
            Phase::Asking(Asking::Call { callout, .. }) if callout.token == token => callout,
            other => {
                self.phase = other;
                return Step::Continue;
            }
        };
        let status = callout_status(host);
        vm.record_call(host, &callout.cluster, status);
        host.record(Event::PredictorCallMs(host.now_ns().saturating_sub(callout.started_ns) / 1_000_000));
        let answer = predictor_answer::<PredictResponse>(host, status, body_size);
        self.on_answer(host, vm, answer)
    }

    /// This request's share of a coalesced predict call (`Vm::on_predictions_answer`, or a
    /// failure to send or wait for it); ignored unless it is waiting for one.
    pub fn on_coalesced_answer(
        &mut self,
        host: &mut dyn Host,
        vm: &mut Vm,
        answer: Result<PredictResponse, FallbackCause>,
    ) -> Step {
        let since_ns = match std::mem::take(&mut self.phase) {
            Phase::Asking(Asking::Coalesced { since_ns }) => since_ns,
            other => {
                self.phase = other;
                return Step::Continue;
            }
        };
        host.record(Event::PredictorCallMs(host.now_ns().saturating_sub(since_ns) / 1_000_000));
        self.on_answer(host, vm, answer)
    }

    /// Decides on the predictor's answer for this request (or falls back without one).
    fn on_answer(&mut self, host: &mut dyn Host, vm: &mut Vm, answer: Result<PredictResponse, FallbackCause>) -> Step {
        let mut answer = match answer {
            Ok(answer) => answer,
            Err(cause) => return self.fall_back(host, vm, cause, true),
        };
        // An endpoint whose address or state breaks the contract's bounds is left out (the
        // predictor holds states to them, so this is a predictor of another version or a
        // bug); the rest of the answer stands. Nothing left: the answer is not to be trusted.
        answer.endpoints.retain(|e| e.check("").is_ok());
        if answer.endpoints.is_empty() {
            return self.fall_back(host, vm, FallbackCause::BadAnswer, true);
        }
        // A prediction out of range (NaN, negative, beyond an hour) is read as "unknown".
        for e in &mut answer.endpoints {
            e.ttft_ms = limits::ms_or_none(e.ttft_ms);
            e.tpot_ms = limits::ms_or_none(e.tpot_ms);
        }
        let states = answer.endpoints.iter().map(|e| (e.address.clone(), e.state.clone())).collect();
        vm.states.update(&self.pool, states, host.now_ms());
        // An endpoint failing requests is left out while ejected, however idle its metrics
        // make it look (unless every endpoint is).
        vm.health.keep_healthy(&mut answer.endpoints, |e| &e.address, host.now_ms());
        // Kept in the states above for the requests the gateway allows them.
        if let Some(subset) = &self.subset {
            answer.endpoints.retain(|e| subset.contains(&e.address));
            if answer.endpoints.is_empty() {
                let why = "none of the endpoints the gateway allows this request (its subset hint) is in the pool";
                return self.no_endpoints(host, why);
            }
        }
        let config = vm.config.clone();
        // Endpoints whose context the request cannot fit would answer 400 (vLLM refuses a
        // prompt and answer past its `max_model_len`): left out, and where none is left the
        // gateway says so itself rather than sending it.
        let need = self.context_needed(vm);
        let before = answer.endpoints.len();
        answer.endpoints.retain(|e| e.state.max_context_tokens.is_none_or(|c| need <= f64::from(c)));
        if answer.endpoints.is_empty() {
            let field = if self.features.max_tokens.is_some() { "max_tokens" } else { "prompt" };
            let message = format!(
                "the prompt (about {} tokens) and max_tokens ({}) exceed the context of every server of the \
                 pool ({before} servers)",
                self.features.input_tokens,
                self.features.max_tokens.unwrap_or(0)
            );
            return self.reject(host, 400, field, &message);
        }
        let flow = answer.flow.take().filter(|f| f.waited_ms.is_finite() && f.waited_ms >= 0.0);
        if let Some(flow) = &flow {
            host.record(Event::Flow { outcome: flow.outcome, waited_ms: flow.waited_ms as u64 });
            self.queued = (flow.outcome != FlowOutcome::Immediate).then_some((flow.outcome, flow.waited_ms));
            let gone = matches!(flow.outcome, FlowOutcome::Expired | FlowOutcome::Saturated);
            if gone && self.features.is_sheddable() {
                let why = "sheddable request: the fleet has no room for it within its SLO";
                return self.shed(host, &config, Some(flow.clone()), why);
            }
        }
        // Judged against what is left of the TTFT SLO after waiting in the flow queue.
        let judged = after_waiting(&self.features, flow.as_ref().map_or(0.0, |f| f.waited_ms));
        match policy::decide(
            &judged,
            &answer.endpoints,
            self.features.prediction_based,
            flow.as_ref(),
            &config,
            &mut vm.rng,
        ) {
            policy::Decision::Route { ranked, source } => {
                let mut chosen = ranked.iter().filter_map(|&i| answer.endpoints.get(i));
                let Some(e) = chosen.next() else {
                    return self.fall_back(host, vm, FallbackCause::BadAnswer, true);
                };
                let choice = Choice {
                    endpoint: e.address.clone(),
                    fallbacks: chosen.map(|f| f.address.clone()).collect(),
                    source,
                    predicted_ttft_ms: e.ttft_ms,
                    predicted_tpot_ms: e.tpot_ms,
                };
                self.route(host, vm, Some(choice), true)
            }
            policy::Decision::NoPrediction => self.fall_back(host, vm, FallbackCause::NoPredictions, true),
            policy::Decision::Shed => {
                self.shed(host, &config, flow, "sheddable request: no endpoint can meet its SLO now")
            }
        }
    }

    /// Answers a sheddable request `429` with `retry-after` and why it was dropped
    /// ([`headers::DROPPED_REASON`]: expired in the queue, else no room). After flow control's answer
    /// `flow`, with debug headers, the reply says how the request left the queue
    /// (`x-headroom-flow`: `saturated` at admission, `expired` after waiting, or
    /// `immediate`/`released` when the tiers shed it after) and how long it waited, so a
    /// benchmark's per-request log can tell admission from expiry.
    fn shed(&mut self, host: &mut dyn Host, config: &FilterConfig, flow: Option<FlowAnswer>, why: &str) -> Step {
        host.record(Event::Shed);
        self.phase = Phase::Answered;
        let mut headers = vec![
            ("content-type", "application/json".to_string()),
            ("retry-after", config.shed_retry_after_s.to_string()),
        ];
        let reason = match flow.as_ref().map(|f| f.outcome) {
            Some(FlowOutcome::Expired) => DroppedReason::TtlExpired,
            _ => DroppedReason::Saturated,
        };
        headers.push((DROPPED_REASON, reason.name().to_string()));
        if let Some(flow) = flow.filter(|_| config.debug_headers) {
            headers.push((DEBUG_FLOW, flow.outcome.name().to_string()));
            headers.push((DEBUG_QUEUED, format!("{:.0}", flow.waited_ms)));
        }
        Step::Reply { status: 429, headers, body: error_json(&config.priority_header, why) }
    }

    /// The response's headers arrived.
    pub fn on_response_headers(&mut self, host: &mut dyn Host, vm: &Vm) -> Step {
        let Phase::Forwarded(f) = &mut self.phase else { return Step::Continue };
        let config = &vm.config;
        let headers = host.headers(Map::ResponseHeaders);
        f.status = headers.get(":status").and_then(|s| s.parse().ok()).unwrap_or(0);
        let streaming =
            headers.get("content-type").is_some_and(|ct| ct.to_ascii_lowercase().starts_with("text/event-stream"));
        f.meter = Some(ResponseMeter::new(streaming, f.at_ns, config.max_response_parse_bytes));
        if let Some(c) = f.choice.as_ref().filter(|_| config.debug_headers) {
            let _ = host.set_header(Map::ResponseHeaders, DEBUG_ENDPOINT, &c.endpoint);
            let _ = host.set_header(Map::ResponseHeaders, DEBUG_TIER, c.source.tier());
            if let Some(t) = c.predicted_ttft_ms {
                let _ = host.set_header(Map::ResponseHeaders, DEBUG_PREDICTED_TTFT, &format!("{t:.1}"));
            }
            if let Some(t) = c.predicted_tpot_ms {
                let _ = host.set_header(Map::ResponseHeaders, DEBUG_PREDICTED_TPOT, &format!("{t:.2}"));
            }
            if let Some((outcome, ms)) = self.queued {
                let _ = host.set_header(Map::ResponseHeaders, DEBUG_QUEUED, &format!("{ms:.0}"));
                let _ = host.set_header(Map::ResponseHeaders, DEBUG_FLOW, outcome.name());
            }
        }
        Step::Continue
    }

    /// A chunk of the response body passed (`body_size`: its length).
    pub fn on_response_body(&mut self, host: &mut dyn Host, vm: &mut Vm, body_size: usize) -> Step {
        if let Phase::Forwarded(f) = &mut self.phase {
            if let Some(meter) = f.meter.as_mut().filter(|_| body_size > 0) {
                if let Some(chunk) = host.buffer(Buffer::ResponseBody, body_size) {
                    meter.on_chunk(&chunk, host.now_ns());
                }
            }
        }
        self.queue_first_token(host, vm);
        Step::Continue
    }

    /// Queues the first-token event once the first token passed, for a request the
    /// predictor saw dispatched, served where it was dispatched.
    fn queue_first_token(&mut self, host: &dyn Host, vm: &mut Vm) {
        self.release_dispatch(vm);
        let Phase::Forwarded(f) = &mut self.phase else { return };
        if f.first_token_queued || f.dispatch_seq == 0 || !vm.config.first_token_events {
            return;
        }
        let Some(ttft_ms) = f.meter.as_ref().and_then(ResponseMeter::ttft_ms) else { return };
        let served = f.served(host);
        let Some(choice) = &f.choice else { return };
        f.first_token_queued = true;
        if served.is_some_and(|served| served != choice.endpoint) {
            return; // served elsewhere: the dispatch's endpoint is not where it runs
        }
        let event = FirstToken {
            pool: self.pool.clone(),
            request_id: self.request_id.clone(),
            endpoint: choice.endpoint.clone(),
            ttft_ms: ttft_ms.clamp(0.0, limits::MAX_MS),
        };
        vm.outbox.first_token(f.dispatch_seq, event);
    }

    /// The stream is done: what was measured goes to the outbox as a report.
    pub fn on_log(&mut self, host: &mut dyn Host, vm: &mut Vm) {
        self.release_dispatch(vm);
        match std::mem::take(&mut self.phase) {
            // Ended while waiting for a coalesced call: it leaves the batch still to be sent.
            Phase::Asking(Asking::Coalesced { .. }) => {
                if let Some(context) = self.context {
                    vm.predictions.forget(context);
                }
            }
            // Ended while the predictor held it in its queue: Envoy does not cancel the call,
            // so the predictor is told, or the request would keep its place until its deadline.
            Phase::Asking(Asking::Call { callout, offered_wait: true }) => {
                let request_id = std::mem::take(&mut self.request_id);
                vm.outbox.abandoned(Abandoned { pool: std::mem::take(&mut self.pool), request_id }, &callout.cluster);
            }
            Phase::Forwarded(f) => self.report(host, vm, *f),
            Phase::Passing | Phase::Answered | Phase::Reading | Phase::Asking(Asking::Call { .. }) => {}
        }
    }

    /// Reports a forwarded request `f`: what the gateway measured, and where.
    fn report(&mut self, host: &mut dyn Host, vm: &mut Vm, mut f: Forwarded) {
        if let Some(c) = &f.choice {
            vm.placed.ended(&c.endpoint);
        }
        let now = host.now_ns();
        let measured = match f.meter.take() {
            Some(m) => m.finish(now),
            None => Measurement { e2e_ms: now.saturating_sub(f.at_ns) as f64 / 1e6, ..Default::default() },
        };
        if let Some(tokens) = measured.prompt_tokens.filter(|_| f.status == 200 && self.prompt_bytes > 0) {
            vm.tokens.learn(&self.features.model, self.prompt_bytes, tokens);
        }
        // A 200 cut off before its end (the server died mid-stream) is reported as status 0:
        // tracking ends, nothing is learnt from it.
        if f.status == 200 && !measured.complete {
            host.record(Event::CutOff);
            f.status = 0;
        }
        let served = f.served(host);
        let choice = f.choice.take();
        // Served elsewhere (a retry, or a chosen endpoint Envoy's cluster lacks): the
        // state and predictions of the chosen endpoint do not describe where it ran.
        let elsewhere = matches!((&served, &choice), (Some(s), Some(c)) if *s != c.endpoint);
        if elsewhere {
            host.record(Event::ServedElsewhere);
        }
        let failed_at = choice.as_ref().filter(|_| elsewhere).map(|c| c.endpoint.clone());
        let endpoint = served.or_else(|| choice.as_ref().map(|c| c.endpoint.clone())).unwrap_or_default();
        judge_health(host, vm, failed_at.as_deref(), &endpoint, f.status);
        let request = std::mem::take(&mut self.features);
        if f.status == 200 && request.streaming {
            let [ttft, tpot] = request.slo.met(measured.ttft_ms, measured.tpot_ms).map(|met| met == Some(false));
            if ttft || tpot {
                host.record(Event::SloViolation { ttft, tpot });
            }
        }
        // Only what the gateway measured, and where: the predictor has the rest in its record.
        let report = Report {
            pool: std::mem::take(&mut self.pool),
            request_id: std::mem::take(&mut self.request_id),
            endpoint,
            source: choice.as_ref().map_or(RouteSource::Envoy, |c| c.source),
            // Held to the contract's bounds (a stream open for over an hour).
            ttft_ms: limits::ms_or_none(measured.ttft_ms),
            tpot_ms: limits::ms_or_none(measured.tpot_ms),
            e2e_ms: measured.e2e_ms.clamp(0.0, limits::MAX_MS),
            output_tokens: measured.output_tokens,
            cached_tokens: measured.cached_tokens,
            status: f.status,
            failed_at,
        };
        vm.outbox.report(f.dispatch_seq, report);
    }

    /// The context the request needs, in its model's tokens, as the gateway may judge it: the
    /// prompt's estimate (with [`CONTEXT_MARGIN`] of doubt while it comes from learned bytes
    /// per token; none for a prompt of token ids) plus the answer's `max_tokens`. Before any
    /// answer taught the VM this model's count, nothing is judged (0): the approximation can
    /// be off by 2x either way.
    fn context_needed(&self, vm: &Vm) -> f64 {
        let longest =
            if self.longest_prompt_tokens > 0 { self.longest_prompt_tokens } else { self.features.input_tokens };
        let prompt = f64::from(longest);
        let answer = f64::from(self.features.max_tokens.unwrap_or(0));
        if self.prompt_bytes == 0 && self.features.input_tokens > 0 && vm.config.read_body {
            return prompt + answer; // token ids: exact
        }
        match vm.tokens.ratio(Some(&self.features.model)) {
            (_, 0) => 0.0,
            _ => prompt / (1.0 + CONTEXT_MARGIN) + answer,
        }
    }

    /// Answers `503`: none of the endpoints the gateway allows this request is known
    /// (llm-d's `rejected-no-endpoints`).
    fn no_endpoints(&mut self, host: &mut dyn Host, why: &str) -> Step {
        host.record(Event::NoEndpoints);
        self.phase = Phase::Answered;
        let headers = vec![
            ("content-type", "application/json".to_string()),
            (DROPPED_REASON, DroppedReason::NoEndpoints.name().to_string()),
        ];
        Step::Reply { status: 503, headers, body: crate::error_message_json(why) }
    }

    /// Answers locally with a JSON error naming `field`.
    fn reject(&mut self, host: &mut dyn Host, status: u32, field: &str, message: &str) -> Step {
        host.record(Event::BadRequest);
        self.phase = Phase::Answered;
        Step::Reply {
            status,
            headers: vec![("content-type", "application/json".to_string())],
            body: error_json(field, message),
        }
    }

    /// Header-only routing: the input size estimated from `content-length` at the pool's
    /// learned bytes per token (no model is known before the body), a claim held to
    /// `max_claimed` bytes; streaming assumed when a TPOT SLO is given (it only means
    /// something for a stream).
    fn features_from_headers(&mut self, headers: &HeaderMap, counts: &TokenCounts, max_claimed: u64) {
        let bytes = headers.get("content-length").and_then(|v| v.trim().parse::<u64>().ok());
        self.features.input_tokens = bytes.map_or(0, |b| counts.estimate(None, b.min(max_claimed)));
        self.features.streaming = self.features.slo.tpot_ms.is_some();
    }

    /// Header-only routing: queues the held dispatch, its prompt what the body that passed
    /// carries (at most the claim). Called when the body ends, and at the latest before the
    /// request's first token or report, which wait for their dispatch.
    fn release_dispatch(&mut self, vm: &mut Vm) {
        let Phase::Forwarded(f) = &mut self.phase else { return };
        let Some((mut dispatch, home)) = f.held_dispatch.take() else { return };
        if !vm.config.read_body {
            let seen = vm.tokens.estimate(None, self.body_bytes);
            self.features.input_tokens = self.features.input_tokens.min(seen);
            dispatch.request.input_tokens = self.features.input_tokens;
        }
        f.dispatch_seq = vm.outbox.dispatch(dispatch, &home);
    }

    /// Sends the one predictor call; the answer arrives in [`Flow::on_callout_answer`].
    fn start_callout(&mut self, host: &mut dyn Host, vm: &mut Vm) -> Step {
        let config = &vm.config;
        // Only a request routed by its SLOs can wait for headroom: others have none to judge.
        // Nor while the predictor answers nothing (`vm::SILENT_MS`): a call that may wait gets
        // a budget of `flow_max_wait_ms`, and a frozen predictor would hold it that long.
        let mut may_wait = config.flow_control && self.features.prediction_based && self.features.slo.is_set();
        if may_wait && vm.predictor_silent(host.now_ms()) {
            host.record(Event::FlowWithheld);
            may_wait = false;
        }
        let flow = may_wait.then(|| FlowTerms {
            max_wait_ms: config.flow_max_wait_ms,
            tpot_buffer: config.tpot_buffer,
            ttft_buffer: config.ttft_buffer,
            dispatch_horizon_ms: config.flow_dispatch_horizon_ms,
            fairness_id: String::new(),
        });
        let mut timeout = Duration::from_millis(config.predictor_timeout_ms);
        if let Some(f) = &flow {
            timeout += Duration::from_millis(f.max_wait_ms);
        }
        let predict = PredictRequest {
            pool: self.pool.clone(),
            request_id: self.request_id.clone(),
            request: self.features.clone(),
            flow,
        };
        // Answered at once: it may share a call with the requests around it.
        let coalesce = self.context.filter(|_| predict.flow.is_none() && config.batch_predictions);
        let predict = if let Some(context) = coalesce {
            match vm.predictions.join(host, context, predict) {
                Ok(()) => {
                    self.phase = Phase::Asking(Asking::Coalesced { since_ns: host.now_ns() });
                    return Step::Pause;
                }
                Err(predict) => *predict,
            }
        } else {
            predict
        };
        let offered_wait = predict.flow.is_some();
        let Ok(bytes) = codec::encode(Format::MsgPack, &predict) else {
            return self.fall_back(host, vm, FallbackCause::CallFailed, false);
        };
        let cluster = vm.predictor_cluster(host.now_ms());
        match host.http_call(&cluster, &vm.call_headers(paths::PREDICT), &bytes, timeout) {
            Ok(token) => {
                vm.asked(host.now_ms());
                let callout = Callout { token, started_ns: host.now_ns(), cluster };
                self.phase = Phase::Asking(Asking::Call { callout, offered_wait });
                Step::Pause
            }
            Err(_) => {
                vm.record_call(host, &cluster, None);
                self.fall_back(host, vm, FallbackCause::CallFailed, false)
            }
        }
    }

    /// Routes without predictions: the composite over the last fresh endpoint states,
    /// or Envoy's own balancing when there are none. `paused`: inside the callout.
    fn fall_back(&mut self, host: &mut dyn Host, vm: &mut Vm, cause: FallbackCause, paused: bool) -> Step {
        host.record(Event::Fallback(cause));
        let max_age = vm.config.fallback_state_max_age_ms;
        let subset = self.subset.as_deref();
        let choice = vm.states.fresh(&self.pool, host.now_ms(), max_age).and_then(|states| {
            let mut states: Vec<&(String, EndpointState)> =
                states.iter().filter(|(e, _)| subset.is_none_or(|allowed| allowed.contains(e))).collect();
            vm.health.keep_healthy(&mut states, |(e, _)| e, host.now_ms());
            // A cached state's prefix match is that of the request it was predicted for, not
            // this one's: left out.
            let now: Vec<EndpointState> =
                states.iter().map(|(_, s)| EndpointState { prefix_match: 0.0, ..s.clone() }).collect();
            let refs: Vec<&EndpointState> = now.iter().collect();
            // The states stop moving with the predictor gone; what this VM placed since
            // keeps the ranking live, so its requests do not all go to one endpoint.
            let placed: Vec<u32> = states.iter().map(|(e, _)| vm.placed.at(e)).collect();
            let ranked = fallback::rank_composite(&refs, &placed, &mut vm.rng);
            let mut chosen = ranked.iter().filter_map(|&i| states.get(i));
            let (endpoint, _) = chosen.next()?;
            Some(Choice {
                endpoint: endpoint.clone(),
                fallbacks: chosen.take(vm.config.fallback_endpoints).map(|(e, _)| e.clone()).collect(),
                source: RouteSource::Fallback,
                predicted_ttft_ms: None,
                predicted_tpot_ms: None,
            })
        });
        // Nothing fresh is known of the endpoints the gateway allows: one of them at random
        // (its list in turn after it), since Envoy's own balancing would not keep to them.
        let choice = choice.or_else(|| {
            let allowed = subset.filter(|a| !a.is_empty())?;
            let first = (vm.rng.next_u64() % allowed.len() as u64) as usize;
            let mut order = (0..allowed.len()).map(|k| allowed[(first + k) % allowed.len()].clone());
            Some(Choice {
                endpoint: order.next()?,
                fallbacks: order.take(vm.config.fallback_endpoints).collect(),
                source: RouteSource::Fallback,
                predicted_ttft_ms: None,
                predicted_tpot_ms: None,
            })
        });
        self.route(host, vm, choice, paused)
    }

    /// Sets the destination (none: Envoy balances), records the dispatch, continues.
    fn route(&mut self, host: &mut dyn Host, vm: &mut Vm, choice: Option<Choice>, paused: bool) -> Step {
        let source = choice.as_ref().map_or(RouteSource::Envoy, |c| c.source);
        let mut held_dispatch = None;
        if let Some(c) = &choice {
            let destination = std::iter::once(&c.endpoint).chain(&c.fallbacks).cloned().collect::<Vec<_>>().join(",");
            if host.set_header(Map::RequestHeaders, &vm.config.destination_header, &destination).is_err() {
                host.log(Level::Warn, "headroom: could not set the destination header");
            }
            vm.placed.started(&c.endpoint);
            // On probation, this is its one probe (`PassiveHealth::sent`).
            vm.health.sent(&c.endpoint, host.now_ms());
            // The dispatch names the request and where it went; the features go along when
            // the filter placed it without the predictor's answer (its fallback), which the
            // predictor may hold no record of.
            let dispatch = Dispatch {
                pool: self.pool.clone(),
                request_id: self.request_id.clone(),
                endpoint: c.endpoint.clone(),
                request: match c.source {
                    RouteSource::Fallback => self.features.clone(),
                    _ => RequestFeatures::default(),
                },
            };
            held_dispatch = Some((dispatch, vm.predictor_cluster(host.now_ms())));
        }
        if let Some(ms) = try_timeout_ms(&self.features, &vm.config) {
            if host.set_header(Map::RequestHeaders, PER_TRY_TIMEOUT, &ms.to_string()).is_err() {
                host.log(Level::Warn, "headroom: could not set the per-try timeout header");
            }
        }
        host.record(Event::Routed(source));
        let forwarded = Forwarded { choice, at_ns: host.now_ns(), held_dispatch, ..Forwarded::default() };
        self.phase = Phase::Forwarded(Box::new(forwarded));
        // Read from the body, or header-only with the body already through: as it is.
        if vm.config.read_body || self.body_ended {
            self.release_dispatch(vm);
        }
        if paused {
            Step::Resume
        } else {
            Step::Continue
        }
    }
}

/// Files what a request's endpoints did in the VM's passive health: the chosen one failed
/// when Envoy served the request elsewhere (`failed_at`: it retried a connect failure, a
/// reset or a 5xx there), and the endpoint that answered by its `status`.
fn judge_health(host: &mut dyn Host, vm: &mut Vm, failed_at: Option<&str>, endpoint: &str, status: u16) {
    let now = host.now_ms();
    for (at, outcome) in Outcome::of_request(failed_at, endpoint, status) {
        let recorded = vm.health.record(at, outcome, now);
        if outcome == Outcome::Failure {
            host.record(Event::EndpointFailed { ejected: recorded != Recorded::Nothing });
            if let Recorded::Ejected(ms) = recorded {
                host.log(Level::Warn, &format!("headroom: endpoint {at} ejected for {ms} ms after failing requests"));
            }
        }
    }
}

/// How long one try may wait for its response to begin (ms), from the request's goals
/// (`try_timeout_slo_factor`): a stream's headers come as it starts, so its TTFT goal; a
/// whole answer's come at its end, so its TTFT plus `max_tokens` TPOTs. `None` when the
/// goals do not bound it (no TTFT goal; a whole answer without `max_tokens` or a TPOT goal)
/// or the factor is 0: the route's own timeouts apply.
pub(crate) fn try_timeout_ms(request: &RequestFeatures, config: &FilterConfig) -> Option<u64> {
    if config.try_timeout_slo_factor <= 0.0 {
        return None;
    }
    let ttft = request.slo.ttft_ms?;
    let begins = if request.streaming { ttft } else { ttft + f64::from(request.max_tokens?) * request.slo.tpot_ms? };
    let ms = (begins * config.try_timeout_slo_factor).max(config.try_timeout_min_ms as f64);
    // Checked goals are finite and bounded; the cast saturates in any case.
    Some(ms.min(limits::MAX_MS).round() as u64)
}
