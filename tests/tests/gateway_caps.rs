//! More streams at once than Envoy's default circuit breakers allow (1024 connections per
//! cluster), through the real gateway with and without headroom: every one of them runs on
//! the servers at the same time and none waits in Envoy for a connection.
//!
//! Each streaming completion holds its own HTTP/1.1 connection to its server, so with the
//! defaults the whole fleet behind one gateway is capped at 1024 concurrent streams; a
//! decode-heavy benchmark reached that at 150 req/s on 8 servers and its TTFTs grew by
//! seconds while the servers had room (docs/notebook/benchmark.md, "Envoy's connection cap").

use std::time::{Duration, Instant};

use headroom_e2e::{Harness, StackOptions};
use headroom_stack::Router;

/// Streams opened at once: above the default cap of 1024.
const STREAMS: usize = 1100;

/// Opens [`STREAMS`] streaming completions through `router`'s gateway at once, and returns
/// how many ran on the servers at the same time at most, every stream's status, and the
/// gateway's circuit-breaker overflows.
fn many_streams(router: Router) -> (f64, Vec<u16>, Option<u64>) {
    // At 1/100 of real time each token step takes about a second of wall time, so 20 tokens
    // keep every stream open for 20 s: long enough for all of them to be sent through the
    // filter's callouts on two cores.
    let opts = StackOptions { profiles: vec!["h100".into(); 2], time_scale: 0.01, router, ..Default::default() };
    let h = Harness::start_opts(opts).unwrap_or_else(|e| panic!("{router:?} stack did not start: {e:#}"));
    let url = format!("{}/v1/completions", h.gateway());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let statuses = runtime.spawn(async move {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
        let tasks: Vec<_> = (0..STREAMS)
            .map(|i| {
                let (client, url) = (client.clone(), url.clone());
                tokio::spawn(async move {
                    // 500 new streams a second, not all in one instant: a burst of 1100 connects
                    // would test the servers' accept queues rather than the gateway.
                    tokio::time::sleep(Duration::from_millis(2 * i as u64)).await;
                    let body = serde_json::json!({"model": "sim-llama-8b", "prompt": format!("stream {i} ").repeat(8),
                                                  "max_tokens": 20, "stream": true});
                    let reply = client.post(&url).json(&body).send().await;
                    match reply {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let _ = r.bytes().await;
                            status
                        }
                        Err(_) => 0,
                    }
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.push(t.await.unwrap_or(0));
        }
        statuses
    });
    // The servers' running requests, summed, at their highest while the streams are open.
    let mut most = 0.0f64;
    let deadline = Instant::now() + Duration::from_secs(90);
    while !statuses.is_finished() && Instant::now() < deadline {
        let running: f64 = h.stack.state.servers.iter().map(|s| h.server_metric(*s, "vllm:num_requests_running")).sum();
        most = most.max(running);
        std::thread::sleep(Duration::from_millis(200));
    }
    let statuses = runtime.block_on(statuses).unwrap();
    (most, statuses, h.stack.gateway_overflow())
}

#[test]
fn more_streams_than_envoys_default_cap_all_run_at_once_with_and_without_headroom() {
    for router in [Router::LeastRequest, Router::Headroom] {
        let (most, statuses, overflow) = many_streams(router);
        let mut kinds: Vec<u16> = statuses.iter().copied().filter(|s| *s != 200).collect();
        let failed = kinds.len();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(failed, 0, "{router:?}: {failed} of {STREAMS} streams failed (statuses {kinds:?}; 0: no answer)");
        assert_eq!(overflow, Some(0), "{router:?}: Envoy's circuit breakers held requests back");
        assert!(most > 1024.0, "{router:?}: at most {most} streams ran at once; the cap is 1024");
    }
}
