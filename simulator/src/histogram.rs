//! A Prometheus histogram (cumulative buckets, sum, count) rendered as text.

use std::fmt::Write;

#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// Per-bucket counts (not cumulative); the last slot is +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// A histogram with these upper bounds (ascending).
    pub fn new(bounds: &[f64]) -> Self {
        Histogram { bounds: bounds.to_vec(), counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, value: f64) {
        let i = self.bounds.iter().position(|b| value <= *b).unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// Appends the text exposition of this histogram as `name{labels}`.
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_buckets() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help", "m=\"a\"");
        assert!(out.contains("x_bucket{m=\"a\",le=\"0.1\"} 1\n"));
        assert!(out.contains("x_bucket{m=\"a\",le=\"1\"} 3\n"));
        assert!(out.contains("x_bucket{m=\"a\",le=\"+Inf\"} 4\n"));
        assert!(out.contains("x_count{m=\"a\"} 4\n"));
    }
}
