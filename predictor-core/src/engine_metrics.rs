//! Reading an engine's metrics from the Prometheus text of its `/metrics`, by its series
//! (`headroom_predictor_config::engine`: vLLM's by default). Pure, so the predictor's scraper
//! and the benchmark's engine sampler read a page the same way.

use headroom_predictor_config::engine::{self, EngineMetricNames, MetricSpec};

use crate::pool::{DecodeCounter, EngineMetrics};

/// vLLM's series (the default engine): what [`parse_engine_metrics`] reads.
pub fn vllm() -> &'static EngineMetricNames {
    static VLLM: std::sync::LazyLock<EngineMetricNames> = std::sync::LazyLock::new(|| {
        engine::resolve(engine::DEFAULT_ENGINE, &[]).unwrap_or_else(|_| EngineMetricNames {
            name: engine::DEFAULT_ENGINE.into(),
            running: Vec::new(),
            waiting: Vec::new(),
            kv_usage: Vec::new(),
            decode_latency: Vec::new(),
        })
    });
    &VLLM
}

/// Reads vLLM's engine metrics from Prometheus text ([`parse_metrics`] with [`vllm`]).
pub fn parse_engine_metrics(text: &str) -> Option<EngineMetrics> {
    parse_metrics(text, vllm())
}

/// Reads an engine's metrics from Prometheus text, by its series (`names`). Series of one
/// name are summed (one per model/engine) except KV usage, of which the highest is kept.
/// Where a field lists several series (a series renamed across versions), the first one
/// present is read, so a server exposing both counts its tokens once. `None` when no known
/// series is present.
pub fn parse_metrics(text: &str, names: &EngineMetricNames) -> Option<EngineMetrics> {
    // Per field, per spec: the sum (or highest) seen, `None` while unseen.
    let mut running: Vec<Option<f64>> = vec![None; names.running.len()];
    let mut waiting: Vec<Option<f64>> = vec![None; names.waiting.len()];
    let mut kv: Vec<Option<f64>> = vec![None; names.kv_usage.len()];
    let mut decode: Vec<Option<DecodeCounter>> = vec![None; names.decode_latency.len()];
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        let (labels, value_text) = match (rest.strip_prefix('{'), rest.rfind('}')) {
            (Some(_), Some(close)) => (&rest[1..close], &rest[close + 1..]),
            _ => ("", rest),
        };
        let Some(value) = value_text.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        let add = |slots: &mut [Option<f64>], specs: &[MetricSpec], combine: fn(f64, f64) -> f64| {
            for (slot, spec) in slots.iter_mut().zip(specs) {
                if spec.matches(series, labels) {
                    *slot = Some(slot.map_or(value, |v| combine(v, value)));
                }
            }
        };
        add(&mut running, &names.running, |a, b| a + b);
        add(&mut waiting, &names.waiting, |a, b| a + b);
        add(&mut kv, &names.kv_usage, f64::max);
        for (slot, base) in decode.iter_mut().zip(&names.decode_latency) {
            match series.strip_prefix(base.as_str()) {
                Some("_sum") => slot.get_or_insert_default().sum_s += value,
                Some("_count") => slot.get_or_insert_default().tokens += value,
                _ => {}
            }
        }
    }
    let first = |slots: &[Option<f64>]| slots.iter().flatten().next().copied();
    let decode = decode.into_iter().flatten().next();
    let (running, waiting, kv) = (first(&running), first(&waiting), first(&kv));
    if running.is_none() && waiting.is_none() && kv.is_none() && decode.is_none() {
        return None;
    }
    Some(EngineMetrics {
        // `as` saturates a huge float.
        running: running.map_or(0, |v| v as u32),
        waiting: waiting.map_or(0, |v| v as u32),
        kv_usage: kv.map_or(0.0, |v| v.min(1.0)),
        decode,
        queue_read: running.is_some() || waiting.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_metrics() {
        let text = "# HELP vllm:num_requests_running Running\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3.0\n\
            vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 2.0\n\
            vllm:num_requests_waiting{model_name=\"m\"} 7\n\
            vllm:kv_cache_usage_perc{model_name=\"m\"} 0.42\n\
            vllm:prompt_tokens_total{model_name=\"m\"} 1e6\n";
        assert_eq!(
            parse_engine_metrics(text),
            Some(EngineMetrics { running: 5, waiting: 7, kv_usage: 0.42, decode: None, queue_read: true })
        );
    }

    #[test]
    fn older_kv_name_and_garbage() {
        assert_eq!(parse_engine_metrics("vllm:gpu_cache_usage_perc 0.5\n").map(|m| m.kv_usage), Some(0.5));
        assert_eq!(parse_engine_metrics("up 1\nnonsense\n{}\n"), None);
        assert_eq!(parse_engine_metrics("vllm:num_requests_running{a=\"}\"} NaN\n"), None);
    }

    #[test]
    fn the_inter_token_histogram_is_read_under_either_name_once() {
        let itl = "vllm:inter_token_latency_seconds_bucket{le=\"0.01\",model_name=\"m\"} 3\n\
            vllm:inter_token_latency_seconds_sum{model_name=\"m\",engine=\"0\"} 1.5\n\
            vllm:inter_token_latency_seconds_sum{model_name=\"m\",engine=\"1\"} 0.5\n\
            vllm:inter_token_latency_seconds_count{model_name=\"m\",engine=\"0\"} 60\n\
            vllm:inter_token_latency_seconds_count{model_name=\"m\",engine=\"1\"} 40\n";
        let decode = |text: &str| parse_engine_metrics(text).and_then(|m| m.decode);
        assert_eq!(decode(itl), Some(DecodeCounter { sum_s: 2.0, tokens: 100.0 }), "summed over engines");
        let older = "vllm:time_per_output_token_seconds_sum 3\nvllm:time_per_output_token_seconds_count 150\n";
        assert_eq!(decode(older), Some(DecodeCounter { sum_s: 3.0, tokens: 150.0 }));
        let both = format!("{itl}{older}");
        assert_eq!(decode(&both), Some(DecodeCounter { sum_s: 2.0, tokens: 100.0 }), "the same tokens, counted once");
        assert_eq!(decode("vllm:num_requests_running 1\n"), None);
    }

    #[test]
    fn each_engine_is_read_by_its_own_series() {
        let sglang = engine::resolve("sglang", &[]).unwrap();
        let text = "sglang:num_running_reqs{model_name=\"m\"} 4\nsglang:num_queue_reqs{model_name=\"m\"} 2\n\
            sglang:token_usage{model_name=\"m\"} 0.25\nvllm:num_requests_running 99\n";
        assert_eq!(
            parse_metrics(text, &sglang),
            Some(EngineMetrics { running: 4, waiting: 2, kv_usage: 0.25, decode: None, queue_read: true })
        );
        let triton = engine::resolve("triton-tensorrt-llm", &[]).unwrap();
        let text = "nv_trt_llm_request_metrics{model=\"t\",request_type=\"scheduled\",version=\"1\"} 3\n\
            nv_trt_llm_request_metrics{model=\"t\",request_type=\"waiting\",version=\"1\"} 5\n\
            nv_trt_llm_request_metrics{model=\"t\",request_type=\"max\",version=\"1\"} 64\n\
            nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\",model=\"t\"} 0.5\n\
            nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\",model=\"t\"} 4096\n";
        assert_eq!(
            parse_metrics(text, &triton),
            Some(EngineMetrics { running: 3, waiting: 5, kv_usage: 0.5, decode: None, queue_read: true })
        );
        assert_eq!(
            parse_metrics("vllm:num_requests_running 2\n", &triton),
            None,
            "another engine's series are not read"
        );
    }

    #[test]
    fn huge_values_saturate() {
        let text = "vllm:num_requests_running 1e300\nvllm:num_requests_running 5e9\nvllm:kv_cache_usage_perc 7\n";
        assert_eq!(
            parse_engine_metrics(text),
            Some(EngineMetrics { running: u32::MAX, waiting: 0, kv_usage: 1.0, decode: None, queue_read: true })
        );
    }
}
