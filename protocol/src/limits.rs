//! Bounds on every value that crosses the filter <-> predictor contract, and
//! the checks both sides run against them.
//!
//! One definition for both peers: the predictor refuses a message that breaks a
//! bound with a `400` naming the field (`Invalid::field`), and the filter uses
//! the same checks on the predictor's answers, treating an out-of-range
//! prediction as missing. Without bounds, one `1e300` turned into a `Duration`
//! panics, one 10 MB request id sits in four maps, and one `1e-9` TPOT SLO makes
//! every other request on its endpoint look hopeless. `docs/reliability.md`
//! lists them with the reasons for each number.

use crate::messages::{
    Abandoned, Dispatch, DispatchBatch, EndpointPrediction, EndpointState, FirstToken, FlowTerms, PredictBatch,
    PredictRequest, Report, ReportBatch, RequestFeatures, Slo,
};

/// Largest latency, SLO or prediction accepted, in milliseconds (one hour): no
/// inference request is meant to take longer, and every duration built from
/// such a number fits an `Instant` with room to spare.
pub const MAX_MS: f64 = 3_600_000.0;
/// Largest token count accepted (prompt or `max_tokens`): far beyond any
/// context window served today, small enough that sums of thousands stay exact.
pub const MAX_TOKENS: u32 = 1 << 24;
/// Most sequences one request may ask (prompts times `max(n, best_of)`) on the wire; the
/// filter's `max_sequences` refuses fewer.
pub const MAX_SEQUENCES: u32 = 1 << 16;
/// Longest pool, model or endpoint name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest request id, in bytes (the filter's own are under 40).
pub const MAX_REQUEST_ID_BYTES: usize = 128;
/// Most prefix block hashes per request (the filter hashes at most
/// `max_prefix_blocks`, 256 by default).
pub const MAX_PREFIX_HASHES: usize = 4096;
/// Most items in one dispatch or report batch.
pub const MAX_BATCH_ITEMS: usize = 10_000;
/// Largest request body the predictor reads. The filter splits its batches to
/// stay under it (`max_batch_bytes`, a quarter of this by default).
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// Most observations one `GET /v1/observations` answer holds (`limit`); more are read in
/// pages (`after`), so the log's lock, which every report takes, is held for a page's copy.
pub const MAX_OBSERVATIONS_PAGE: usize = 1000;

/// Bounds of the filter's `tpot_buffer` and `ttft_buffer` (factors on SLOs), sent with flow terms.
pub const MIN_SLO_BUFFER: f64 = 0.1;
pub const MAX_SLO_BUFFER: f64 = 10.0;

/// A value out of its bound: the field's path and what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for Invalid {}

fn invalid(at: &str, name: &str, message: impl Into<String>) -> Invalid {
    Invalid { field: join(at, name), message: message.into() }
}

/// `name` under `at` (`at.name`, or `name` at the top).
fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_string()
    } else {
        format!("{at}.{name}")
    }
}

/// True for a duration in milliseconds within `0..=MAX_MS`.
pub fn is_ms(v: f64) -> bool {
    v.is_finite() && (0.0..=MAX_MS).contains(&v)
}

/// `v` when it is a usable duration in milliseconds, else `None`: how a
/// prediction out of range is treated (missing, not an error).
pub fn ms_or_none(v: Option<f64>) -> Option<f64> {
    v.filter(|&x| is_ms(x))
}

fn ms(at: &str, name: &str, v: f64) -> Result<(), Invalid> {
    if is_ms(v) {
        Ok(())
    } else {
        Err(invalid(at, name, format!("must be a number of milliseconds within 0..={MAX_MS}, got {v}")))
    }
}

fn opt_ms(at: &str, name: &str, v: Option<f64>) -> Result<(), Invalid> {
    v.map_or(Ok(()), |v| ms(at, name, v))
}

/// An SLO: above zero (a zero goal can never be met) and at most `MAX_MS`.
fn slo_ms(at: &str, name: &str, v: Option<f64>) -> Result<(), Invalid> {
    match v {
        Some(v) if !(is_ms(v) && v > 0.0) => {
            Err(invalid(at, name, format!("must be a number of milliseconds > 0 and <= {MAX_MS}, got {v}")))
        }
        _ => Ok(()),
    }
}

fn unit(at: &str, name: &str, v: f64) -> Result<(), Invalid> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(at, name, format!("must be within 0..=1, got {v}")))
    }
}

fn text(at: &str, name: &str, v: &str, max: usize, required: bool) -> Result<(), Invalid> {
    if required && v.is_empty() {
        return Err(invalid(at, name, "must not be empty"));
    }
    if v.len() > max {
        return Err(invalid(at, name, format!("must be at most {max} bytes, got {}", v.len())));
    }
    Ok(())
}

fn tokens(at: &str, name: &str, v: Option<u32>) -> Result<(), Invalid> {
    match v {
        Some(v) if v > MAX_TOKENS => Err(invalid(at, name, format!("must be at most {MAX_TOKENS}, got {v}"))),
        _ => Ok(()),
    }
}

fn items(name: &str, n: usize) -> Result<(), Invalid> {
    if n > MAX_BATCH_ITEMS {
        return Err(invalid("", name, format!("at most {MAX_BATCH_ITEMS} items per batch, got {n}")));
    }
    Ok(())
}

impl Slo {
    /// Both goals, when stated, within `(0, MAX_MS]`.
    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        let at = if at.is_empty() { "slo".to_string() } else { format!("{at}.slo") };
        slo_ms(&at, "ttft_ms", self.ttft_ms)?;
        slo_ms(&at, "tpot_ms", self.tpot_ms)
    }
}

impl RequestFeatures {
    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        text(at, "model", &self.model, MAX_NAME_BYTES, false)?;
        text(at, "tenant", &self.tenant, MAX_NAME_BYTES, false)?;
        tokens(at, "input_tokens", Some(self.input_tokens))?;
        tokens(at, "max_tokens", self.max_tokens)?;
        if self.sequences > MAX_SEQUENCES {
            return Err(invalid(at, "sequences", format!("at most {MAX_SEQUENCES}, got {}", self.sequences)));
        }
        if self.prefix_hashes.len() > MAX_PREFIX_HASHES {
            let n = self.prefix_hashes.len();
            return Err(invalid(at, "prefix_hashes", format!("at most {MAX_PREFIX_HASHES} hashes, got {n}")));
        }
        self.slo.check(at)
    }
}

impl EndpointState {
    /// The state held to the bounds [`EndpointState::check`] enforces: shares into 0..=1
    /// (NaN: 0), a duration out of range unknown, a context or rate over its bound at the
    /// bound. What the predictor answers with, so one endpoint's odd reading never costs a
    /// filter the whole answer.
    pub fn bounded(mut self) -> EndpointState {
        let share = |x: f64| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
        self.kv_usage = share(self.kv_usage);
        self.prefix_match = share(self.prefix_match);
        self.tightest_tpot_slo_ms = self.tightest_tpot_slo_ms.filter(|&v| is_ms(v) && v > 0.0);
        self.recent_tpot_ms = ms_or_none(self.recent_tpot_ms);
        self.prefill_ms_per_token = ms_or_none(self.prefill_ms_per_token);
        self.max_context_tokens = self.max_context_tokens.map(|t| t.min(MAX_TOKENS));
        let rate = self.prefill_tokens_per_s;
        self.prefill_tokens_per_s = if rate.is_nan() { 0.0 } else { rate.clamp(0.0, MAX_TOKENS as f64 * 1000.0) };
        self
    }

    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        unit(at, "kv_usage", self.kv_usage)?;
        unit(at, "prefix_match", self.prefix_match)?;
        slo_ms(at, "tightest_tpot_slo_ms", self.tightest_tpot_slo_ms)?;
        opt_ms(at, "recent_tpot_ms", self.recent_tpot_ms)?;
        opt_ms(at, "prefill_ms_per_token", self.prefill_ms_per_token)?;
        tokens(at, "max_context_tokens", self.max_context_tokens)?;
        let rate = self.prefill_tokens_per_s;
        if !(rate.is_finite() && (0.0..=MAX_TOKENS as f64 * 1000.0).contains(&rate)) {
            return Err(invalid(
                at,
                "prefill_tokens_per_s",
                format!("must be within 0..={}, got {rate}", MAX_TOKENS as f64 * 1000.0),
            ));
        }
        Ok(())
    }
}

impl EndpointPrediction {
    /// The address and state; predictions are not judged here (see [`ms_or_none`]).
    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        text(at, "address", &self.address, MAX_NAME_BYTES, true)?;
        self.state.check(&format!("{at}.state"))
    }
}

impl PredictRequest {
    pub fn check(&self) -> Result<(), Invalid> {
        self.check_at("")
    }

    /// The same, naming fields under `at` (`requests[3]` in a batch).
    pub fn check_at(&self, at: &str) -> Result<(), Invalid> {
        text(at, "pool", &self.pool, MAX_NAME_BYTES, true)?;
        text(at, "request_id", &self.request_id, MAX_REQUEST_ID_BYTES, false)?;
        self.request.check(&join(at, "request"))?;
        self.flow.as_ref().map_or(Ok(()), |f| f.check(&join(at, "flow")))
    }
}

impl PredictBatch {
    /// Every request, and none offering to wait (a batch is answered at once); what rides
    /// along as in its own batch, so a refused call applies nothing.
    pub fn check(&self) -> Result<(), Invalid> {
        items("requests", self.requests.len())?;
        items("dispatches", self.dispatches.len())?;
        self.dispatches.iter().enumerate().try_for_each(|(i, d)| d.check(&format!("dispatches[{i}]")))?;
        if let Some(reports) = &self.reports {
            reports.check().map_err(|e| Invalid { field: join("reports", &e.field), message: e.message })?;
        }
        self.requests.iter().enumerate().try_for_each(|(i, r)| {
            let at = format!("requests[{i}]");
            r.check_at(&at)?;
            match r.flow {
                Some(_) => Err(invalid(
                    &at,
                    "flow",
                    "a batch is answered at once: a request that may wait goes alone to /v1/predict",
                )),
                None => Ok(()),
            }
        })
    }
}

impl Abandoned {
    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        text(at, "pool", &self.pool, MAX_NAME_BYTES, true)?;
        text(at, "request_id", &self.request_id, MAX_REQUEST_ID_BYTES, true)
    }
}

impl FlowTerms {
    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        ms(at, "max_wait_ms", self.max_wait_ms as f64)?;
        ms(at, "dispatch_horizon_ms", self.dispatch_horizon_ms as f64)?;
        for (name, b) in [("tpot_buffer", self.tpot_buffer), ("ttft_buffer", self.ttft_buffer)] {
            if !(b.is_finite() && (MIN_SLO_BUFFER..=MAX_SLO_BUFFER).contains(&b)) {
                let message = format!("must be within {MIN_SLO_BUFFER}..={MAX_SLO_BUFFER}, got {b}");
                return Err(invalid(at, name, message));
            }
        }
        text(at, "fairness_id", &self.fairness_id, MAX_NAME_BYTES, false)
    }
}

impl Dispatch {
    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        text(at, "pool", &self.pool, MAX_NAME_BYTES, true)?;
        text(at, "request_id", &self.request_id, MAX_REQUEST_ID_BYTES, true)?;
        text(at, "endpoint", &self.endpoint, MAX_NAME_BYTES, true)?;
        self.request.check(&format!("{at}.request"))
    }
}

impl Report {
    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        text(at, "pool", &self.pool, MAX_NAME_BYTES, true)?;
        text(at, "request_id", &self.request_id, MAX_REQUEST_ID_BYTES, true)?;
        text(at, "endpoint", &self.endpoint, MAX_NAME_BYTES, false)?;
        opt_ms(at, "ttft_ms", self.ttft_ms)?;
        opt_ms(at, "tpot_ms", self.tpot_ms)?;
        if let Some(failed_at) = &self.failed_at {
            text(at, "failed_at", failed_at, MAX_NAME_BYTES, true)?;
        }
        ms(at, "e2e_ms", self.e2e_ms)
    }
}

impl FirstToken {
    pub fn check(&self, at: &str) -> Result<(), Invalid> {
        text(at, "pool", &self.pool, MAX_NAME_BYTES, true)?;
        text(at, "request_id", &self.request_id, MAX_REQUEST_ID_BYTES, true)?;
        text(at, "endpoint", &self.endpoint, MAX_NAME_BYTES, false)?;
        ms(at, "ttft_ms", self.ttft_ms)
    }
}

impl DispatchBatch {
    /// The whole batch, so that a refused batch leaves nothing half-applied.
    pub fn check(&self) -> Result<(), Invalid> {
        items("dispatches", self.dispatches.len())?;
        self.dispatches.iter().enumerate().try_for_each(|(i, d)| d.check(&format!("dispatches[{i}]")))
    }
}

impl ReportBatch {
    pub fn check(&self) -> Result<(), Invalid> {
        items("reports", self.reports.len())?;
        items("first_tokens", self.first_tokens.len())?;
        self.reports.iter().enumerate().try_for_each(|(i, r)| r.check(&format!("reports[{i}]")))?;
        self.first_tokens.iter().enumerate().try_for_each(|(i, f)| f.check(&format!("first_tokens[{i}]")))?;
        items("abandoned", self.abandoned.len())?;
        self.abandoned.iter().enumerate().try_for_each(|(i, a)| a.check(&format!("abandoned[{i}]")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::RouteSource;

    fn dispatch() -> Dispatch {
        Dispatch {
            pool: "p".into(),
            request_id: "r".into(),
            endpoint: "e:1".into(),
            request: RequestFeatures::default(),
        }
    }

    fn report() -> Report {
        Report {
            pool: "p".into(),
            request_id: "r".into(),
            endpoint: "e:1".into(),
            source: RouteSource::PredictedPositive,
            ttft_ms: Some(1.0),
            tpot_ms: Some(1.0),
            e2e_ms: 2.0,
            output_tokens: None,
            cached_tokens: None,
            status: 200,
            failed_at: None,
        }
    }

    #[test]
    fn in_range_values_pass() {
        assert_eq!(DispatchBatch { dispatches: vec![dispatch()] }.check(), Ok(()));
        assert_eq!(ReportBatch { reports: vec![report()], first_tokens: vec![], abandoned: vec![] }.check(), Ok(()));
        let first = FirstToken { pool: "p".into(), request_id: "r".into(), endpoint: "e:1".into(), ttft_ms: -1.0 };
        let err = ReportBatch { reports: vec![], first_tokens: vec![first], abandoned: vec![] }.check().unwrap_err();
        assert_eq!(err.field, "first_tokens[0].ttft_ms");
    }

    #[test]
    fn every_bad_number_names_its_field() {
        let bad = [f64::NAN, f64::INFINITY, -1.0, 1e22, 1e300, MAX_MS * 1.0001];
        for v in bad {
            let mut d = dispatch();
            d.request.slo.ttft_ms = Some(v);
            let err = DispatchBatch { dispatches: vec![d] }.check().unwrap_err();
            assert_eq!(err.field, "dispatches[0].request.slo.ttft_ms", "{v}");
            let mut o = report();
            o.e2e_ms = v;
            assert_eq!(o.check("o").unwrap_err().field, "o.e2e_ms", "{v}");
            let mut o = report();
            o.tpot_ms = Some(v);
            assert_eq!(o.check("o").unwrap_err().field, "o.tpot_ms", "{v}");
            let slo = Slo { ttft_ms: None, tpot_ms: Some(v) };
            assert_eq!(slo.check("request").unwrap_err().field, "request.slo.tpot_ms", "{v}");
        }
        let zero_slo = Slo { ttft_ms: Some(0.0), tpot_ms: None };
        assert_eq!(zero_slo.check("").unwrap_err().field, "slo.ttft_ms");
    }

    #[test]
    fn sizes_are_capped() {
        let mut d = dispatch();
        d.request_id = "x".repeat(MAX_REQUEST_ID_BYTES + 1);
        assert_eq!(d.check("d").unwrap_err().field, "d.request_id");
        let mut d = dispatch();
        d.request.prefix_hashes = vec![0; MAX_PREFIX_HASHES + 1];
        assert_eq!(d.check("d").unwrap_err().field, "d.request.prefix_hashes");
        let mut d = dispatch();
        d.request.model = "m".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(d.check("d").unwrap_err().field, "d.request.model");
        let mut d = dispatch();
        d.request.input_tokens = MAX_TOKENS + 1;
        assert_eq!(d.check("d").unwrap_err().field, "d.request.input_tokens");
        let batch = DispatchBatch { dispatches: vec![dispatch(); MAX_BATCH_ITEMS + 1] };
        assert_eq!(batch.check().unwrap_err().field, "dispatches");
    }

    #[test]
    fn out_of_range_predictions_read_as_missing() {
        assert_eq!(ms_or_none(Some(12.5)), Some(12.5));
        for v in [f64::NAN, -0.1, f64::INFINITY, 1e300] {
            assert_eq!(ms_or_none(Some(v)), None, "{v}");
        }
    }
}

/// Property tests: any bytes, decoded as any message in either format, give a value
/// or an error, and checking a decoded value never panics. Native only.
#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use crate::codec::{self, Format};
    use crate::messages::PredictResponse;
    use proptest::prelude::*;

    fn decode_and_check(format: Format, bytes: &[u8]) {
        if let Ok(m) = codec::decode::<PredictRequest>(format, bytes) {
            let _ = m.check();
        }
        if let Ok(m) = codec::decode::<DispatchBatch>(format, bytes) {
            let _ = m.check();
        }
        if let Ok(m) = codec::decode::<PredictBatch>(format, bytes) {
            let _ = m.check();
        }
        if let Ok(m) = codec::decode::<ReportBatch>(format, bytes) {
            let _ = m.check();
        }
        if let Ok(m) = codec::decode::<PredictResponse>(format, bytes) {
            for e in &m.endpoints {
                let _ = e.check("e");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            decode_and_check(Format::MsgPack, &bytes);
            decode_and_check(Format::Json, &bytes);
        }

        #[test]
        fn any_numbers_in_a_report_are_checked(
            e2e in any::<f64>(), ttft in any::<f64>(), id in ".{0,200}",
        ) {
            let body = serde_json::json!({"reports": [{"pool": "p", "request_id": id, "endpoint": "e",
                "source": "fallback", "ttft_ms": ttft, "e2e_ms": e2e, "status": 200}]});
            for format in [Format::MsgPack, Format::Json] {
                let Ok(bytes) = codec::encode(format, &body) else { continue };
                if let Ok(batch) = codec::decode::<ReportBatch>(format, &bytes) {
                    let ok = batch.check().is_ok();
                    let o = &batch.reports[0];
                    let in_range = is_ms(o.e2e_ms) && o.ttft_ms.is_none_or(is_ms)
                        && o.request_id.len() <= MAX_REQUEST_ID_BYTES && !o.request_id.is_empty();
                    prop_assert_eq!(ok, in_range);
                }
            }
        }
    }

    #[test]
    fn a_bounded_state_always_passes_its_check_and_a_sane_one_is_unchanged() {
        let odd = EndpointState {
            kv_usage: f64::NAN,
            prefix_match: 7.5,
            tightest_tpot_slo_ms: Some(0.0),
            recent_tpot_ms: Some(-3.0),
            prefill_ms_per_token: Some(f64::NAN),
            max_context_tokens: Some(u32::MAX),
            prefill_tokens_per_s: f64::INFINITY,
            ..Default::default()
        };
        assert!(odd.check("e").is_err());
        let held = odd.bounded();
        assert_eq!(held.check("e"), Ok(()));
        assert_eq!(
            (held.kv_usage, held.prefix_match, held.tightest_tpot_slo_ms, held.recent_tpot_ms),
            (0.0, 1.0, None, None)
        );
        assert_eq!(held.prefill_ms_per_token, None);
        let sane = EndpointState {
            kv_usage: 0.4,
            recent_tpot_ms: Some(12.0),
            prefill_ms_per_token: Some(0.03),
            prefill_tokens_per_s: 9e3,
            ..Default::default()
        };
        assert_eq!(sane.clone().bounded(), sane);
    }
}
