//! The filter's Envoy stats (shown in `/stats/prometheus` without the `envoy_` prefix): the
//! core's table (`headroom_filter_core::stats`) defined as Envoy metrics, and the two
//! gauges only a Wasm VM has.

use std::collections::HashMap;

use headroom_filter_core::host::Event;
use headroom_filter_core::stats::{self, Kind};

use crate::host::{self, MetricKind};

/// Stat ids of one VM. A stat the host refused is absent and simply not recorded.
#[derive(Debug, Default)]
pub struct Stats {
    /// The core's stats by name.
    ids: HashMap<&'static str, (u32, Kind)>,
    /// Linear memory of all of the plugin's VMs together (each adds its own changes).
    vm_memory: Option<u32>,
    /// The plugin's VMs that measure durations on the host's monotonic clock (each adds 1).
    monotonic_clock_vms: Option<u32>,
    /// This VM's share of `vm_memory` so far.
    vm_memory_seen: std::cell::Cell<u64>,
}

impl Stats {
    /// Defines every stat.
    pub fn define() -> Stats {
        let ids = stats::all()
            .filter_map(|(name, kind)| {
                let metric = match kind {
                    Kind::Counter => MetricKind::Counter,
                    Kind::Histogram => MetricKind::Histogram,
                };
                host::define_metric(metric, &format!("headroom.{name}")).map(|id| (name, (id, kind)))
            })
            .collect();
        Stats {
            ids,
            vm_memory: host::define_metric(MetricKind::Gauge, "headroom.vm_memory_bytes"),
            monotonic_clock_vms: host::define_metric(MetricKind::Gauge, "headroom.monotonic_clock_vms"),
            vm_memory_seen: std::cell::Cell::new(0),
        }
    }

    /// Counts this VM in `headroom.monotonic_clock_vms` when it reads the monotonic clock.
    pub fn clock(&self, monotonic: bool) {
        if let Some(id) = self.monotonic_clock_vms.filter(|_| monotonic) {
            host::increment_metric(id, 1);
        }
    }

    /// Counts one of the core's events.
    pub fn record(&self, event: Event) {
        stats::record(event, |name, amount| match self.ids.get(name) {
            Some(&(id, Kind::Counter)) => host::increment_metric(id, i64::try_from(amount).unwrap_or(i64::MAX)),
            Some(&(id, Kind::Histogram)) => host::record_metric(id, amount),
            None => {}
        });
    }

    /// This VM's linear memory is `bytes` now. The gauge is shared by every VM of the plugin
    /// (one per worker), so each adds the change since its last report: the gauge is their sum.
    pub fn vm_memory(&self, bytes: u64) {
        let Some(id) = self.vm_memory else { return };
        let change = i64::try_from(bytes).unwrap_or(i64::MAX) - i64::try_from(self.vm_memory_seen.get()).unwrap_or(0);
        if change != 0 {
            host::increment_metric(id, change);
            self.vm_memory_seen.set(bytes);
        }
    }
}
