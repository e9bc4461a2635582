//! headroom in front of real vLLM (its CPU build, two servers, a core each): an engine
//! nobody here wrote. Needs `make setup-vllm` (`make e2e` and `make test` run it).
//!
//! One stack, one test, because a vLLM server takes a minute to start: the profile the
//! stack measured is the prior (a prediction before any traffic matches it, not the
//! analytic formula), requests are routed where the filter chose, vLLM's own metrics are
//! scraped, the filter learns the model's token count from the answers, every sequence a
//! request asks is counted as vLLM runs it, a conversation's later turn goes where the
//! earlier one is cached, and a training round runs on the reports.

use std::time::Duration;

use headroom_e2e::{wait_until, Harness, StackOptions, SLO};
use headroom_predictor_config::Profile;
use headroom_stack::{vllm, Engine};
use serde_json::{json, Value};

/// A predict call for a prompt of `input_tokens`, straight to the predictor: the endpoints'
/// predicted TTFTs.
fn predicted_ttft(h: &Harness, input_tokens: u32) -> Vec<f64> {
    let body = json!({"pool": "default", "request_id": "probe",
        "request": {"model": vllm::MODEL_NAME, "input_tokens": input_tokens}});
    let endpoints = h.predict(&body)["endpoints"].as_array().cloned().unwrap_or_default();
    assert_eq!(endpoints.len(), 2, "both servers predicted");
    endpoints.iter().filter_map(|e| e["ttft_ms"].as_f64()).collect()
}

#[test]
fn routes_real_vllm_from_its_measured_profile_and_learns_its_tokens() {
    let opts = StackOptions {
        engine: Engine::Vllm,
        profiles: Engine::Vllm.default_profiles(),
        profile: true,
        // A model after a few dozen reports, not the 200 a deployment waits for. The 70
        // requests file about 46 samples (the streamed ones) and about 7 go to the holdout, so
        // 40 left the training set one short about as often as not.
        predictor_tweak: |c| {
            c.model.min_samples = 30;
            c.model.min_new_samples = 20;
            c.model.retrain_interval_ms = 500;
        },
        ..Default::default()
    };
    let h = Harness::start_opts(opts).unwrap();

    // The prior is the profile the stack measured: before any traffic, a 2,000-token
    // prompt is predicted at what the sweep measured for 2,000 tokens (the analytic prior,
    // written for an H100, says 70 ms; the CPU server takes about three times that).
    let dir = h.stack.run_dir.join("profiles");
    let profile = Profile::load(&dir.join("cpu-ttft.json"), &dir.join("cpu-tpot.json")).unwrap();
    let measured = profile.ttft_ms(2000.0);
    for ttft in predicted_ttft(&h, 2000) {
        assert!((ttft / measured - 1.0).abs() < 0.05, "predicted {ttft:.1} ms, the profile says {measured:.1} ms");
    }

    // Traffic with SLOs, streamed and not: every request served where the filter chose.
    // The load generator's filler, which this model's tokenizer packs at about 2 bytes a token.
    let prompt = "lorem ipsum dolor sit amet ".repeat(60); // 1,620 bytes
    let mut counted = Vec::new();
    for i in 0..70 {
        let stream = i % 3 != 0;
        let mut body = json!({"model": vllm::MODEL_NAME, "prompt": format!("request {i}: {prompt}"),
            "max_tokens": 8 + i % 24, "stream": stream});
        if stream {
            // vLLM refuses stream_options on a request that does not stream.
            body["stream_options"] = json!({"include_usage": true});
        }
        let mut headers = vec![("content-type", "application/json")];
        headers.extend_from_slice(&SLO);
        let r = h.post("/v1/completions", &headers, &body.to_string()).unwrap();
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        let chosen = r.chosen.as_deref().unwrap_or_default();
        assert!(h.stack.state.servers.iter().any(|s| s.to_string() == chosen), "routed to {chosen:?}");
        if !stream {
            counted.push(r.json()["usage"]["prompt_tokens"].as_u64().unwrap());
        }
    }

    // The Responses API as vLLM serves it: the `input` read for the prompt, the pick served,
    // and the stream's `response.*` events metered (first token, usage) like a completion's.
    let mut headers = vec![("content-type", "application/json")];
    headers.extend_from_slice(&SLO);
    let body = json!({"model": vllm::MODEL_NAME, "input": format!("a response: {prompt}"), "max_output_tokens": 12,
        "stream": true});
    let r = h.post("/v1/responses", &headers, &body.to_string()).unwrap();
    assert_eq!(r.status, 200, "/v1/responses: {}", r.body);
    let chosen = r.chosen.clone().unwrap_or_default();
    assert!(h.stack.state.servers.iter().any(|s| s.to_string() == chosen), "/v1/responses routed to {chosen:?}");
    assert!(r.body.contains("response.completed"), "not a Responses stream: {}", r.body);

    // vLLM's own metrics are scraped: its KV cache and request gauges reached the pool.
    let pools = h.get(&format!("{}/v1/pools", h.predictor())).unwrap().json();
    let endpoints = pools["pools"][0]["endpoints"].as_array().cloned().unwrap_or_default();
    assert_eq!(endpoints.len(), 2);
    for e in &endpoints {
        assert!(e["metrics_age_ms"].as_u64().is_some_and(|age| age < 5000), "not scraped: {e}");
        assert!(e["kv_usage"].is_number(), "no vLLM KV cache gauge: {e}");
    }

    // The filter learnt the model's count: the last dispatches estimate the prompt within
    // 10% of what vLLM counted (the first, at 4 bytes a token, was about half of it).
    let model_count = *counted.last().unwrap() as f64;
    assert!(wait_until(Duration::from_secs(10), || h.observations().len() >= 71), "reports did not arrive");
    let observations = h.observations();
    let responses = observations.last().unwrap();
    assert_eq!(responses["status"], 200, "{responses}");
    assert_eq!(responses["endpoint"], chosen.as_str(), "served where chosen: {responses}");
    assert!(responses["ttft_ms"].as_f64().is_some_and(|t| t > 0.0), "first token timed: {responses}");
    assert!(responses["output_tokens"].as_u64().is_some_and(|n| n > 0), "usage read: {responses}");
    let observations: Vec<Value> = observations[..70].to_vec();
    let estimates: Vec<f64> = observations.iter().filter_map(|o| o["request"]["input_tokens"].as_f64()).collect();
    let (first, last) = (estimates[0], *estimates.last().unwrap());
    assert!(first < model_count * 0.7, "the approximation first: {first} against the model's {model_count}");
    assert!((last / model_count - 1.0).abs() < 0.1, "learnt: {last} against the model's {model_count}");

    // vLLM runs every sequence a request asks: two prompts of a list with two answers each
    // are four, a batch of token-id lists one per list. Each is counted as the engine's
    // (`sequences`), and the batch, which headroom used to refuse, is served.
    let list = json!({"model": vllm::MODEL_NAME, "prompt": [format!("first: {prompt}"), format!("second: {prompt}")],
        "n": 2, "max_tokens": 4, "ignore_eos": true});
    let batch = json!({"model": vllm::MODEL_NAME, "prompt": [[10, 11, 12], [13, 14]], "max_tokens": 4,
        "ignore_eos": true});
    for (body, sequences) in [(list, 4), (batch, 2)] {
        let r = h.post("/v1/completions", &headers, &body.to_string()).unwrap();
        assert_eq!(r.status, 200, "{body}: {}", r.body);
        let answer = r.json();
        assert_eq!(answer["choices"].as_array().map(Vec::len), Some(sequences), "{answer}");
        assert_eq!(answer["usage"]["completion_tokens"].as_u64(), Some(4 * sequences as u64), "{answer}");
    }
    assert!(wait_until(Duration::from_secs(10), || h.observations().len() >= 73), "reports did not arrive");
    let sequences: Vec<Value> = h.observations()[71..73].iter().map(|o| o["request"]["sequences"].clone()).collect();
    assert_eq!(sequences, [json!(4), json!(2)], "each sequence counted");

    // A conversation's later turn resends the earlier one: it goes to the server that holds
    // that prompt in its prefix cache (the filter hashes the prompt's blocks, the predictor
    // remembers where each went and predicts the uncached rest), vLLM counts the hit, and
    // the turn's first token comes sooner for it.
    // The filler the filter learnt its bytes per token on: about 1,800 of this model's tokens.
    let document = format!("conversation: {}", "lorem ipsum dolor sit amet ".repeat(140));
    let first = format!("{document}\nuser: what does it do?\nassistant:");
    let second = format!("{first} it routes.\nuser: and then?\nassistant:");
    let mut turns = Vec::new();
    for (turn, prompt) in [&first, &second].into_iter().enumerate() {
        let hits = |server: &str| {
            let addr: std::net::SocketAddr = server.parse().unwrap();
            h.server_metric(addr, "vllm:prefix_cache_hits_total")
        };
        let before: Vec<f64> = h.stack.state.servers.iter().map(|s| hits(&s.to_string())).collect();
        let body = json!({"model": vllm::MODEL_NAME, "prompt": prompt, "max_tokens": 8, "stream": true,
            "stream_options": {"include_usage": true}});
        let r = h.post("/v1/completions", &headers, &body.to_string()).unwrap();
        assert_eq!(r.status, 200, "turn {turn}: {}", r.body);
        let chosen = r.chosen.clone().unwrap_or_default().split(',').next().unwrap_or_default().to_string();
        let reported = wait_until(Duration::from_secs(10), || h.observations().len() >= 74 + turn);
        assert!(reported, "turn {turn} was not reported");
        let ttft = h.observations()[73 + turn]["ttft_ms"].as_f64().unwrap_or(f64::NAN);
        let index = h.stack.state.servers.iter().position(|s| s.to_string() == chosen).unwrap();
        // vLLM's own count of the prompt, from the stream's usage.
        let prompt_tokens = r
            .body
            .split("\"prompt_tokens\":")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<f64>().ok())
            .unwrap_or(f64::NAN);
        turns.push((chosen.clone(), ttft, hits(&chosen) - before[index], prompt_tokens));
    }
    eprintln!("conversation turns (server, TTFT ms, vLLM prefix-cache hits, prompt tokens): {turns:?}");
    let ((first_at, first_ttft, _, first_tokens), (second_at, second_ttft, second_hits, _)) = (&turns[0], &turns[1]);
    assert_eq!(second_at, first_at, "the later turn went where its conversation is cached: {turns:?}");
    // vLLM caches whole blocks of 16 tokens, and the first turn's last words tokenize otherwise
    // once the second turn goes on from them: most of the first turn, not all of it.
    assert!(*second_hits >= 0.75 * first_tokens, "vLLM found the conversation cached: {turns:?}");
    assert!(*second_ttft < 0.5 * first_ttft, "the cached turn's first token came sooner: {turns:?}");

    // The reports were trained on: a round fitted a model to them and judged it against
    // the profiled prior on the held-out reports (it serves only if it beat the prior;
    // on a few dozen reports of this engine it may not).
    let rounds = |h: &Harness| {
        let text = h.get(&format!("{}/metrics", h.predictor())).map(|r| r.body).unwrap_or_default();
        headroom_stack::http::metric_sum(&text, "headroom_model_trainings_total")
    };
    assert!(wait_until(Duration::from_secs(60), || rounds(&h) >= 1.0), "no training round ran on the reports");
}
