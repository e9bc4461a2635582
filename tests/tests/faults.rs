//! Faults under steady load, through the real Envoy: what the clients see when a part of
//! the system fails mid-traffic, and that it comes back (docs/reliability.md, "Faults").
//!
//! Each test runs a few clients sending completions back to back ([`SteadyLoad`]), breaks
//! one thing, repairs it, and checks every outcome. "Caused by headroom" means any failure
//! a request meets other than on the model server that was itself killed.

use std::time::{Duration, Instant};

use headroom_bench::soak::Books;
use headroom_e2e::fake_predictor::{FakePredictor, Misbehaviour};
use headroom_e2e::load::{Sent, SteadyLoad};
use headroom_e2e::{wait_until, Harness, StackOptions, SLO};
use headroom_stack::http::{metric_sum, metric_with};
use serde_json::json;

fn options() -> StackOptions {
    let plugin = json!({"debug_headers": true});
    StackOptions { plugin: plugin.as_object().cloned().unwrap_or_default(), ..Default::default() }
}

/// Every request that failed, as a line each (empty when none did).
fn failures(sent: &[Sent]) -> Vec<String> {
    sent.iter()
        .filter(|s| !s.ok())
        .map(|s| format!("status {} served by {:?}: {:?}", s.status, s.served_by, s.error))
        .collect()
}

/// Requests sent in `[from, to)` routed by prediction (tier positive or negative).
fn predicted_between(sent: &[Sent], from: Instant, to: Instant) -> usize {
    sent.iter()
        .filter(|s| s.at >= from && s.at < to)
        .filter(|s| matches!(s.tier.as_deref(), Some("positive") | Some("negative")))
        .count()
}

fn predictor_metrics(h: &Harness) -> String {
    h.get(&format!("{}/metrics", h.predictor())).map(|r| r.body).unwrap_or_default()
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn predictor_killed_and_restarted_under_load_serves_every_request_and_keeps_the_reports() {
    // Without flow control, so the calls are coalesced and ride the predict stream: what
    // this test follows through the kill (a request that offers to wait makes its own call).
    let mut plugin = options().plugin;
    plugin.insert("flow_control".into(), json!(false));
    let mut h = Harness::start_opts(StackOptions { plugin, ..options() }).unwrap();
    let load = SteadyLoad::start(h.gateway(), 8, 6, true, Duration::from_millis(20));
    std::thread::sleep(Duration::from_secs(2));
    // The coalesced calls went on the workers' predict streams (docs/protocol.md).
    let on_stream = h.envoy_stat("headroom_predict_calls_on_stream");
    assert!(on_stream >= 10.0, "{on_stream} calls went on the predict stream before the kill");
    let opened = h.envoy_stat("headroom_predict_stream_opened");
    let killed = Instant::now();
    h.stack.kill_named("predictor");
    // `kill_named` returns once the process is reaped: a report can reach the old predictor
    // only before this instant. Between `killed` and here (a few ms when the host is busy) a
    // batch may still have been answered by it, and then the new one never sees it.
    let dead = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let on_stream_down = h.envoy_stat("headroom_predict_calls_on_stream");
    h.stack.start_predictor().unwrap();
    let restarted = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let sent = load.stop();
    // The streams closed with the predictor and were opened again to the new one, and the
    // calls went back on them.
    assert!(h.envoy_stat("headroom_predict_stream_closed") >= 1.0, "the streams closed with the predictor");
    assert!(h.envoy_stat("headroom_predict_stream_opened") > opened, "the streams reopened after the restart");
    let on_stream_after = h.envoy_stat("headroom_predict_calls_on_stream") - on_stream_down;
    assert!(on_stream_after >= 10.0, "{on_stream_after} calls went on the reopened streams");

    assert_eq!(failures(&sent), Vec::<String>::new(), "no request may fail while the predictor is down");
    let during = sent.iter().filter(|s| s.at >= killed + Duration::from_millis(500) && s.done < restarted).count();
    assert!(during >= 10, "traffic went on during the outage ({during} requests)");
    assert!(
        sent.iter()
            .filter(|s| s.at >= killed + Duration::from_millis(500) && s.done < restarted)
            .all(|s| s.tier.as_deref() != Some("positive")),
        "nothing is routed by prediction without a predictor"
    );
    // The fallback's states froze with the predictor: ranked on them alone, each worker sent
    // every request of the outage to the one server they put first (measured with these 8
    // clients: all of them on one server). What each worker has open on each server spreads
    // them (measured: 34-55% on the busiest, ties going to the freest KV cache).
    let fallback: Vec<&str> = sent
        .iter()
        .filter(|s| s.at >= killed + Duration::from_millis(500) && s.done < restarted)
        .filter(|s| s.tier.as_deref() == Some("fallback"))
        .filter_map(|s| s.served_by.as_deref())
        .collect();
    let per_server: Vec<usize> =
        h.stack.state.servers.iter().map(|srv| fallback.iter().filter(|s| **s == srv.to_string()).count()).collect();
    assert!(
        fallback.len() >= 10 && per_server.iter().all(|&n| n > 0 && n * 3 <= fallback.len() * 2),
        "the fallback spread its requests over every server, none taking two thirds: {per_server:?}"
    );
    let after = predicted_between(&sent, restarted + Duration::from_secs(1), Instant::now());
    assert!(after >= 10, "routing by prediction resumes after the restart ({after} requests)");

    // The reports of requests finished during the outage waited in the filter and reach the
    // new predictor; none was dropped from the filter's queues. Counted from `dead`: reports
    // of requests that finished while the kill landed may have gone to the old predictor.
    let finished_after_kill = sent.iter().filter(|s| s.done >= dead).count() as f64;
    let delivered = wait_until(Duration::from_secs(10), || {
        metric_with(&predictor_metrics(&h), "headroom_reports_total", "result=\"accepted\"") >= finished_after_kill
    });
    let accepted = metric_with(&predictor_metrics(&h), "headroom_reports_total", "result=\"accepted\"");
    // Checked first: a queue overflow, a refused batch or an oversized item would say why.
    for lost in ["headroom_reports_dropped", "headroom_reports_refused", "headroom_reports_oversized"] {
        assert_eq!(h.envoy_stat(lost), 0.0, "{lost}");
    }
    assert!(
        delivered,
        "{accepted} reports reached the restarted predictor, {finished_after_kill} requests finished after the kill"
    );
}

#[test]
fn predictor_frozen_past_the_timeout_under_load_falls_back_then_recovers() {
    let h = Harness::start_opts(options()).unwrap();
    let pid = h.stack.pid("predictor").unwrap();
    let load = SteadyLoad::start(h.gateway(), 3, 6, true, Duration::from_millis(20));
    std::thread::sleep(Duration::from_secs(2));
    signal(pid, "-STOP");
    let frozen = Instant::now();
    // Flow control is on by default: the requests sent in the freeze's first second offered
    // to wait, and their calls may rightly stay open for `flow_max_wait_ms`. Clients that
    // come once the predictor has been silent a second do not offer to wait (`vm::SILENT_MS`).
    std::thread::sleep(Duration::from_millis(1500));
    let late = SteadyLoad::start(h.gateway(), 3, 6, true, Duration::from_millis(20));
    std::thread::sleep(Duration::from_millis(1500));
    signal(pid, "-CONT");
    let thawed = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let (sent, late) = (load.stop(), late.stop());

    assert_eq!(failures(&sent), Vec::<String>::new(), "a frozen predictor fails no request");
    assert_eq!(failures(&late), Vec::<String>::new(), "a frozen predictor fails no request");
    assert!(h.envoy_stat("headroom_fallback_timeout") >= 1.0, "the callouts timed out and fell back");
    assert!(h.envoy_stat("headroom_flow_withheld") >= 1.0, "requests stopped offering to wait");
    let slow: Vec<f64> = late
        .iter()
        .filter(|s| s.at >= frozen + Duration::from_millis(1500) && s.done < thawed)
        .map(|s| (s.done - s.at).as_secs_f64())
        .collect();
    assert!(slow.len() >= 5, "traffic went on while the predictor was frozen");
    // The callout gives up after predictor_timeout_ms (50 ms by default): never a hang.
    assert!(slow.iter().all(|&s| s < 2.0), "requests during the freeze took {slow:?} s");
    // Those that offered to wait first were answered when the predictor came back, not
    // later: their wait is bounded by the freeze, well inside `flow_max_wait_ms`.
    let waited = sent.iter().filter(|s| s.at >= frozen && s.at < frozen + Duration::from_millis(900));
    assert!(waited.clone().all(|s| s.done < thawed + Duration::from_secs(2)), "held past the thaw");
    let after = predicted_between(&sent, thawed + Duration::from_secs(1), Instant::now())
        + predicted_between(&late, thawed + Duration::from_secs(1), Instant::now());
    assert!(after >= 10, "routing by prediction resumes after the thaw ({after} requests)");
}

/// What a simulated server's fault met so far (`GET /fault/completions`).
fn faulted(h: &Harness, server: std::net::SocketAddr) -> u64 {
    let body = h.get(&format!("http://{server}/fault/completions")).map(|r| r.json()).unwrap_or_default();
    body["faulted"].as_u64().unwrap_or(0)
}

fn set_fault(h: &Harness, server: std::net::SocketAddr, mode: &str) {
    let put = h.http.put(format!("http://{server}/fault/completions")).body(mode.to_string()).send();
    assert!(put.is_ok_and(|r| r.status().as_u16() == 204), "fault {mode} set on {server}");
}

/// What six clients met while a server misbehaved as `mode` (`PUT /fault/completions`).
struct Faulted {
    sent: Vec<Sent>,
    /// Requests the fault met in the first `settle`, and in the `measure` after it.
    before: u64,
    after: u64,
    /// Requests sent in the `measure` after `settle`.
    sent_after: usize,
}

/// Sets `victim`'s fault to `mode` and runs six streaming clients on the gateway for
/// `settle` (the gateway finding the fault out), then `measure`; the fault is left on.
fn under_fault(h: &Harness, victim: std::net::SocketAddr, mode: &str, settle: Duration, measure: Duration) -> Faulted {
    set_fault(h, victim, mode);
    let load = SteadyLoad::start(h.gateway(), 6, 8, true, Duration::from_millis(250));
    std::thread::sleep(settle);
    let (settled, before) = (Instant::now(), faulted(h, victim));
    std::thread::sleep(measure);
    let sent = load.stop();
    let after = faulted(h, victim) - before;
    let sent_after = sent.iter().filter(|s| s.at >= settled).count();
    Faulted { sent, before, after, sent_after }
}

/// A server that answers 500 at once while its metrics look idle is, to every load signal,
/// the idlest in the pool: routing on load alone sent it 46% of a three-server pool's
/// requests. The gateway's passive health ejects it after three failures in a row (the
/// filter's and the predictor's, and Envoy's outlier detection), Envoy's retry serves each
/// of its 500s on the next endpoint of the destination list, and once ejected it is probed
/// once a term. Measured: the share it drew after the first 5 s, and that no client saw a
/// failure.
#[test]
fn a_server_failing_fast_with_idle_metrics_is_ejected_and_no_client_sees_its_500s() {
    let h = Harness::start_opts(options()).unwrap();
    let victim = h.stack.state.servers[0];
    let Faulted { sent, before: faulted_then, after: faulted_after, sent_after: after } =
        under_fault(&h, victim, "fail", Duration::from_secs(5), Duration::from_secs(15));
    let share = faulted_after as f64 / after.max(1) as f64;
    eprintln!(
        "failing server: {} requests in the first 5 s, {faulted_after} of {after} after ({:.1}%); {} sent",
        faulted_then,
        100.0 * share,
        sent.len()
    );
    assert!(after >= 100, "load went on ({after} requests after 5 s)");
    assert_eq!(failures(&sent), Vec::<String>::new(), "every 500 was retried on another server");
    assert!(share <= 0.05, "the failing server drew {faulted_after} of {after} requests after 5 s");
    assert!(h.envoy_stat("headroom_endpoint_ejected") >= 1.0, "the filter ejected it");
    let ejections = metric_sum(&predictor_metrics(&h), "headroom_endpoint_ejections_total");
    assert!(ejections >= 1.0, "the predictor ejected it from reports ({ejections})");
    assert!(sent.iter().all(|s| s.served_by.as_deref() != Some(victim.to_string().as_str())));
    // Back to health: once a probe succeeds it draws its share again.
    set_fault(&h, victim, "ok");
    let load = SteadyLoad::start(h.gateway(), 6, 8, true, Duration::from_millis(250));
    let back = wait_until(Duration::from_secs(70), || h.server_metric(victim, "vllm:prompt_tokens_total") > 0.0);
    load.stop();
    assert!(back, "served again after its ejection ended");
}

/// A server that takes requests and never answers (a wedged engine behind a listening
/// socket) holds each request it gets until Envoy's per-try timeout, which the filter sets
/// from the request's goals: three times the 2 s TTFT goal for these streams. Envoy then
/// retries the request on the next endpoint, and passive health counts the failure, so
/// after three the server is ejected and only probed. Measured: the longest any request
/// took, that none failed, and the hung server's share once it was found out.
#[test]
fn a_hung_server_holds_no_request_past_its_slo_timeout_and_is_ejected() {
    let h = Harness::start_opts(options()).unwrap();
    let victim = h.stack.state.servers[0];
    // Its first requests time out at 6 s and eject it (each Envoy worker's VM after three).
    let Faulted { sent, before: held_then, after: held_after, sent_after: after } =
        under_fault(&h, victim, "hang", Duration::from_secs(10), Duration::from_secs(12));
    set_fault(&h, victim, "ok");
    let longest = sent.iter().map(|s| s.done - s.at).max().unwrap_or_default();
    eprintln!(
        "hung server: held {held_then} requests in the first 10 s, {held_after} of {after} after; \
         the longest request {longest:?}; {} sent",
        sent.len()
    );
    assert_eq!(failures(&sent), Vec::<String>::new(), "every held request was retried on another server");
    assert!(held_then >= 1, "the hung server was tried");
    // 6 s of the timeout, then the retry's own few milliseconds, on a busy host.
    assert!(longest <= Duration::from_secs(9), "a request was held {longest:?}, past its 6 s per-try timeout");
    assert!(after >= 100, "load went on ({after} requests after 10 s)");
    assert!(held_after as f64 <= 0.05 * after as f64, "the hung server held {held_after} of {after} after 10 s");
    assert!(h.envoy_stat("headroom_endpoint_ejected") >= 1.0, "the filter ejected it");
}

#[test]
fn a_model_server_killed_mid_stream_fails_only_its_streams_teaches_nothing_and_returns() {
    // One fallback, as docs/deploy.md advises: a request sent to the server in the instant
    // between its death and the predictor's next scrape is retried elsewhere by Envoy
    // (see the test above).
    let mut plugin = options().plugin;
    plugin.insert("fallback_endpoints".into(), json!(1));
    let mut h = Harness::start_opts(StackOptions { server_processes: true, plugin, ..options() }).unwrap();
    let victim = h.stack.state.servers[1].to_string();
    // Streams of 150 tokens (about 2 s each) so some are open on every server at the kill.
    let load = SteadyLoad::start(h.gateway(), 4, 150, true, Duration::from_millis(10));
    std::thread::sleep(Duration::from_secs(4));
    // Kill it mid-stream: with 4 clients on 3 servers routing can leave it idle for a
    // moment, and then the test would have nothing to cut. Its own count says when a
    // stream is running there (the predictor's in-flight count lags by a report flush).
    let server = h.stack.state.servers[1];
    let busy = wait_until(Duration::from_secs(10), || h.server_metric(server, "vllm:num_requests_running") >= 1.0);
    assert!(busy, "a stream runs on the server to be killed");
    let killed = Instant::now();
    h.stack.kill_server(1);
    std::thread::sleep(Duration::from_secs(4));
    h.stack.start_server(1).unwrap();
    let restarted = Instant::now();
    // Back in the pool once scraped again (every 100 ms); then new requests reach it. Its
    // own counter says when one has (the process is new: any prompt token is a new request).
    let reached = wait_until(Duration::from_secs(20), || h.server_metric(server, "vllm:prompt_tokens_total") > 0.0);
    std::thread::sleep(Duration::from_secs(2));
    let sent = load.stop();
    let in_flight = h.in_flight(&victim);

    // A request open on the server when it died fails one of two ways: cut mid-stream (its
    // 200 and `x-served-by` had come), or reset before its headers (Envoy's 503; the request
    // was sent, so it is not retried). The kill follows the first sign of a running stream,
    // so the second happens too (measured: 1 run in 28).
    let failed: Vec<&Sent> = sent.iter().filter(|s| !s.ok()).collect();
    assert!(!failed.is_empty(), "some streams were open on the killed server");
    let on_victim = |s: &Sent| match s.status {
        200 => s.served_by.as_deref() == Some(victim.as_str()),
        503 => s.served_by.is_none() && s.chosen.as_deref() == Some(victim.as_str()),
        _ => false,
    };
    for s in &failed {
        assert!(on_victim(s), "only streams on the killed server fail: {s:?}");
        assert!(s.at < killed, "only streams already open on it fail: {s:?}");
    }
    let cut_mid_stream = failed.iter().filter(|s| s.status == 200).count();
    let healthy = sent.iter().filter(|s| s.ok() && s.served_by.as_deref() != Some(&victim)).count();
    assert!(healthy >= 10, "the other servers went on serving ({healthy})");
    // While it was down nothing new was served by it; after its return, requests reach it again.
    assert!(!sent.iter().any(|s| s.at > killed && s.done < restarted && s.served_by.as_deref() == Some(&victim)));
    let back = sent.iter().filter(|s| s.at > restarted && s.ok() && s.served_by.as_deref() == Some(&victim)).count();
    let after: Vec<String> = sent
        .iter()
        .filter(|s| s.at > restarted)
        .map(|s| format!("{:?}/{:?}/{}", s.served_by, s.tier, s.status))
        .collect();
    assert!(
        reached && back >= 1,
        "the restarted server serves again (reached: {reached}, predictor's in-flight count there: \
         {in_flight:?}); sent after its restart: {after:?}"
    );

    // The cut streams were reported with status 0, the reset ones with their 503: tracking
    // ended, no sample was filed (only a 200 teaches).
    assert!(wait_until(Duration::from_secs(8), || h.envoy_stat("headroom_response_cut_off") >= cut_mid_stream as f64));
    let obs = h.observations();
    let of_victim =
        |status: u64| obs.iter().filter(|o| o["endpoint"] == victim.as_str() && o["status"] == status).count();
    let (cut, reset) = (of_victim(0), of_victim(503));
    assert!(cut >= cut_mid_stream, "{cut} observations of {victim} with status 0, {cut_mid_stream} streams cut");
    assert!(cut + reset >= failed.len(), "{cut} + {reset} observations of {victim} failed, {} requests", failed.len());
}

/// The moment a server dies, the predictor cannot know yet (its next scrape is up to
/// `scrape_interval_ms` away), so a request may still be sent there. A connect failure
/// never reached the server, so Envoy retries it: on the destination header's next
/// address (`fallback_endpoints: 1`), or without one on the fallback policy, which
/// `previous_hosts` keeps off the dead server. Either way the client never sees it, and
/// after three such retries the filter's passive health ejects the dead server from its
/// choices, though the predictor still ranks it first.
#[test]
fn a_connect_failure_on_the_chosen_server_is_retried_elsewhere() {
    for fallbacks in [1, 0] {
        let fake = FakePredictor::start(Misbehaviour::Ranked).unwrap();
        // No exploration: every request goes to the prediction's pick, the dead server.
        let plugin = json!({"debug_headers": true, "fallback_endpoints": fallbacks, "negative_tier_epsilon": 0.0});
        let mut h = Harness::start_opts(StackOptions {
            plugin: plugin.as_object().cloned().unwrap_or_default(),
            external_predictor: Some(fake.addr),
            server_processes: true,
            ..Default::default()
        })
        .unwrap();
        let (dead, alive) = (h.stack.state.servers[1].to_string(), h.stack.state.servers[0].to_string());
        *fake.ranking.lock().unwrap() = vec![dead.clone(), alive.clone()];
        h.stack.kill_server(1);
        let mut dead_picks = Vec::new();
        for i in 0..12 {
            let r = h.completion(3, i % 2 == 0, &SLO).unwrap();
            assert_eq!(r.status, 200, "{fallbacks} fallbacks: retried elsewhere: {}", r.body);
            let served_by = r.served_by.unwrap_or_default();
            assert_ne!(served_by, dead);
            let picked_dead = r.chosen.as_deref().is_some_and(|c| c.starts_with(dead.as_str()));
            if fallbacks == 1 && picked_dead {
                assert_eq!(served_by, alive, "the listed fallback, not any server");
            }
            dead_picks.push(picked_dead);
        }
        // Three per Envoy worker's VM (two workers), then it is ejected.
        let picks = dead_picks.iter().filter(|p| **p).count();
        assert!((3..=6).contains(&picks) && dead_picks[..3].iter().all(|p| *p), "the dead pick: {dead_picks:?}");
        assert!(!dead_picks[11], "ejected after three retries away from it: {dead_picks:?}");
    }
}

#[test]
fn a_server_whose_metrics_hang_or_are_garbage_leaves_routing_and_returns() {
    let h = Harness::start_opts(options()).unwrap();
    let victim = h.stack.state.servers[2];
    let fault = |mode: &str| {
        let r = h.http.put(format!("http://{victim}/fault/metrics")).body(mode.to_string()).send().unwrap();
        assert!(r.status().is_success(), "fault {mode}: {}", r.status());
    };
    let load = SteadyLoad::start(h.gateway(), 3, 6, true, Duration::from_millis(20));
    std::thread::sleep(Duration::from_secs(2));
    let scrapes_failed = |h: &Harness| metric_with(&predictor_metrics(h), "headroom_scrapes_total", "result=\"error\"");
    let before = scrapes_failed(&h);
    fault("hang");
    let broken = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    fault("garbage");
    std::thread::sleep(Duration::from_secs(4));
    let broken_until = Instant::now();
    fault("ok");
    std::thread::sleep(Duration::from_secs(4));
    let sent = load.stop();

    assert_eq!(failures(&sent), Vec::<String>::new(), "a server's broken metrics fail no request");
    assert!(scrapes_failed(&h) > before, "the predictor saw the scrapes fail");
    // The predictor kept answering (a hung scrape holds no lock the predict path needs).
    let predicted = predicted_between(&sent, broken_until - Duration::from_secs(5), broken_until);
    assert!(predicted >= 10, "routing by prediction went on for the other servers ({predicted})");
    let victim = victim.to_string();
    // Once its last good scrape is older than stale_after_ms (5 s), it gets no prediction, so
    // nothing is placed there by prediction. (A callout that timed out on the busy host falls
    // back to the composite over the last states, which may still pick it: it serves fine.)
    let stale = broken + Duration::from_millis(5500);
    let by_prediction = |s: &&Sent| matches!(s.tier.as_deref(), Some("positive") | Some("negative"));
    let misplaced: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.at > stale && s.done < broken_until && s.served_by.as_deref() == Some(&victim))
        .filter(by_prediction)
        .collect();
    assert!(misplaced.is_empty(), "placed by prediction on the server without fresh metrics: {misplaced:?}");
    let back = sent
        .iter()
        .filter(|s| s.at > broken_until + Duration::from_secs(1))
        .filter(|s| s.served_by.as_deref() == Some(&victim))
        .count();
    assert!(back >= 1, "the server returns to routing once its metrics are fine");
}

#[test]
fn envoy_hot_restart_with_fewer_workers_fails_no_request_and_keeps_routing() {
    let mut h = Harness::start_opts(StackOptions { envoy_hot_restart: true, ..options() }).unwrap();
    // Short requests: every one finishes within the old epoch's drain time.
    let load = SteadyLoad::start(h.gateway(), 3, 4, false, Duration::from_millis(20));
    std::thread::sleep(Duration::from_secs(2));
    h.stack.hot_restart_envoy(1).unwrap();
    let restarted = Instant::now();
    // The old epoch drains (2 s) and exits (5 s after the new one started).
    std::thread::sleep(Duration::from_secs(7));
    let sent = load.stop();

    assert_eq!(failures(&sent), Vec::<String>::new(), "no request fails across a hot restart");
    let after = predicted_between(&sent, restarted + Duration::from_secs(5), Instant::now());
    assert!(after >= 10, "the new epoch's filter routes by prediction ({after} requests)");
    assert!(h.envoy_stat("headroom_routed_predicted_positive") >= 10.0, "the new epoch's own stats count");
    // What the old epoch dispatched and could not report before it exited is expired by the
    // predictor after in_flight_ttl_s; everything else was reported.
    let b = Books::read(&predictor_metrics(&h), &h.stack.envoy_stats());
    assert!(b.dispatched >= sent.len() as f64 - 5.0, "{} dispatches for {} requests", b.dispatched, sent.len());
    assert_eq!(b.dispatched, b.reported + b.in_flight + b.expired, "{b:?}");
}

#[test]
fn a_data_dir_that_cannot_be_written_under_load_is_a_metric_not_a_failure() {
    // Training rounds from the first 20 samples on, so one tries to persist within seconds.
    let tweak: fn(&mut headroom_predictor_config::Config) = |c| {
        c.model.min_samples = 20;
        c.model.min_new_samples = 10;
    };
    let h = Harness::start_opts(StackOptions { predictor_tweak: tweak, ..options() }).unwrap();
    let data = h.stack.run_dir.join("predictor-data");
    let aside = h.stack.run_dir.join("predictor-data.aside");
    let load = SteadyLoad::start(h.gateway(), 3, 6, true, Duration::from_millis(20));
    std::thread::sleep(Duration::from_secs(2));
    // Tests run as root, for whom permission bits do not stop a write: the directory is
    // taken away and a file put in its place, which fails every write the same way.
    std::fs::rename(&data, &aside).unwrap();
    std::fs::write(&data, b"not a directory").unwrap();
    let failures_metric = |h: &Harness| metric_sum(&predictor_metrics(h), "headroom_persist_failures_total");
    let failed_writes = wait_until(Duration::from_secs(20), || failures_metric(&h) >= 1.0);
    std::fs::remove_file(&data).unwrap();
    std::fs::rename(&aside, &data).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let sent = load.stop();

    assert!(failed_writes, "a training round tried to persist and counted the failure");
    assert_eq!(failures(&sent), Vec::<String>::new(), "an unwritable data dir fails no request");
    assert!(h.get(&format!("{}/readyz", h.predictor())).unwrap().status == 200);
    let end = Instant::now();
    assert!(predicted_between(&sent, end - Duration::from_secs(3), end) >= 5, "routing by prediction went on");
}
