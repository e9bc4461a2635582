//! `headroom-stack up` / `down` (what `make up` / `make down` run) leave no process behind.

use std::process::Command;
use std::time::Duration;

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
