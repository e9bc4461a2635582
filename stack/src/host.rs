//! How busy this host's CPUs were during a measurement.
//!
//! The local stack runs Envoy, the predictor, the model servers and the clients on one
//! small host. When its CPUs saturate, latencies measure the host rather than the routing,
//! so the benchmark, the demo and the accuracy run record the share of CPU time the whole
//! host spent busy. Linux only (`/proc/stat`); elsewhere nothing is recorded.

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
    fn this_host_can_be_read() {
        if cfg!(target_os = "linux") {
            let a = CpuTimes::now().expect("/proc/stat");
            std::thread::sleep(std::time::Duration::from_millis(30));
            let b = CpuTimes::now().expect("/proc/stat");
            assert!(b.busy_since(&a).is_none_or(|s| (0.0..=1.0).contains(&s)));
        }
    }
}
