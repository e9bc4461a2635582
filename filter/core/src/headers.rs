//! Reading a caller's routing hints from request headers.

use headroom_protocol::Slo;

/// TTFT SLO headers, preferred first (the newer llm-d name, then its alias).
pub const TTFT_HEADERS: [&str; 2] = ["x-llm-d-slo-ttft-ms", "x-slo-ttft-ms"];
/// TPOT SLO headers, preferred first.
pub const TPOT_HEADERS: [&str; 2] = ["x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"];
/// `true` asks for SLO routing; `false` or absent, the default profile.
pub const PREDICTION_HEADER: &str = "x-prediction-based-scheduling";

/// What the caller asked for in its headers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoutingHints {
    pub slo: Slo,
    /// Below zero: the request may be shed when no endpoint can serve it.
    pub priority: i32,
    /// The caller's `x-prediction-based-scheduling`, when it sent one.
    pub prediction_based: Option<bool>,
}

/// A header with a value the filter refuses (answered with 400).
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderError {
    pub header: String,
    pub message: String,
}

/// Reads the hints; `get` returns a request header's value by lower-case name.
pub fn parse_hints(get: impl Fn(&str) -> Option<String>, priority_header: &str) -> Result<RoutingHints, HeaderError> {
    let slo = Slo { ttft_ms: parse_slo(&get, &TTFT_HEADERS)?, tpot_ms: parse_slo(&get, &TPOT_HEADERS)? };
    let priority = match get(priority_header) {
        None => 0,
        Some(v) => v.trim().parse::<i32>().map_err(|_| HeaderError {
            header: priority_header.to_string(),
            message: format!("must be an integer, got {v:?}"),
        })?,
    };
    let prediction_based = match get(PREDICTION_HEADER) {
        None => None,
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                return Err(HeaderError {
                    header: PREDICTION_HEADER.to_string(),
                    message: format!("must be true or false, got {v:?}"),
                })
            }
        },
    };
    Ok(RoutingHints { slo, priority, prediction_based })
}

/// The first present header of `names`, as milliseconds (finite, > 0).
fn parse_slo(get: &impl Fn(&str) -> Option<String>, names: &[&str]) -> Result<Option<f64>, HeaderError> {
    for name in names {
        if let Some(value) = get(name) {
            return match value.trim().parse::<f64>() {
                Ok(ms) if ms.is_finite() && ms > 0.0 => Ok(Some(ms)),
                _ => Err(HeaderError {
                    header: (*name).to_string(),
                    message: format!("must be a number of milliseconds > 0, got {value:?}"),
                }),
            };
        }
    }
    Ok(None)
}

/// Every hint header, stripped before the request reaches the model server.
pub fn hint_headers(priority_header: &str) -> Vec<&str> {
    let mut names: Vec<&str> = TTFT_HEADERS.iter().chain(TPOT_HEADERS.iter()).copied().collect();
    names.push(PREDICTION_HEADER);
    names.push(priority_header);
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn hints(pairs: &[(&str, &str)]) -> Result<RoutingHints, HeaderError> {
        let map: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        parse_hints(|name| map.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()), "x-request-priority")
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
            ("x-request-priority", "high"),
            ("x-prediction-based-scheduling", "yes"),
        ];
        for (header, value) in cases {
            let err = hints(&[(header, value)]).unwrap_err();
            assert_eq!(err.header, header, "{header}: {value}");
        }
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
        for n in TTFT_HEADERS.iter().chain(TPOT_HEADERS.iter()) {
            assert!(names.contains(n));
        }
        assert!(names.contains(&"x-request-priority"));
        assert!(names.contains(&PREDICTION_HEADER));
    }
}
