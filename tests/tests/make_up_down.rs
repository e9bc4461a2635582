//! `headroom-stack up` / `down` (what `make up` / `make down` run) leave no process behind,
//! and `up` with no settings runs the benchmark's best router: flow control on the p90
//! objective.

use std::process::Command;
use std::time::Duration;

use headroom_e2e::burst::{self, join, spawn};
use headroom_stack::{http, locate, wait_until, StackState};

#[test]
fn up_curl_down_leaves_nothing_running() {
    let bin = locate::bin_dir().unwrap().join("headroom-stack");
    let run_dir = std::env::temp_dir().join(format!("headroom-updown-{}", std::process::id()));
    let up = Command::new(&bin).args(["--run-dir", run_dir.to_str().unwrap(), "up"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&up.stdout).to_string();
    assert!(up.status.success(), "up failed: {stdout}\n{}", String::from_utf8_lossy(&up.stderr));
    for prefix in ["gateway: http://127.0.0.1:", "predictor: http://127.0.0.1:", "server: http://127.0.0.1:"] {
        assert!(stdout.lines().any(|l| l.starts_with(prefix)), "missing {prefix:?} in:\n{stdout}");
    }
    assert_eq!(stdout.lines().filter(|l| l.starts_with("server: ")).count(), 3);
    let state = StackState::load(&run_dir).unwrap().expect("up records its processes");
    assert_eq!(state.procs.len(), 3);

    let (status, body) = http::get(state.gateway, "/v1/models").unwrap();
    assert_eq!(status, 200, "{body}");

    let down = Command::new(&bin).args(["--run-dir", run_dir.to_str().unwrap(), "down"]).output().unwrap();
    assert!(down.status.success());
    assert!(
        wait_until(Duration::from_secs(10), || state.procs.iter().all(|p| !headroom_stack::process::is_ours(p))),
        "processes left running after down: {:?}",
        state.procs
    );
    assert!(StackState::load(&run_dir).unwrap().is_none(), "down removes the record");
    let _ = std::fs::remove_dir_all(&run_dir);
}

/// `make up` with no settings: the filter's flow control and the predictor's p90 objective
/// (the defaults, docs/configuration.md "Profiles"). A burst of long batch prompts fills the
/// three servers and waits in the predictor's queue; interactive requests sent into it are
/// served within their SLO ahead of the batch requests still waiting, and sheddable ones are
/// shed at once.
#[test]
fn up_with_no_settings_queues_a_burst_serves_interactive_first_and_sheds_the_sheddable() {
    let bin = locate::bin_dir().unwrap().join("headroom-stack");
    let run_dir = std::env::temp_dir().join(format!("headroom-upburst-{}", std::process::id()));
    let up = Command::new(&bin).args(["--run-dir", run_dir.to_str().unwrap(), "up"]).output().unwrap();
    assert!(up.status.success(), "up failed: {}", String::from_utf8_lossy(&up.stderr));
    let state = StackState::load(&run_dir).unwrap().expect("up records its processes");
    let down = || {
        let out = Command::new(&bin).args(["--run-dir", run_dir.to_str().unwrap(), "down"]).output();
        assert!(out.is_ok_and(|o| o.status.success()), "down failed");
        let _ = std::fs::remove_dir_all(&run_dir);
    };
    let gateway = format!("http://{}", state.gateway);
    let metrics = || http::get(state.predictor, "/metrics").map(|(_, body)| body).unwrap_or_default();
    let (_, models) = http::get(state.predictor, "/v1/models").unwrap();
    let objective = serde_json::from_str::<serde_json::Value>(&models).unwrap()["objective"].clone();

    // 48 prompts of 6,000 tokens a server: each server's queue is seconds long, so most wait.
    let batch = spawn(&gateway, 144, 6000, 10, Some((BATCH_SLO_MS, 0)));
    let filled = wait_until(Duration::from_secs(5), || burst::queued(&metrics()) >= 8.0);
    let interactive = spawn(&gateway, 6, 100, 10, Some((INTERACTIVE_SLO_MS, 0)));
    let sheddable = spawn(&gateway, 6, 100, 10, Some((SHEDDABLE_SLO_MS, -1)));
    let (interactive, sheddable, batch) = (join(interactive), join(sheddable), join(batch));
    let released = http::metric_with(&metrics(), "headroom_flow_outcomes_total", "outcome=\"released\"");
    down();

    assert_eq!(objective, "p90", "the predictor's default objective: {models}");
    assert!(filled, "batch requests wait in the predictor's queue: flow control is on by default");
    assert!(released >= 8.0, "batch requests waited, then went when capacity freed: {released}");
    assert!(interactive.iter().chain(&batch).all(|s| s.status == 200), "critical work is never dropped");
    for s in &sheddable {
        assert_eq!(s.status, 429, "sheddable requests are shed when the fleet is full: {s:?}");
        assert!(s.retry_after.is_some(), "{s:?}");
    }
    let served = |s: &burst::Seen| s.sent + s.first_byte;
    let last_interactive = interactive.iter().map(served).max().unwrap();
    for i in &interactive {
        assert!(i.first_byte <= Duration::from_millis(u64::from(INTERACTIVE_SLO_MS)), "interactive SLO met: {i:?}");
    }
    // Served first: the batch requests sent before them still had no first token when the last
    // interactive one had its own.
    let behind = batch.iter().filter(|b| served(b) > last_interactive).count();
    assert!(behind >= 8, "batch requests still waited when the last interactive one was served: {behind}");
}

/// TTFT SLOs of the three classes.
const INTERACTIVE_SLO_MS: u32 = 3000;
const BATCH_SLO_MS: u32 = 30_000;
const SHEDDABLE_SLO_MS: u32 = 1500;
