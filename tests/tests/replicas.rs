//! Two predictor replicas behind the real Envoy (two worker threads, so two Wasm VMs):
//! every call for the pool reaches the replica that owns it, so no request in flight is
//! counted on the wrong one; when the owner stops, both workers fail over to the other.

use std::collections::BTreeMap;
use std::time::Duration;

use headroom_e2e::{wait_until, Harness, StackOptions, SLO};
use headroom_filter_core::shards::preference;
use headroom_stack::StackState;
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
    let clusters: Vec<String> = (0..2).map(|i| StackState::predictor_cluster(i, 2)).collect();
    let owner = preference(&clusters, "default")[0];
    let other = 1 - owner;

    // 16 long streams at once, each on its own connection: the kernel spreads the
    // connections over both Envoy workers, each with its own Wasm VM and queues.
    const N: usize = 16;
    let gateway = h.gateway();
    let streams: Vec<_> = (0..N)
        .map(|i| {
            let url = format!("{gateway}/v1/completions");
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
                let body = json!({"model": "sim-llama-8b", "prompt": format!("request {i} ").repeat(50),
                                  "max_tokens": 400, "stream": true});
                let mut req = client.post(url).header("content-type", "application/json").body(body.to_string());
                for (k, v) in SLO {
                    req = req.header(k, v);
                }
                let res = req.send().unwrap();
                (res.status().as_u16(), res.text().unwrap_or_default())
            })
        })
        .collect();

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
}
