//! The gateway against hostile clients, through the real Envoy and predictor:
//! each test is one finding of the hardening review (`docs/reliability.md`).

use std::time::Duration;

use headroom_e2e::{patient, wait_until, Harness, StackOptions, SLO};
use headroom_stack::Router;
use serde_json::json;

fn harness(plugin: serde_json::Value) -> Harness {
    match Harness::start(plugin) {
        Ok(h) => h,
        Err(e) => panic!("stack did not start: {e:#}"),
    }
}

#[test]
fn paths_that_differ_only_by_normalisation_are_routed_not_skipped() {
    let h = harness(patient(json!({})));
    let body = json!({"model": "sim-llama-8b", "prompt": "hello there", "max_tokens": 2}).to_string();
    for path in ["//v1/completions", "/v1/completions/", "/v1/%63ompletions", "/v1/./completions", "/v1//completions"] {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend_from_slice(&SLO);
        let r = h.post(path, &headers, &body).unwrap();
        assert!(r.chosen.is_some(), "{path} reached a server without being routed: {}", r.body);
        assert_eq!(r.chosen, r.served_by, "{path}");
        // The simulated server, like vLLM, knows no trailing-slash spelling; routed all the same.
        let want = if path.ends_with('/') { 404 } else { 200 };
        assert_eq!(r.status, want, "{path}: {}", r.body);
    }
}

#[test]
fn the_filter_tracks_requests_by_its_own_ids_and_the_predictor_by_its_token() {
    let h = harness(json!({}));
    // Every client sends the same x-request-id: none may collide in the predictor's tracking.
    let same_id = [SLO[0], SLO[1], SLO[2], ("x-request-id", "same-id-for-all")];
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let gateway = h.gateway();
            std::thread::spawn(move || {
                let body = json!({"model": "sim-llama-8b", "prompt": format!("request {i} ").repeat(30),
                    "max_tokens": 20 + i, "stream": true, "stream_options": {"include_usage": true}});
                let mut req = reqwest::blocking::Client::new().post(format!("{gateway}/v1/completions"));
                for (k, v) in same_id {
                    req = req.header(k, v);
                }
                req.header("content-type", "application/json").body(body.to_string()).send().map(|r| r.status())
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap().unwrap(), 200);
    }
    let ids = || {
        let mut ids: Vec<String> = h
            .observations()
            .iter()
            .filter(|o| o["request"]["max_tokens"].as_u64().is_some_and(|m| (20..28).contains(&m)))
            .filter_map(|o| o["request_id"].as_str().map(str::to_string))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    assert!(wait_until(Duration::from_secs(8), || ids().len() == 8), "distinct ids reported: {:?}", ids());
    assert!(ids().iter().all(|id| id != "same-id-for-all"), "the client's id is not the tracking id");
    for s in &h.stack.state.servers {
        assert!(
            wait_until(Duration::from_secs(5), || h.in_flight(&s.to_string()) == Some(0)),
            "a collision left a request in flight on {s}"
        );
    }

    // The predictor's guarded routes refuse anyone without the token; the filter has it.
    let forged = json!({"reports": []}).to_string();
    let r = h.http.post(format!("{}/v1/report", h.predictor())).header("content-type", "application/json").body(forged);
    assert_eq!(r.send().unwrap().status(), 401);
    let r = h.completion(3, true, &SLO).unwrap();
    assert_eq!(r.tier.as_deref(), Some("positive"), "routed by prediction: the filter's calls carry the token");
    assert_eq!(h.envoy_stat("headroom_fallback_unavailable"), 0.0);
}

#[test]
fn a_tiny_slo_is_held_to_the_floor() {
    let h = harness(json!({}));
    let tiny = [("x-slo-ttft-ms", "2000"), ("x-slo-tpot-ms", "0.000000001"), ("x-prediction-based-scheduling", "true")];
    let r = h.completion(11, true, &tiny).unwrap();
    assert_eq!(r.status, 200, "clamped by default: {}", r.body);
    let slo = || {
        h.observations()
            .into_iter()
            .find(|o| o["request"]["max_tokens"].as_u64() == Some(11))
            .map(|o| o["request"]["slo"]["tpot_ms"].clone())
    };
    assert!(wait_until(Duration::from_secs(5), || slo().is_some()));
    assert_eq!(slo().unwrap(), json!(5.0), "the TPOT SLO other requests are judged against is the floor");
    drop(h);

    let strict = harness(json!({"slo_floor_action": "reject"}));
    let r = strict.completion(3, true, &tiny).unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["field"], "x-slo-tpot-ms");
    assert!(r.served_by.is_none());
}

#[test]
fn a_client_never_picks_its_server_even_when_the_filter_is_skipped() {
    // When the Wasm VM fails, FAIL_OPEN passes requests by without the filter. Envoy
    // itself must still drop the client's destination header, or the client would
    // choose where its request runs: the shipped bootstrap, with the filter left out.
    let opts = StackOptions { router: Router::HeadroomFilterSkipped, ..Default::default() };
    let h = match Harness::start_opts(opts) {
        Ok(h) => h,
        Err(e) => panic!("stack did not start: {e:#}"),
    };
    let servers: Vec<String> = h.stack.state.servers.iter().map(|s| s.to_string()).collect();
    let mut served = std::collections::BTreeSet::new();
    for i in 0..12 {
        let pin = servers[0].as_str();
        let r = h.completion(2, false, &[("x-gateway-destination-endpoint", pin)]).unwrap();
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        assert!(r.chosen.is_none(), "the filter is not running in this test");
        served.insert(r.served_by.unwrap_or_default());
    }
    assert!(served.len() > 1, "every request went to the client's pin {}: {served:?}", servers[0]);
}

/// A client's priority is a claim held to `client_priority_range` (by default it may lower
/// its own, not raise it over anyone's: with flow control a higher band blocks every band
/// below); a trusted filter's header overrides it (docs/reliability.md, "What a client's
/// headers can do").
#[test]
fn a_client_cannot_raise_its_own_priority_and_a_trusted_header_can() {
    let h = harness(json!({"flow_control": true, "trusted_priority_header": "x-auth-priority"}));
    let claims = [
        (vec![("x-request-priority", "2147483647")], 0),
        (vec![("x-request-priority", "-1000")], -1),
        (vec![("x-request-priority", "-1")], -1),
        (vec![("x-request-priority", "9"), ("x-auth-priority", "3")], 3),
    ];
    for (i, (extra, _)) in claims.iter().enumerate() {
        let mut headers = SLO.to_vec();
        headers.extend(extra.iter().copied());
        let r = h.completion(40 + i as u32, false, &headers).unwrap();
        assert!(r.status == 200 || r.status == 429, "{}", r.body);
    }
    let mut seen = Vec::new();
    assert!(wait_until(Duration::from_secs(5), || {
        seen = h
            .observations()
            .iter()
            .filter_map(|o| Some((o["request"]["max_tokens"].as_u64()?, o["request"]["priority"].as_i64()?)))
            .filter(|(m, _)| (40..44).contains(m))
            .collect();
        seen.len() == claims.len()
    }));
    seen.sort_unstable();
    let want: Vec<(u64, i64)> = claims.iter().enumerate().map(|(i, (_, p))| (40 + i as u64, *p)).collect();
    assert_eq!(seen, want, "(max_tokens, priority) as the predictor saw them");
    assert_eq!(h.envoy_stat("headroom_priority_clamped"), 2.0);
}

/// One long stream per endpoint asking 5 ms a token (the floor; an idle simulated H100 steps
/// in about 7) used to become the TPOT target of every later request on its endpoint, so
/// every TPOT-SLO request was negative everywhere. A running SLO now tightens others only
/// where the endpoint could keep it, no tighter than its fastest decode step
/// (`predictor-core/src/pool/mod.rs`, `InFlight::tpot_slo_ms`).
#[test]
fn streams_asking_an_unmeetable_tpot_do_not_make_everyone_negative() {
    let h = harness(json!({}));
    let endpoints: Vec<String> = h.stack.state.servers.iter().map(|s| s.to_string()).collect();
    let tight: Vec<_> = (0..9)
        .map(|i| {
            // Each placement reaches the predictor (20 ms ticks) before the next is decided.
            std::thread::sleep(Duration::from_millis(100));
            let gateway = h.gateway();
            std::thread::spawn(move || {
                let body = json!({"model": "sim-llama-8b", "prompt": format!("tight {i} ").repeat(20),
                    "max_tokens": 700, "stream": true});
                reqwest::blocking::Client::new()
                    .post(format!("{gateway}/v1/completions"))
                    .header("content-type", "application/json")
                    .header("x-slo-ttft-ms", "2000")
                    .header("x-slo-tpot-ms", "5")
                    .header("x-prediction-based-scheduling", "true")
                    .body(body.to_string())
                    .send()
                    .and_then(|r| r.text())
                    .is_ok()
            })
        })
        .collect();
    let running = || endpoints.iter().filter(|e| h.in_flight(e).unwrap_or(0) > 0).count();
    let spread = wait_until(Duration::from_secs(5), || running() == endpoints.len());
    assert!(
        spread,
        "a tight stream on every endpoint: {:?}",
        endpoints.iter().map(|e| h.in_flight(e)).collect::<Vec<_>>()
    );
    for _ in 0..3 {
        let r = h.completion(6, true, &SLO).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.tier.as_deref(), Some("positive"), "the 5 ms streams made every endpoint negative");
    }
    for t in tight {
        assert!(t.join().unwrap(), "a tight stream failed");
    }
}

/// One long stream started by `gateway`'s client with TPOT goal `tpot` (ms), placed by its
/// goals when `routed`: the thread says whether it finished.
fn long_stream(gateway: String, name: &str, tpot: &str, routed: bool) -> std::thread::JoinHandle<bool> {
    let (name, tpot) = (name.to_string(), tpot.to_string());
    std::thread::spawn(move || {
        let body = json!({"model": "sim-llama-8b", "prompt": format!("{name} ").repeat(20),
            "max_tokens": 700, "stream": true});
        // Goals alone route a request by them: an unrouted one opts out.
        reqwest::blocking::Client::new()
            .post(format!("{gateway}/v1/completions"))
            .header("content-type", "application/json")
            .header("x-llm-d-inference-fairness-id", name.as_str())
            .header("x-slo-ttft-ms", "2000")
            .header("x-slo-tpot-ms", tpot.as_str())
            .header("x-prediction-based-scheduling", if routed { "true" } else { "false" })
            .body(body.to_string())
            .send()
            .and_then(|r| r.text())
            .is_ok()
    })
}

/// Streams whose TPOT goal is an idle simulated H100's fastest decode step (about 6.8 ms:
/// met, alone) used to hold every later request on their endpoints to it: two of them sent
/// 181 of 198 other tenants' streams to the one other server. A running goal now holds
/// others only when it leaves the endpoint room for a batch (twice its fastest step), and
/// only for a request placed by its goals (`InFlight::tpot_slo_ms`); a fair tight goal
/// (20 ms) still does, for its own tenant's later requests at its priority, not its peers'
/// (`Booked::slos_for`). Read from the predictor's answer while the streams run.
#[test]
fn a_client_claiming_an_endpoints_fastest_step_reserves_nothing() {
    let h = harness(json!({}));
    let endpoints: Vec<String> = h.stack.state.servers.iter().map(|s| s.to_string()).collect();
    let tightest_for = |tenant: &str| {
        let body = json!({"pool": "default", "request_id": "probe", "request": {"model": "sim-llama-8b",
            "input_tokens": 100, "streaming": true, "slo": {"tpot_ms": 100.0}, "prediction_based": true,
            "tenant": tenant}});
        let answer = h.predict(&body);
        let endpoints = answer["endpoints"].as_array().cloned().unwrap_or_default();
        endpoints.iter().map(|e| e["state"]["tightest_tpot_slo_ms"].as_f64()).collect::<Vec<_>>()
    };
    let running = |n: u64| {
        wait_until(Duration::from_secs(5), || endpoints.iter().filter_map(|e| h.in_flight(e)).sum::<u64>() >= n)
    };
    // Two greedy tenants, placed by their goals, and one that asks 20 ms without being.
    let mut streams = vec![long_stream(h.gateway(), "greedy-a", "7", true)];
    std::thread::sleep(Duration::from_millis(100));
    streams.push(long_stream(h.gateway(), "greedy-b", "7", true));
    std::thread::sleep(Duration::from_millis(100));
    streams.push(long_stream(h.gateway(), "unrouted", "20", false));
    assert!(running(3), "the three streams run");
    for tenant in ["greedy-a", "greedy-b", "unrouted", ""] {
        assert_eq!(tightest_for(tenant), vec![None; endpoints.len()], "no stream holds an endpoint to its goal");
    }
    // A fair tight goal placed by: its endpoint holds its tenant's later requests to it, and
    // no other tenant's at its priority.
    streams.push(long_stream(h.gateway(), "fair", "20", true));
    assert!(running(4), "the fair stream runs");
    let held = tightest_for("fair");
    assert_eq!(held.iter().filter(|t| **t == Some(20.0)).count(), 1, "the fair goal protects its stream: {held:?}");
    for peer in ["greedy-a", ""] {
        assert_eq!(tightest_for(peer), vec![None; endpoints.len()], "{peer:?} is a peer of the fair tenant");
    }
    for s in streams {
        assert!(s.join().unwrap(), "a long stream failed");
    }
}

/// The predictor's token is a secret: Envoy's filter reads it from Envoy's environment, so
/// neither Envoy's `/config_dump` nor its config file carries it, and every file of the
/// stack's that names it can be read by its owner alone. The token used to sit in the
/// plugin configuration, world-readable in `.run/envoy.yaml` and `.run/stack.json` and
/// served by `/config_dump`.
#[test]
fn the_token_is_in_no_config_dump_and_no_file_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let h = harness(json!({}));
    let token = h.stack.state.token.clone().expect("the stack has a token");
    // Requests are routed by prediction: the filter has the token.
    let r = h.completion(4, true, &SLO).unwrap();
    assert_eq!((r.status, r.tier.as_deref()), (200, Some("positive")), "{}", r.body);
    let (status, dump) = headroom_stack::http::get(h.stack.state.admin, "/config_dump").unwrap();
    assert_eq!(status, 200);
    assert!(dump.contains("predictor_token_env"), "the filter's configuration is in the dump");
    assert!(!dump.contains(&token), "the token is in Envoy's /config_dump");
    for entry in std::fs::read_dir(&h.stack.run_dir).unwrap().flatten() {
        let path = entry.path();
        let text = std::fs::read(&path).unwrap_or_default();
        if path.is_file() && text.windows(token.len()).any(|w| w == token.as_bytes()) {
            let mode = entry.metadata().unwrap().permissions().mode() & 0o777;
            assert_eq!(mode & 0o077, 0, "{} names the token with mode {mode:o}", path.display());
        }
    }
}
