//! Reading a caller's routing hints from request headers.

use headroom_protocol::headers::{
    FAIRNESS_ID, FAIRNESS_ID_ALIAS, OBJECTIVE, OBJECTIVE_ALIAS, PREDICTION_BASED, SLO_TPOT, SLO_TTFT,
};
use headroom_protocol::{limits, Slo};

use crate::config::{FilterConfig, SloFloorAction};

/// What the caller asked for in its headers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoutingHints {
    pub slo: Slo,
    /// Below zero: the request may be shed when no endpoint can serve it.
    pub priority: i32,
    /// The client claimed a priority outside `client_priority_range`, held to it.
    pub priority_clamped: bool,
    /// The caller's `x-prediction-based-scheduling`, when it sent one (absent: SLO routing
    /// when the request states a goal, `Flow`'s rule).
    pub prediction_based: Option<bool>,
}

/// A header with a value the filter refuses (answered with 400).
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderError {
    pub header: String,
    pub message: String,
}

/// Reads the hints; `get` returns a request header's value by lower-case name. The
/// priority is the trusted header's, else the named objective's, else the client's claim
/// held to `client_priority_range`. SLOs are bounded: above `limits::MAX_MS` is refused; below the configured floor is
/// clamped to it or refused (`slo_floor_action`).
pub fn parse_hints(get: impl Fn(&str) -> Option<String>, config: &FilterConfig) -> Result<RoutingHints, HeaderError> {
    let priority_header = config.priority_header.as_str();
    let floor = |ms| (ms, config.slo_floor_action);
    let slo = Slo {
        ttft_ms: parse_slo(&get, &SLO_TTFT, floor(config.min_ttft_slo_ms))?,
        tpot_ms: parse_slo(&get, &SLO_TPOT, floor(config.min_tpot_slo_ms))?,
    };
    let integer = |header: &str, v: String| {
        v.trim()
            .parse::<i32>()
            .map_err(|_| HeaderError { header: header.to_string(), message: format!("must be an integer, got {v:?}") })
    };
    let trusted = config.trusted_priority_header.as_deref().and_then(|h| Some((h, get(h)?)));
    let objective = first_present(&get, [OBJECTIVE, OBJECTIVE_ALIAS])
        .and_then(|(_, name)| config.objectives.get(name.trim()).copied());
    let (priority, priority_clamped) = match (trusted, objective) {
        (Some((header, v)), _) => (integer(header, v)?, false),
        (None, Some(priority)) => (priority, false),
        (None, None) => {
            let claimed = get(priority_header).map(|v| integer(priority_header, v)).transpose()?.unwrap_or(0);
            let [lowest, highest] = config.client_priority_range;
            let held = claimed.clamp(lowest, highest);
            (held, held != claimed)
        }
    };
    let prediction_based = match get(PREDICTION_BASED) {
        None => None,
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                return Err(HeaderError {
                    header: PREDICTION_BASED.to_string(),
                    message: format!("must be true or false, got {v:?}"),
                })
            }
        },
    };
    Ok(RoutingHints { slo, priority, priority_clamped, prediction_based })
}

/// The tenant a request names for flow control's turns (empty: the shared anonymous one),
/// at most `limits::MAX_NAME_BYTES`. A configured trusted header is the only source: a
/// client cannot name a tenant then. The default client header has the GIE's older name
/// as its alias; a configured or trusted one has none.
pub fn parse_tenant(get: impl Fn(&str) -> Option<String>, config: &FilterConfig) -> Result<String, HeaderError> {
    let (header, alias) = match config.trusted_fairness_header.as_deref() {
        Some(trusted) => (trusted, None),
        None => {
            let header = config.fairness_header.as_str();
            (header, (header == FAIRNESS_ID).then_some(FAIRNESS_ID_ALIAS))
        }
    };
    let Some((name, tenant)) = first_present(&get, [Some(header), alias].into_iter().flatten()) else {
        return Ok(String::new());
    };
    if tenant.len() > limits::MAX_NAME_BYTES {
        let message = format!("must be at most {} bytes", limits::MAX_NAME_BYTES);
        return Err(HeaderError { header: name.to_string(), message });
    }
    Ok(tenant)
}

/// The first of `names` the request carries, with its value: a header and its aliases,
/// preferred first.
fn first_present<'a>(
    get: &impl Fn(&str) -> Option<String>,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<(&'a str, String)> {
    names.into_iter().find_map(|n| get(n).map(|v| (n, v)))
}

/// The first present header of `names`, as milliseconds within `(0, MAX_MS]`, then
/// held to `floor` (clamped or refused).
fn parse_slo(
    get: &impl Fn(&str) -> Option<String>,
    names: &[&str],
    (floor, action): (f64, SloFloorAction),
) -> Result<Option<f64>, HeaderError> {
    let Some((name, value)) = first_present(get, names.iter().copied()) else { return Ok(None) };
    let error = |message: String| HeaderError { header: name.to_string(), message };
    let ms = match value.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && ms > 0.0 && ms <= limits::MAX_MS => ms,
        _ => {
            let max = limits::MAX_MS;
            return Err(error(format!("must be a number of milliseconds > 0 and <= {max}, got {value:?}")));
        }
    };
    match action {
        _ if ms >= floor => Ok(Some(ms)),
        SloFloorAction::Clamp => Ok(Some(floor)),
        SloFloorAction::Reject => Err(error(format!("must be at least {floor} ms here, got {value:?}"))),
    }
}

/// Every hint header, stripped before the request reaches the model server.
pub fn hint_headers(priority_header: &str) -> Vec<&str> {
    let mut names: Vec<&str> = SLO_TTFT.iter().chain(SLO_TPOT.iter()).copied().collect();
    names.push(PREDICTION_BASED);
    names.push(priority_header);
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn hints_with(pairs: &[(&str, &str)], config: &FilterConfig) -> Result<RoutingHints, HeaderError> {
        let map: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        parse_hints(|name| map.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()), config)
    }

    fn hints(pairs: &[(&str, &str)]) -> Result<RoutingHints, HeaderError> {
        hints_with(pairs, &FilterConfig::default())
    }

    #[test]
    fn slos_below_the_floor_are_clamped_or_refused_as_configured() {
        let tiny = [("x-slo-tpot-ms", "0.000000001"), ("x-slo-ttft-ms", "1")];
        let clamped = hints(&tiny).unwrap();
        assert_eq!(clamped.slo, Slo { ttft_ms: Some(10.0), tpot_ms: Some(5.0) }, "default floors, clamped");
        let strict = FilterConfig { slo_floor_action: SloFloorAction::Reject, ..FilterConfig::default() };
        assert_eq!(hints_with(&tiny, &strict).unwrap_err().header, "x-slo-ttft-ms");
        assert_eq!(hints_with(&[("x-llm-d-slo-tpot-ms", "4.9")], &strict).unwrap_err().header, "x-llm-d-slo-tpot-ms");
        assert_eq!(hints_with(&[("x-slo-tpot-ms", "5")], &strict).unwrap().slo.tpot_ms, Some(5.0));
        let open = FilterConfig { min_ttft_slo_ms: 0.0, min_tpot_slo_ms: 0.0, ..FilterConfig::default() };
        assert_eq!(hints_with(&[("x-slo-tpot-ms", "0.5")], &open).unwrap().slo.tpot_ms, Some(0.5));
    }

    #[test]
    fn no_headers_no_hints() {
        assert_eq!(hints(&[]).unwrap(), RoutingHints::default());
    }

    #[test]
    fn both_header_generations_accepted() {
        let h = hints(&[("x-slo-ttft-ms", "250"), ("x-llm-d-slo-tpot-ms", "12.5")]).unwrap();
        assert_eq!(h.slo, Slo { ttft_ms: Some(250.0), tpot_ms: Some(12.5) });
    }

    #[test]
    fn newer_name_wins_over_alias() {
        let h = hints(&[("x-slo-ttft-ms", "900"), ("x-llm-d-slo-ttft-ms", "100")]).unwrap();
        assert_eq!(h.slo.ttft_ms, Some(100.0));
    }

    #[test]
    fn invalid_values_name_the_header() {
        let cases = [
            ("x-slo-ttft-ms", "abc"),
            ("x-slo-ttft-ms", "-5"),
            ("x-slo-ttft-ms", "0"),
            ("x-llm-d-slo-tpot-ms", "NaN"),
            ("x-slo-tpot-ms", "inf"),
            ("x-slo-ttft-ms", "1e300"),
            ("x-slo-tpot-ms", "3600001"),
            ("x-request-priority", "high"),
            ("x-prediction-based-scheduling", "yes"),
        ];
        for (header, value) in cases {
            let err = hints(&[(header, value)]).unwrap_err();
            assert_eq!(err.header, header, "{header}: {value}");
        }
    }

    #[test]
    fn a_client_claims_a_priority_only_within_its_range_and_a_trusted_header_overrides_it() {
        let config = FilterConfig::default();
        let with = |headers: &[(&str, &str)], config: &FilterConfig| {
            parse_hints(|name| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()), config)
        };
        let p = |headers: &[(&str, &str)], config: &FilterConfig| {
            with(headers, config).map(|h| (h.priority, h.priority_clamped))
        };
        assert_eq!(p(&[("x-request-priority", "2147483647")], &config), Ok((0, true)));
        assert_eq!(p(&[("x-request-priority", "-7")], &config), Ok((-1, true)));
        assert_eq!(p(&[("x-request-priority", "-1")], &config), Ok((-1, false)));
        assert_eq!(p(&[], &config), Ok((0, false)));
        let wide = FilterConfig { client_priority_range: [-10, 10], ..FilterConfig::default() };
        assert_eq!(p(&[("x-request-priority", "7")], &wide), Ok((7, false)));
        let trusting =
            FilterConfig { trusted_priority_header: Some("x-auth-priority".into()), ..FilterConfig::default() };
        let both = [("x-request-priority", "0"), ("x-auth-priority", "5")];
        assert_eq!(p(&both, &trusting), Ok((5, false)), "the trusted value, unclamped");
        assert_eq!(p(&[("x-request-priority", "5")], &trusting), Ok((0, true)), "no trusted value: a claim");
        let bad = with(&[("x-auth-priority", "high")], &trusting).err().map(|e| e.header);
        assert_eq!(bad.as_deref(), Some("x-auth-priority"));
    }

    #[test]
    fn a_named_objective_sets_the_priority_between_the_trusted_header_and_the_claim() {
        let objectives = [("critical".to_string(), 10), ("batch".to_string(), -5)].into_iter().collect();
        let config = FilterConfig { objectives, ..FilterConfig::default() };
        let p = |headers: &[(&str, &str)], config: &FilterConfig| {
            hints_with(headers, config).map(|h| (h.priority, h.priority_clamped))
        };
        assert_eq!(p(&[("x-llm-d-inference-objective", "critical")], &config), Ok((10, false)), "unclamped");
        assert_eq!(p(&[("x-gateway-inference-objective", "batch")], &config), Ok((-5, false)), "the older name");
        let both = [("x-llm-d-inference-objective", "critical"), ("x-gateway-inference-objective", "batch")];
        assert_eq!(p(&both, &config), Ok((10, false)), "the newer name wins");
        let over_claim = [("x-llm-d-inference-objective", "batch"), ("x-request-priority", "0")];
        assert_eq!(p(&over_claim, &config), Ok((-5, false)), "the objective over the client's claim");
        let unknown = [("x-llm-d-inference-objective", "nope"), ("x-request-priority", "-1")];
        assert_eq!(p(&unknown, &config), Ok((-1, false)), "an unknown objective: the claim");
        let trusting = FilterConfig { trusted_priority_header: Some("x-auth-priority".into()), ..config.clone() };
        let trusted = [("x-llm-d-inference-objective", "critical"), ("x-auth-priority", "3")];
        assert_eq!(p(&trusted, &trusting), Ok((3, false)), "the trusted header wins");
    }

    #[test]
    fn priority_and_prediction_switch() {
        let h = hints(&[("x-request-priority", "-1"), ("x-prediction-based-scheduling", "TRUE")]).unwrap();
        assert_eq!(h.priority, -1);
        assert_eq!(h.prediction_based, Some(true));
    }

    #[test]
    fn every_hint_header_is_stripped() {
        let names = hint_headers("x-request-priority");
        for n in SLO_TTFT.iter().chain(SLO_TPOT.iter()) {
            assert!(names.contains(n));
        }
        assert!(names.contains(&"x-request-priority"));
        assert!(names.contains(&PREDICTION_BASED));
    }
}
