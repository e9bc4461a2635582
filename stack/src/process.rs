//! Child processes started by the stack and stopped by pid.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A process the stack started: enough to find and stop it later, even from
/// another invocation (`make down`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proc {
    pub name: String,
    pub pid: u32,
    /// Canonical path of its executable, checked before signalling the pid.
    pub exe: PathBuf,
    pub log: PathBuf,
    /// Stopped with its whole process group (it leads one): a server that forks workers of
    /// its own (vLLM's engine core) leaves none behind, even when it is killed.
    #[serde(default)]
    pub group: bool,
}

/// Starts `exe args` with output to `log`. `attached`: the child dies with the
/// thread that started it (for tests); otherwise it runs on in its own
/// process group (for `make up`).
pub fn spawn(name: &str, exe: &Path, args: &[String], log: &Path, attached: bool) -> anyhow::Result<(Proc, Child)> {
    start(name, exe, args, &[], false, log, attached)
}

/// [`spawn`] with environment variables `env` set, and the process stopped with its group
/// ([`Proc::group`]).
pub fn spawn_with(
    name: &str,
    exe: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
    attached: bool,
) -> anyhow::Result<(Proc, Child)> {
    start(name, exe, args, env, true, log, attached)
}

#[allow(clippy::too_many_arguments)] // private: the two public entries name what they pass
fn start(
    name: &str,
    exe: &Path,
    args: &[String],
    env: &[(String, String)],
    group: bool,
    log: &Path,
    attached: bool,
) -> anyhow::Result<(Proc, Child)> {
    let out = File::create(log).map_err(|e| anyhow::anyhow!("creating {}: {e}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(exe);
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
    if attached {
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(|e| anyhow::anyhow!("starting {name} ({}): {e}", exe.display()))?;
    if attached && group {
        on_signal::guard(child.id());
    }
    let exe = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
    Ok((Proc { name: name.to_string(), pid: child.id(), exe, log: log.to_path_buf(), group }, child))
}

/// True while `proc` is alive and still the program we started (pids get reused).
/// A binary rebuilt while it runs shows as `<path> (deleted)`: still ours.
pub fn is_ours(proc: &Proc) -> bool {
    let exe = std::fs::read_link(format!("/proc/{}/exe", proc.pid));
    let alive = std::fs::read_to_string(format!("/proc/{}/stat", proc.pid))
        .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false);
    let same = |e: PathBuf| {
        let text = e.to_string_lossy();
        e == proc.exe || text.strip_suffix(" (deleted)").is_some_and(|t| Path::new(t) == proc.exe)
    };
    alive && exe.is_ok_and(same)
}

/// Stops `proc`: SIGTERM, then SIGKILL after `grace` (at once when `grace` is zero).
/// Returns once it is gone.
/// With its `Child` handle the pid is certainly ours (it cannot be reused before we reap it).
pub fn stop(proc: &Proc, child: Option<&mut Child>, grace: Duration) {
    end(proc, child, grace);
    // However it ended (stopped here, or gone before), its group is no longer the signal
    // handler's to kill: the pid may be reused.
    if proc.group {
        on_signal::release(proc.pid);
    }
}

/// [`stop`] without the signal handler's bookkeeping.
fn end(proc: &Proc, child: Option<&mut Child>, grace: Duration) {
    let pid = proc.pid as libc::pid_t;
    let running = match child {
        Some(ref c) => c.id() == proc.pid,
        None => is_ours(proc),
    };
    let mut child = child;
    if let Some(c) = child.as_mut() {
        if matches!(c.try_wait(), Ok(Some(_))) {
            return;
        }
    }
    if !running {
        return;
    }
    // A group leader's group: the pid negated (kill(2)).
    let target = if proc.group { -pid } else { pid };
    // SAFETY: plain kill(2) on a pid verified to be our process just above (or the group it
    // leads, made for it at spawn). No grace: a crash, straight to SIGKILL.
    unsafe {
        libc::kill(target, if grace.is_zero() { libc::SIGKILL } else { libc::SIGTERM });
    }
    let deadline = Instant::now() + grace;
    loop {
        let gone = match child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
            None => !is_ours(proc),
        };
        if gone {
            if proc.group {
                // What the leader left of its group (workers that outlived it) goes with it.
                // SAFETY: the group our spawn made; signalling an empty group is a no-op.
                unsafe {
                    libc::kill(target, libc::SIGKILL);
                }
            }
            return;
        }
        if Instant::now() >= deadline {
            unsafe {
                libc::kill(target, libc::SIGKILL);
            }
            if let Some(c) = child.as_mut() {
                let _ = c.wait();
            } else {
                while is_ours(proc) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process groups of this process's attached children, killed when it is itself ended
/// by a signal. An attached child dies with its parent (`PR_SET_PDEATHSIG`), but not what
/// that child forked: a `headroom-bench` or `headroom-stack demo` stopped by Ctrl-C or
/// SIGTERM (no destructor runs then) left vLLM's engine cores running, orphaned, each with
/// its model in memory and a core busy. The handler only reads atomics and calls kill(2)
/// and raise(3), which are async-signal-safe.
mod on_signal {
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Once;

    /// More groups than any stack starts (two vLLM servers today).
    const SLOTS: usize = 64;
    static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];
    static INSTALL: Once = Once::new();
    /// What ends a process from outside without its destructors: stop, Ctrl-C, hang-up.
    const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

    /// Kills the group led by `leader` should this process be ended by one of [`SIGNALS`].
    pub fn guard(leader: u32) {
        INSTALL.call_once(|| {
            for sig in SIGNALS {
                let handler: extern "C" fn(libc::c_int) = on_signal;
                // SAFETY: installs a handler that only touches atomics and async-signal-safe
                // calls. A signal ignored before (a hang-up under nohup) stays ignored.
                unsafe {
                    if libc::signal(sig, handler as libc::sighandler_t) == libc::SIG_IGN {
                        libc::signal(sig, libc::SIG_IGN);
                    }
                }
            }
        });
        let Ok(pgid) = i32::try_from(leader) else { return };
        for slot in &GROUPS {
            if slot.compare_exchange(0, pgid, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                return;
            }
        }
    }

    /// The group led by `leader` was stopped: nothing to kill for it any more (its pid may
    /// be reused).
    pub fn release(leader: u32) {
        let Ok(pgid) = i32::try_from(leader) else { return };
        for slot in &GROUPS {
            let _ = slot.compare_exchange(pgid, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    extern "C" fn on_signal(sig: libc::c_int) {
        for slot in &GROUPS {
            let pgid = slot.load(Ordering::SeqCst);
            if pgid > 0 {
                // SAFETY: kill(2) is async-signal-safe; the group is one our spawn made.
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
            }
        }
        // Then end as the signal would have: its default action, raised again.
        // SAFETY: signal(2) and raise(3) are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// The last `lines` lines of a log, for error messages.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// CPU time (user + system, all threads) `pid` has used so far, in seconds; `None` once it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / if hz > 0 { hz as f64 } else { 100.0 })
}

/// Resident memory of `pid` in bytes (`VmRSS`); `None` once it is gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let me = std::process::id();
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {}
        assert!(cpu_seconds(me).is_some_and(|s| s > 0.0));
        assert!(rss_bytes(me).is_some_and(|b| b > 1 << 20));
        assert_eq!(cpu_seconds(u32::MAX), None);
    }
}
