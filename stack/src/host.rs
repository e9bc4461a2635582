//! How busy this host's CPUs were during a measurement.
//!
//! The local stack runs Envoy, the predictor, the model servers and the clients on one
//! small host. When its CPUs saturate, latencies measure the host rather than the routing,
//! so the benchmark, the demo and the accuracy run record the share of CPU time the whole
//! host spent busy, and which of its processes spent it ([`ProcessTimes`]). Linux only
//! (`/proc`); elsewhere nothing is recorded.

use std::collections::BTreeMap;

use crate::process::Proc;

/// Cumulative CPU time of all cores, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuTimes {
    /// Now, from `/proc/stat` (`None` where it cannot be read).
    pub fn now() -> Option<CpuTimes> {
        parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Share of CPU time spent busy between `earlier` and `self`, 0..=1 (`None`: no time passed).
    pub fn busy_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)?;
        let busy = self.busy.saturating_sub(earlier.busy);
        Some((busy as f64 / total as f64).min(1.0))
    }
}

/// The host's busy share from now on: [`Busy::percent`] reads it since [`Busy::start`].
#[derive(Debug, Clone, Copy)]
pub struct Busy(Option<CpuTimes>);

impl Busy {
    pub fn start() -> Busy {
        Busy(CpuTimes::now())
    }

    /// Percent of the host's CPU time spent busy since `start` (NaN where unreadable).
    pub fn percent(&self) -> f64 {
        self.0.zip(CpuTimes::now()).and_then(|(a, b)| b.busy_since(&a)).map_or(f64::NAN, |s| s * 100.0)
    }
}

/// Where a measurement's CPU went: each part of the stack's CPU ticks (user and system, every
/// thread), with the host's total, as of a moment. On a CPU host an engine that queues keeps
/// its core busy, so a busy host is no warning; what must stay small is everything that is
/// not an engine: the model servers' API processes, Envoy, the predictor, the load generator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessTimes {
    ticks: BTreeMap<&'static str, u64>,
    total: u64,
}

/// The parts [`ProcessTimes`] tells apart, as the report names them.
pub const ENGINES: &str = "vLLM engines";
pub const API_SERVERS: &str = "vLLM API servers";
pub const SIMULATOR: &str = "simulated servers";
pub const ENVOY: &str = "Envoy";
pub const PREDICTOR: &str = "predictor";
pub const PICKER: &str = "endpoint picker";
pub const LOAD_GENERATOR: &str = "load generator";
/// Everything else the host ran (busy time no process above accounts for).
pub const OTHER: &str = "other";

/// What part of the stack a process it started is. Every process the stack starts leads a
/// process group of its own (`process::spawn`), so a process belongs to the one whose pid is
/// its group: a vLLM server's leader is its API server, the rest of its group (the engine
/// core and its worker) its engine.
fn part(proc: &Proc, leader: bool) -> &'static str {
    match proc.name.as_str() {
        n if n.starts_with("server-") => {
            if leader {
                API_SERVERS
            } else {
                ENGINES
            }
        }
        "simulator" => SIMULATOR,
        n if n.starts_with("envoy") => ENVOY,
        n if n.starts_with("predictor") => PREDICTOR,
        n if n.starts_with("epp") => PICKER,
        _ => OTHER,
    }
}

impl ProcessTimes {
    /// Now, from `/proc` (`None` where it cannot be read): the processes of `procs`' groups,
    /// and this one, the load generator.
    pub fn now(procs: &[Proc]) -> Option<ProcessTimes> {
        let total = parse(&std::fs::read_to_string("/proc/stat").ok()?)?.total;
        let me = std::process::id();
        let mut ticks: BTreeMap<&'static str, u64> = BTreeMap::new();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Some((group, used)) = std::fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(stat)
            else {
                continue;
            };
            let name = if pid == me {
                LOAD_GENERATOR
            } else if let Some(p) = procs.iter().find(|p| p.pid == group) {
                part(p, pid == group)
            } else {
                continue;
            };
            *ticks.entry(name).or_default() += used;
        }
        Some(ProcessTimes { ticks, total: total.max(1) })
    }

    /// Each part's share of the host's CPU time between `earlier` and `self` (0..=1, all
    /// cores together), [`OTHER`] the busy time none of them used (`host_busy`, the host's
    /// busy share over the same span). Parts that used nothing are left out.
    pub fn shares_since(&self, earlier: &ProcessTimes, host_busy: Option<f64>) -> BTreeMap<String, f64> {
        let total = self.total.saturating_sub(earlier.total).max(1) as f64;
        let mut shares: BTreeMap<String, f64> = self
            .ticks
            .iter()
            .map(|(k, t)| (k.to_string(), t.saturating_sub(earlier.ticks.get(k).copied().unwrap_or(0)) as f64 / total))
            .filter(|(_, share)| *share > 0.0)
            .collect();
        if let Some(busy) = host_busy {
            let accounted: f64 = shares.values().sum();
            shares.insert(OTHER.into(), (busy - accounted).max(0.0));
        }
        shares
    }
}

/// A `/proc/[pid]/stat` line's process group and user plus system ticks. The command name
/// (in parentheses) may hold spaces and parentheses, so fields are counted after its last `)`.
fn stat(line: &str) -> Option<(u32, u64)> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) pgrp(2) ... utime(11) stime(12).
    let group = fields.get(2)?.parse().ok()?;
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some((group, user + system))
}

/// The aggregate `cpu` line: user nice system idle iowait irq softirq steal (guest time is
/// already counted in user). Idle and iowait are not busy.
fn parse(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).take(8).map(|v| v.parse().ok()).collect::<Option<_>>()?;
    if ticks.len() < 5 {
        return None;
    }
    let total: u64 = ticks.iter().sum();
    let idle = ticks[3] + ticks[4];
    Some(CpuTimes { busy: total - idle, total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_share_comes_from_the_aggregate_line_without_idle_and_iowait() {
        let before = parse("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 50 0 50 350 50 0 0 0 0 0\n").unwrap();
        let after = parse("cpu  250 0 150 750 150 0 0 0 0 0\ncpu0 1 1 1 1 1 0 0 0 0 0\n").unwrap();
        // 300 ticks passed: 200 busy (150 user + 50 system), 100 idle or waiting.
        assert!((after.busy_since(&before).unwrap() - 200.0 / 300.0).abs() < 1e-12);
        assert_eq!(before.busy_since(&before), None, "no time passed");
        assert_eq!(parse("intr 1 2 3"), None);
        assert_eq!(parse("cpu  1 2 x 4 5"), None);
    }

    #[test]
    fn a_process_stat_line_gives_its_group_and_ticks_past_a_name_with_spaces() {
        let line = "4242 (VLLM::Worker (x)) S 4200 4100 4100 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 9 0 1 2 3";
        assert_eq!(stat(line), Some((4100, 1290)));
        assert_eq!(stat("1 (init) S"), None);
    }

    #[test]
    fn shares_split_the_host_by_part_and_the_rest_is_other() {
        let at =
            |engines, envoy, total| ProcessTimes { ticks: BTreeMap::from([(ENGINES, engines), (ENVOY, envoy)]), total };
        let shares = at(1_100, 20, 2_000).shares_since(&at(500, 20, 1_000), Some(0.75));
        assert_eq!(shares.get(ENGINES), Some(&0.6));
        assert_eq!(shares.get(ENVOY), None, "a part that used nothing is left out");
        assert!((shares[OTHER] - 0.15).abs() < 1e-12, "{shares:?}");
        let proc = |name: &str| Proc { name: name.into(), pid: 1, exe: "x".into(), log: "y".into(), group: true };
        assert_eq!((part(&proc("server-1"), true), part(&proc("server-1"), false)), (API_SERVERS, ENGINES));
        assert_eq!((part(&proc("envoy-b"), true), part(&proc("predictor-1"), true)), (ENVOY, PREDICTOR));
    }

    #[test]
    fn this_host_can_be_read() {
        if cfg!(target_os = "linux") {
            let a = CpuTimes::now().expect("/proc/stat");
            std::thread::sleep(std::time::Duration::from_millis(30));
            let b = CpuTimes::now().expect("/proc/stat");
            assert!(b.busy_since(&a).is_none_or(|s| (0.0..=1.0).contains(&s)));
            let me = ProcessTimes::now(&[]).expect("/proc");
            assert!(me.ticks.keys().all(|k| *k == LOAD_GENERATOR), "{me:?}");
        }
    }
}
