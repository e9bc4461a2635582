//! Which of a model server's Prometheus series the predictor reads, per engine: vLLM's by
//! default, the others' as built-in mappings or as `[[engine]]` tables of the configuration.
//! The predictor reads four things: requests running, requests waiting, KV-cache use (a
//! fraction) and, where the engine has one, its inter-token latency histogram.

use serde::{Deserialize, Serialize};

/// One series to read: a name, and optionally one label that must have a value
/// (`nv_trt_llm_request_metrics{request_type=waiting}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricSpec {
    pub name: String,
    pub label: Option<(String, String)>,
}

impl MetricSpec {
    /// `name` or `name{label=value}` (the value may be quoted).
    pub fn parse(text: &str) -> Result<MetricSpec, String> {
        let text = text.trim();
        let valid_name =
            |n: &str| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        let (name, label) = match text.split_once('{') {
            None => (text, None),
            Some((name, rest)) => {
                let inner =
                    rest.strip_suffix('}').ok_or_else(|| format!("{text:?}: a label selector ends with '}}'"))?;
                let (key, value) =
                    inner.split_once('=').ok_or_else(|| format!("{text:?}: the label selector is label=value"))?;
                let (key, value) = (key.trim(), value.trim().trim_matches('"'));
                if !valid_name(key) || value.is_empty() {
                    return Err(format!("{text:?}: the label selector is label=value"));
                }
                (name, Some((key.to_string(), value.to_string())))
            }
        };
        if !valid_name(name) {
            return Err(format!("{text:?}: not a Prometheus metric name"));
        }
        Ok(MetricSpec { name: name.to_string(), label })
    }

    /// Whether a sample line's series (`name` and the text of its labels, without braces)
    /// is this one.
    pub fn matches(&self, name: &str, labels: &str) -> bool {
        if name != self.name {
            return false;
        }
        let Some((key, value)) = &self.label else { return true };
        labels.split(',').any(|pair| {
            pair.split_once('=').is_some_and(|(k, v)| k.trim() == key && v.trim().trim_matches('"') == value)
        })
    }
}

/// An engine's series, as written in the configuration (`[[engine]]`): each a spec, or a list
/// of specs of which the first one present is read (an engine that renamed a series).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    pub name: String,
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    pub kv_usage: Vec<String>,
    /// Inter-token latency histograms, by their base name (`_sum` and `_count` are read).
    #[serde(default)]
    pub decode_latency: Vec<String>,
}

/// An engine's series, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetricNames {
    pub name: String,
    pub running: Vec<MetricSpec>,
    pub waiting: Vec<MetricSpec>,
    pub kv_usage: Vec<MetricSpec>,
    pub decode_latency: Vec<String>,
}

/// The engine a pool names when it names none.
pub const DEFAULT_ENGINE: &str = "vllm";

/// The engines known without configuration: vLLM, SGLang, trtllm-serve, and Triton's
/// TensorRT-LLM backend (the series the Gateway API Inference Extension's model-server
/// protocol lists for each).
pub fn builtin_engines() -> Vec<EngineConfig> {
    let engine = |name: &str, running: &[&str], waiting: &[&str], kv: &[&str], decode: &[&str]| EngineConfig {
        name: name.to_string(),
        running: running.iter().map(|s| s.to_string()).collect(),
        waiting: waiting.iter().map(|s| s.to_string()).collect(),
        kv_usage: kv.iter().map(|s| s.to_string()).collect(),
        decode_latency: decode.iter().map(|s| s.to_string()).collect(),
    };
    vec![
        engine(
            "vllm",
            &["vllm:num_requests_running"],
            &["vllm:num_requests_waiting"],
            // Renamed in vLLM 0.10; the older name on servers that predate it.
            &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            &["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"],
        ),
        engine(
            "sglang",
            &["sglang:num_running_reqs"],
            &["sglang:num_queue_reqs"],
            &["sglang:token_usage"],
            &["sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"],
        ),
        engine(
            "trtllm-serve",
            &["trtllm_num_requests_running"],
            &["trtllm_num_requests_waiting"],
            &["trtllm_kv_cache_utilization"],
            &[],
        ),
        engine(
            "triton-tensorrt-llm",
            &["nv_trt_llm_request_metrics{request_type=scheduled}"],
            &["nv_trt_llm_request_metrics{request_type=waiting}"],
            &["nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"],
            &[],
        ),
    ]
}

impl EngineConfig {
    /// Its specs parsed; an error names the engine and the field.
    pub fn parse(&self) -> Result<EngineMetricNames, String> {
        let specs = |field: &str, texts: &[String]| -> Result<Vec<MetricSpec>, String> {
            if texts.is_empty() {
                return Err(format!("engine {:?}: {field} names no series", self.name));
            }
            texts
                .iter()
                .map(|t| MetricSpec::parse(t).map_err(|e| format!("engine {:?}: {field}: {e}", self.name)))
                .collect()
        };
        if self.name.trim().is_empty() {
            return Err("engine: name must not be empty".into());
        }
        for base in &self.decode_latency {
            let spec = MetricSpec::parse(base).map_err(|e| format!("engine {:?}: decode_latency: {e}", self.name))?;
            if spec.label.is_some() {
                return Err(format!("engine {:?}: decode_latency: a histogram's base name, without labels", self.name));
            }
        }
        Ok(EngineMetricNames {
            name: self.name.clone(),
            running: specs("running", &self.running)?,
            waiting: specs("waiting", &self.waiting)?,
            kv_usage: specs("kv_usage", &self.kv_usage)?,
            decode_latency: self.decode_latency.clone(),
        })
    }
}

/// The engine called `name`: one of `configured`, else a built-in one.
pub fn resolve(name: &str, configured: &[EngineConfig]) -> Result<EngineMetricNames, String> {
    let builtin = builtin_engines();
    let engine = configured.iter().chain(builtin.iter()).find(|e| e.name == name).ok_or_else(|| {
        let known: Vec<String> = configured.iter().chain(builtin.iter()).map(|e| e.name.clone()).collect();
        format!(
            "engine {name:?} is neither built in nor an [[engine]] of the configuration (known: {})",
            known.join(", ")
        )
    })?;
    engine.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_a_name_or_a_name_with_one_label() {
        let plain = MetricSpec::parse("vllm:num_requests_running").unwrap();
        assert!(plain.matches("vllm:num_requests_running", "model_name=\"m\""));
        assert!(!plain.matches("vllm:num_requests_waiting", ""));
        let labelled = MetricSpec::parse("nv_trt_llm_request_metrics{request_type=\"waiting\"}").unwrap();
        assert!(labelled.matches("nv_trt_llm_request_metrics", "model=\"t\",request_type=\"waiting\",version=\"1\""));
        assert!(!labelled.matches("nv_trt_llm_request_metrics", "request_type=\"scheduled\""));
        assert!(!labelled.matches("nv_trt_llm_request_metrics", ""));
        for bad in ["", "a b", "x{", "x{y}", "x{=v}", "x{k=}", "{k=v}"] {
            assert!(MetricSpec::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_builtin_engine_parses_and_unknown_ones_are_named() {
        for engine in builtin_engines() {
            assert!(engine.parse().is_ok(), "{}", engine.name);
        }
        let err = resolve("tgi", &[]).unwrap_err();
        assert!(err.contains("\"tgi\"") && err.contains("sglang"), "{err}");
        let custom = EngineConfig {
            name: "vllm".into(),
            running: vec!["r".into()],
            waiting: vec!["w".into()],
            kv_usage: vec!["k".into()],
            decode_latency: vec![],
        };
        assert_eq!(resolve("vllm", std::slice::from_ref(&custom)).unwrap().running[0].name, "r", "configured first");
        let broken = EngineConfig { kv_usage: vec![], ..custom };
        assert!(broken.parse().unwrap_err().contains("kv_usage"));
    }
}
