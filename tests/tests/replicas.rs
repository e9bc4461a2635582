//! Two predictor replicas behind the real Envoy (two worker threads, so two Wasm VMs):
//! every call for the pool reaches the replica that owns it, so no request in flight is
//! counted on the wrong one; when the owner stops, both workers fail over to the other,
//! and when it is back, requests placed on the other during the outage still end there.
//! Two replicas behind one cluster (a rollout's overlap) split a request's calls; the
//! books each keeps are then bounded by the request's predicted time, not the TTL.

use std::collections::BTreeMap;
use std::time::Duration;

use headroom_e2e::{wait_until, Harness, StackOptions, SLO};
use headroom_filter_core::shards::preference;
use headroom_stack::envoy_config;
use headroom_stack::http::metric_with;
use serde_json::{json, Value};

fn replica_view(h: &Harness, i: usize) -> (u64, usize) {
    let base = format!("http://{}", h.stack.state.predictors[i]);
    let pools = h.get(&format!("{base}/v1/pools")).map(|r| r.json()).unwrap_or(Value::Null);
    let in_flight = pools["pools"][0]["endpoints"]
        .as_array()
        .map(|es| es.iter().filter_map(|e| e["in_flight"].as_u64()).sum())
        .unwrap_or(0);
    let observations = h
        .get_guarded(&format!("{base}/v1/observations?limit=1000"))
        .map(|r| r.json()["observations"].as_array().map_or(0, Vec::len))
        .unwrap_or(0);
    (in_flight, observations)
}

/// `headroom_reports_total{result=...}` of replica `i`.
fn reports(h: &Harness, i: usize, result: &str) -> f64 {
    let text = h.get(&format!("http://{}/metrics", h.stack.state.predictors[i])).map(|r| r.body).unwrap_or_default();
    metric_with(&text, "headroom_reports_total", &format!("result=\"{result}\""))
}

/// `n` long streams through the gateway, each on its own connection and thread.
fn long_streams(h: &Harness, n: usize, max_tokens: u32) -> Vec<std::thread::JoinHandle<(u16, String)>> {
    let gateway = h.gateway();
    (0..n)
        .map(|i| {
            let url = format!("{gateway}/v1/completions");
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(90)).build().unwrap();
                let body = json!({"model": "sim-llama-8b", "prompt": format!("request {i} ").repeat(50),
                                  "max_tokens": max_tokens, "stream": true});
                let mut req = client.post(url).header("content-type", "application/json").body(body.to_string());
                for (k, v) in SLO {
                    req = req.header(k, v);
                }
                let res = req.send().unwrap();
                (res.status().as_u16(), res.text().unwrap_or_default())
            })
        })
        .collect()
}

/// `worker_N.downstream_cx_total` of the gateway listener, per worker.
fn connections_per_worker(h: &Harness) -> BTreeMap<String, u64> {
    let text = h.get(&format!("http://{}/stats", h.stack.state.admin)).map(|r| r.body).unwrap_or_default();
    let port = h.stack.state.gateway.port();
    text.lines()
        .filter(|l| l.starts_with("listener.") && l.contains(&format!("_{port}.worker_")))
        .filter_map(|l| {
            let (name, value) = l.split_once(": ")?;
            let worker = name.split('.').find(|p| p.starts_with("worker_"))?.to_string();
            let count: u64 = value.trim().parse().ok()?;
            name.ends_with(".downstream_cx_total").then_some((worker, count))
        })
        .collect()
}

#[test]
fn one_pool_one_replica_across_both_workers_then_failover() {
    let opts = StackOptions { predictor_replicas: 2, ..Default::default() };
    let h = Harness::start_opts(opts).unwrap_or_else(|e| panic!("stack did not start: {e:#}"));
    let clusters: Vec<String> = (0..2).map(|i| envoy_config::predictor_cluster(i, 2)).collect();
    let owner = preference(&clusters, "default")[0];
    let other = 1 - owner;

    // 16 long streams at once, each on its own connection: the kernel spreads the
    // connections over both Envoy workers, each with its own Wasm VM and queues.
    const N: usize = 16;
    let streams = long_streams(&h, N, 400);

    // While they stream, the owner holds all of them in flight and the other none.
    let mut seen = (0, 0);
    let all_tracked = wait_until(Duration::from_secs(10), || {
        seen = (replica_view(&h, owner).0, replica_view(&h, other).0);
        seen == (N as u64, 0)
    });
    assert!(all_tracked, "in flight (owner, other) = {seen:?}, want ({N}, 0)");
    let workers = connections_per_worker(&h);
    assert!(workers.len() >= 2 && workers.values().all(|&n| n > 0), "connections per worker: {workers:?}");

    for s in streams {
        let (status, body) = s.join().unwrap();
        assert_eq!(status, 200, "{body}");
    }
    // Finished: nothing left in flight, every observation on the owner, none elsewhere.
    let mut end = ((0, 0), (0, 0));
    let settled = wait_until(Duration::from_secs(10), || {
        end = (replica_view(&h, owner), replica_view(&h, other));
        end == ((0, N), (0, 0))
    });
    assert!(settled, "(in flight, observations) owner/other = {end:?}, want ((0, {N}), (0, 0))");

    // The owner stops: requests keep being served, and both workers move to the other replica.
    let mut h = h;
    h.stack.stop_predictor_replica(owner);
    let mut statuses = Vec::new();
    let moved = wait_until(Duration::from_secs(20), || {
        let r = h.completion(5, true, &SLO).unwrap();
        statuses.push(r.status);
        replica_view(&h, other).1 >= 5
    });
    assert!(moved, "the other replica never received the pool's reports: {:?}", replica_view(&h, other));
    assert!(statuses.iter().all(|&s| s == 200), "a request failed during failover: {statuses:?}");
    assert!(h.envoy_stat("headroom_predictor_ejected") >= 1.0, "no ejection counted");

    // Failback. Streams placed on the other replica while the owner is away...
    const M: usize = 6;
    let streams = long_streams(&h, M, 2000);
    let placed = wait_until(Duration::from_secs(10), || replica_view(&h, other).0 == M as u64);
    assert!(placed, "the other replica holds {:?} in flight, want {M}", replica_view(&h, other));
    // ... are still running when the owner is back and the gateway calls it again.
    h.stack.start_predictor_replica(owner).unwrap_or_else(|e| panic!("restarting the owner: {e:#}"));
    let back = wait_until(Duration::from_secs(20), || {
        let _ = h.completion(5, true, &SLO);
        reports(&h, owner, "tracked") >= 3.0
    });
    assert!(back, "the gateway never went back to the owner: {:?}", replica_view(&h, owner));
    assert_eq!(replica_view(&h, other).0, M as u64, "the streams ended before the failback: lengthen them");
    for s in streams {
        let (status, body) = s.join().unwrap();
        assert_eq!(status, 200, "{body}");
    }
    // Their reports went where they were dispatched: the other replica's books are clear at
    // once (not after their expiry), and the owner was sent no report it never dispatched.
    let mut seen = (u64::MAX, -1.0);
    let clear = wait_until(Duration::from_secs(5), || {
        seen = (replica_view(&h, other).0, reports(&h, owner, "not_dispatched"));
        seen == (0, 0.0)
    });
    assert!(clear, "(in flight on the other, reports the owner never dispatched) = {seen:?}, want (0, 0)");
}

/// A rollout's overlap: the old and the new replica both serve the predictor's cluster, and
/// Envoy balances each call over them, so a request's dispatch and its report can reach
/// different ones. The replica left holding a request that was reported elsewhere forgets it
/// a few of its predicted end-to-end times later, or, when its predict call went to the
/// other replica (no record here, no prediction), after `in_flight_min_s` (here: 2 s).
#[test]
fn in_a_rollouts_overlap_split_books_clear_within_the_predicted_time() {
    let opts = StackOptions {
        predictor_replicas: 2,
        predictor_rollout: true,
        predictor_tweak: |c| c.in_flight_min_s = 2,
        // Every batch its own call, each balanced over both replicas.
        plugin: json!({"predict_stream": false, "batch_predictions": false}).as_object().cloned().unwrap_or_default(),
        ..Default::default()
    };
    let h = Harness::start_opts(opts).unwrap_or_else(|e| panic!("stack did not start: {e:#}"));
    for _ in 0..40 {
        let r = h.completion(8, true, &SLO).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let astray: f64 = (0..2).map(|i| reports(&h, i, "not_dispatched")).sum();
    assert!(astray > 0.0, "no report reached a replica that had not seen its dispatch: nothing was tested");
    let mut seen = (u64::MAX, u64::MAX);
    let clear = wait_until(Duration::from_secs(8), || {
        seen = (replica_view(&h, 0).0, replica_view(&h, 1).0);
        seen == (0, 0)
    });
    assert!(clear, "in flight on the two replicas = {seen:?} after the traffic, want (0, 0) within seconds");
}
