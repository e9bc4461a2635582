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
