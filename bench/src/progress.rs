//! How far a long run is: the measured steps done out of those planned, the time spent and
//! an estimate of the rest, printed beside every measurement (`make bench` runs for hours).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A run's count of measured steps. The plan is revised as the run learns it: a ladder that
/// stops early drops its remaining rungs, and the repeats are known once a workload's
/// ladders have found their cliffs. Shared by ladders measured side by side (`Lab::workers`).
pub struct Progress {
    started: Instant,
    done: AtomicUsize,
    planned: AtomicUsize,
}

impl Progress {
    pub fn new(planned: usize) -> Progress {
        Progress { started: Instant::now(), done: AtomicUsize::new(0), planned: AtomicUsize::new(planned) }
    }

    /// Changes the plan by `by` steps (more, or fewer when negative).
    pub fn replan(&self, by: isize) {
        let done = self.done.load(Ordering::Relaxed);
        let _ = self
            .planned
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(p.saturating_add_signed(by).max(done)));
    }

    /// Counts one more step done and says where the run stands.
    pub fn step(&self) -> String {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let planned = self.planned.fetch_max(done, Ordering::Relaxed).max(done);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        line(done, planned, self.started.elapsed().as_secs_f64(), now)
    }
}

/// `[step 5/40, 3m10s in, about 22m11s left, ends near 02:41 UTC]`: the rest at the mean pace
/// so far (stack starts and warm-ups included), `now` in Unix seconds.
fn line(done: usize, planned: usize, elapsed_s: f64, now: u64) -> String {
    let left_s = if done == 0 { 0.0 } else { elapsed_s / done as f64 * planned.saturating_sub(done) as f64 };
    let end = (now + left_s as u64) % 86_400;
    format!(
        "[step {done}/{planned}, {} in, about {} left, ends near {:02}:{:02} UTC]",
        duration(elapsed_s),
        duration(left_s),
        end / 3600,
        end % 3600 / 60
    )
}

/// `1h02m`, `3m10s` or `42s`.
fn duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_goes_at_the_pace_so_far_and_ends_on_the_clock() {
        // 5 of 40 steps in 10 minutes: 35 more take 70 minutes; at 01:00 UTC it ends at 02:10.
        assert_eq!(line(5, 40, 600.0, 3600), "[step 5/40, 10m00s in, about 1h10m left, ends near 02:10 UTC]");
        assert_eq!(line(40, 40, 42.0, 0), "[step 40/40, 42s in, about 0s left, ends near 00:00 UTC]");
    }

    #[test]
    fn a_plan_shrinks_and_grows_but_never_below_what_is_done() {
        let p = Progress::new(10);
        assert!(p.step().starts_with("[step 1/10,"));
        p.replan(-20);
        assert!(p.step().starts_with("[step 2/2,"));
        p.replan(6);
        assert!(p.step().starts_with("[step 3/8,"));
    }
}
