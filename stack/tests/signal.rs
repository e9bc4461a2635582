//! A stack ended by a signal takes its servers' own children with it: the grandchild of an
//! attached process group (what vLLM's engine core is to the stack) does not run on
//! orphaned. The test runs itself again as the stack (`HEADROOM_SIGNAL_CHILD`), signals
//! that copy, and looks for the grandchild.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use headroom_stack::process;

const CHILD: &str = "HEADROOM_SIGNAL_CHILD";
const NAME: &str = "a_stack_ended_by_a_signal_leaves_no_grandchild_running";

/// Alive, and not a zombie waiting for a parent to reap it.
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < timeout, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The stack's side: a group whose leader forks a long sleep, then wait to be signalled.
fn be_the_stack(dir: &Path) {
    let script =
        format!("sleep 300 & echo $! > {}/grandchild.tmp; mv {0}/grandchild.tmp {0}/grandchild; wait", dir.display());
    let (_proc, _child) =
        process::spawn_with("group", Path::new("/bin/sh"), &["-c".into(), script], &[], &dir.join("group.log"), true)
            .unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_stack_ended_by_a_signal_leaves_no_grandchild_running() {
    if let Some(dir) = std::env::var_os(CHILD) {
        be_the_stack(&PathBuf::from(dir));
        return;
    }
    let dir = std::env::temp_dir().join(format!("headroom-signal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut stack = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, &dir)
        .spawn()
        .unwrap();
    let file = dir.join("grandchild");
    wait_for("the grandchild started", Duration::from_secs(10), || file.exists());
    let grandchild: i32 = std::fs::read_to_string(&file).unwrap().trim().parse().unwrap();
    assert!(running(grandchild));

    // SAFETY: kill(2) on the child this test started and still holds.
    unsafe {
        libc::kill(stack.id() as i32, libc::SIGTERM);
    }
    let status = stack.wait().unwrap();
    let gone = {
        let start = Instant::now();
        while running(grandchild) && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        !running(grandchild)
    };
    if !gone {
        // SAFETY: the sleep this test's child forked; left running, it would outlive the test.
        unsafe {
            libc::kill(grandchild, libc::SIGKILL);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "the stack ends as the signal ends it: {status:?}");
    assert!(gone, "the grandchild of the stack's process group ran on after the stack was ended");
}
