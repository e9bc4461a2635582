//! Measured engine profiles: the prior's costs for a hardware class, from a sweep of the
//! engine itself (`headroom-profile`) rather than constants written for one GPU.
//!
//! Two JSON files per class, in Llumnix's profiling schema so that its files load too:
//!
//! ```text
//! TTFT: {"metadata": {...}, "results": [{"tokens_num": 512, "mean": .., "p50": .., "p95": .., "p99": ..}, ..]}
//! TPOT: {"metadata": {...}, "results": [{"batch_size": 8, "tokens_per_request": 1024, "p50": .., ..}, ..]}
//! ```
//!
//! A TTFT row is the time to first token of one request of `tokens_num` uncached prompt tokens
//! on the idle engine; a TPOT row is the time between tokens with `batch_size` requests
//! decoding together, each holding `tokens_per_request` tokens of context. Like Llumnix, the
//! prior reads the p50s and interpolates: linearly in the prompt length, bilinearly in batch
//! size and context. Unlike Llumnix, which refuses a point outside the profiled grid, it
//! extends the grid's edge segments (a longer prompt costs what the last profiled tokens did
//! each; a batch larger than profiled what the last batch step added), so a request the sweep
//! did not reach still gets a finite, growing prediction.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Latencies of one profiled point (ms), as Llumnix writes them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub mean: f64,
    pub p50: f64,
    #[serde(default)]
    pub p95: f64,
    #[serde(default)]
    pub p99: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Every measurement of the point (Llumnix keeps them; headroom-profile too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw_data: Vec<f64>,
}

impl Stats {
    /// The statistics of `samples` (ms); `None` when there are none or one is not finite.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let at = |q: f64| sorted[((q * (n - 1) as f64).round() as usize).min(n - 1)];
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n as f64;
        Some(Stats {
            mean,
            p50: at(0.5),
            p95: at(0.95),
            p99: at(0.99),
            std: Some(var.sqrt()),
            min: Some(sorted[0]),
            max: Some(sorted[n - 1]),
            raw_data: samples.to_vec(),
        })
    }
}

/// How far identical requests on the idle engine spread: the mean relative error of each
/// profiled point's p50 as the prediction of each of its own samples (`|sample - p50| /
/// sample`, the MAPE the accuracy run reports), over every sample of `points`. No predictor
/// reading only the request and the engine's state does better on those requests, so it is
/// the floor a live error is read against (a loaded engine spreads more). `None` when no
/// point kept its samples (Llumnix's files may not).
pub fn spread<'a>(points: impl IntoIterator<Item = &'a Stats>) -> Option<f64> {
    headroom_protocol::stats::spread_around(points.into_iter().map(|s| (s.p50, &s.raw_data[..])))
}

impl TtftFile {
    /// [`spread`] over every prompt length.
    pub fn spread(&self) -> Option<f64> {
        spread(self.results.iter().map(|r| &r.stats))
    }
}

impl TpotFile {
    /// [`spread`] over every batch and context.
    pub fn spread(&self) -> Option<f64> {
        spread(self.results.iter().map(|r| &r.stats))
    }
}

/// What was profiled, where and when.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub timestamp: String,
    #[serde(default)]
    pub description: String,
}

/// One row of a TTFT profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TtftRow {
    pub tokens_num: u32,
    #[serde(flatten)]
    pub stats: Stats,
}

/// One row of a TPOT profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TpotRow {
    pub batch_size: u32,
    pub tokens_per_request: u32,
    #[serde(flatten)]
    pub stats: Stats,
}

/// A TTFT profiling file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TtftFile {
    #[serde(default)]
    pub metadata: Metadata,
    pub results: Vec<TtftRow>,
}

/// A TPOT profiling file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TpotFile {
    #[serde(default)]
    pub metadata: Metadata,
    pub results: Vec<TpotRow>,
}

/// A hardware class's measured costs, ready to interpolate.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// `(prompt tokens, p50 TTFT ms)`, by tokens, one per distinct count.
    ttft: Vec<(f64, f64)>,
    /// Batch sizes and contexts of the TPOT grid, ascending.
    batches: Vec<f64>,
    contexts: Vec<f64>,
    /// p50 TPOT (ms) at `[batch index][context index]`.
    tpot: Vec<Vec<f64>>,
}

/// Largest latency a profile may state (ms): an hour, as the contract's bound.
const MAX_MS: f64 = 3_600_000.0;

impl Profile {
    /// Builds a profile from the two files, checking what interpolation needs: at least one
    /// TTFT row, a full TPOT grid (every batch size profiled at every context), positive and
    /// finite p50s. Errors name the file's field at fault.
    pub fn from_files(ttft: &TtftFile, tpot: &TpotFile) -> Result<Profile, String> {
        let ok = |ms: f64| ms.is_finite() && ms > 0.0 && ms <= MAX_MS;
        let mut points: Vec<(f64, f64)> = Vec::new();
        for (i, r) in ttft.results.iter().enumerate() {
            if !ok(r.stats.p50) {
                return Err(format!("ttft results[{i}].p50 must be > 0 and at most an hour (ms), got {}", r.stats.p50));
            }
            points.push((f64::from(r.tokens_num), r.stats.p50));
        }
        if points.is_empty() {
            return Err("ttft results: at least one row is needed".into());
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        points.dedup_by(|b, a| a.0 == b.0);
        let mut batches: Vec<f64> = tpot.results.iter().map(|r| f64::from(r.batch_size)).collect();
        let mut contexts: Vec<f64> = tpot.results.iter().map(|r| f64::from(r.tokens_per_request)).collect();
        for axis in [&mut batches, &mut contexts] {
            axis.sort_by(f64::total_cmp);
            axis.dedup();
        }
        if batches.is_empty() {
            return Err("tpot results: at least one row is needed".into());
        }
        if batches[0] < 1.0 {
            return Err("tpot results: batch_size must be >= 1".into());
        }
        let mut grid = vec![vec![f64::NAN; contexts.len()]; batches.len()];
        for (i, r) in tpot.results.iter().enumerate() {
            if !ok(r.stats.p50) {
                return Err(format!("tpot results[{i}].p50 must be > 0 and at most an hour (ms), got {}", r.stats.p50));
            }
            let b = batches.iter().position(|&b| b == f64::from(r.batch_size));
            let c = contexts.iter().position(|&c| c == f64::from(r.tokens_per_request));
            if let (Some(b), Some(c)) = (b, c) {
                grid[b][c] = r.stats.p50;
            }
        }
        for (b, row) in grid.iter().enumerate() {
            if let Some(c) = row.iter().position(|v| v.is_nan()) {
                return Err(format!(
                    "tpot results: no row for batch_size {} at tokens_per_request {} (the grid must be full)",
                    batches[b], contexts[c]
                ));
            }
        }
        Ok(Profile { ttft: points, batches, contexts, tpot: grid })
    }

    /// Reads the two files of a class (errors name the file).
    pub fn load(ttft: &Path, tpot: &Path) -> anyhow::Result<Profile> {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()));
        let ttft_file: TtftFile =
            serde_json::from_str(&read(ttft)?).map_err(|e| anyhow::anyhow!("{}: {e}", ttft.display()))?;
        let tpot_file: TpotFile =
            serde_json::from_str(&read(tpot)?).map_err(|e| anyhow::anyhow!("{}: {e}", tpot.display()))?;
        Profile::from_files(&ttft_file, &tpot_file)
            .map_err(|e| anyhow::anyhow!("profile {} + {}: {e}", ttft.display(), tpot.display()))
    }

    /// Time to first token of a lone request with `tokens` uncached prompt tokens (ms).
    pub fn ttft_ms(&self, tokens: f64) -> f64 {
        extend_1d(&self.ttft, tokens.max(0.0)).max(0.0)
    }

    /// What one more prompt token costs at the long end of the profile (ms): the slope of
    /// its last segment (the first point's average cost when it has one point).
    pub fn prefill_ms_per_token(&self) -> f64 {
        let n = self.ttft.len();
        let slope = if n >= 2 {
            let ((x0, y0), (x1, y1)) = (self.ttft[n - 2], self.ttft[n - 1]);
            (y1 - y0) / (x1 - x0)
        } else {
            self.ttft[0].1 / self.ttft[0].0.max(1.0)
        };
        slope.max(0.0)
    }

    /// Time between tokens with `batch` requests decoding, each with `context` tokens (ms).
    pub fn tpot_ms(&self, batch: f64, context: f64) -> f64 {
        let batch = batch.max(self.batches[0]);
        let context = context.max(0.0);
        // Along context at each batch size, then along batch size.
        let per_batch: Vec<(f64, f64)> = self
            .batches
            .iter()
            .zip(&self.tpot)
            .map(|(&b, row)| {
                let line: Vec<(f64, f64)> = self.contexts.iter().copied().zip(row.iter().copied()).collect();
                (b, extend_1d(&line, context))
            })
            .collect();
        // A falling last segment extended far would go to zero: held at the fastest profiled step.
        let fastest = per_batch.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        extend_1d(&per_batch, batch).max(fastest)
    }
}

/// Piecewise-linear through `points` (ascending x), extended past the last point along the
/// last segment and held at the first point's value below it.
fn extend_1d(points: &[(f64, f64)], x: f64) -> f64 {
    match points {
        [] => 0.0,
        [(_, y)] => *y,
        _ => {
            if x <= points[0].0 {
                return points[0].1;
            }
            let i = points.iter().position(|p| p.0 >= x).unwrap_or(points.len() - 1).max(1);
            let ((x0, y0), (x1, y1)) = (points[i - 1], points[i]);
            y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(p50: f64) -> Stats {
        Stats { mean: p50, p50, ..Default::default() }
    }

    fn profile() -> Profile {
        let ttft = TtftFile {
            metadata: Metadata::default(),
            results: [(16, 20.0), (512, 60.0), (2048, 200.0)]
                .map(|(n, ms)| TtftRow { tokens_num: n, stats: stats(ms) })
                .into(),
        };
        let mut rows = Vec::new();
        for (b, base) in [(1, 4.0), (8, 6.0)] {
            for (c, extra) in [(128, 0.0), (2048, 2.0)] {
                rows.push(TpotRow { batch_size: b, tokens_per_request: c, stats: stats(base + extra) });
            }
        }
        Profile::from_files(&ttft, &TpotFile { metadata: Metadata::default(), results: rows }).unwrap()
    }

    #[test]
    fn ttft_interpolates_between_profiled_prompts_and_extends_past_them() {
        let p = profile();
        assert_eq!(p.ttft_ms(512.0), 60.0);
        assert!((p.ttft_ms(1280.0) - 130.0).abs() < 1e-9);
        assert_eq!(p.ttft_ms(0.0), 20.0, "below the profile: its first point");
        // Past the last point, the last segment's cost per token: 140 ms / 1536 tokens.
        assert!((p.ttft_ms(3584.0) - 340.0).abs() < 1e-9);
        assert!((p.prefill_ms_per_token() - 140.0 / 1536.0).abs() < 1e-12);
    }

    #[test]
    fn tpot_is_bilinear_in_batch_and_context() {
        let p = profile();
        assert_eq!(p.tpot_ms(1.0, 128.0), 4.0);
        assert_eq!(p.tpot_ms(8.0, 2048.0), 8.0);
        // The middle of the cell: the mean of its corners.
        let mid = p.tpot_ms(4.5, 1088.0);
        assert!((mid - 6.0).abs() < 1e-9, "{mid}");
        // Larger batches than profiled keep growing; smaller ones are the smallest's.
        assert!(p.tpot_ms(16.0, 128.0) > p.tpot_ms(8.0, 128.0));
        assert_eq!(p.tpot_ms(0.0, 128.0), 4.0);
    }

    #[test]
    fn llumnix_files_load_and_bad_ones_name_the_field() {
        let ttft = r#"{"metadata":{"model":"m","timestamp":"t","description":"d"},
            "results":[{"tokens_num":64,"mean":11.0,"std":0.1,"min":10.0,"max":12.0,"p50":11.0,"p95":12.0,"p99":12.0,"raw_data":[11.0]}]}"#;
        let tpot = r#"{"metadata":{"model":"m"},"results":[{"batch_size":1,"tokens_per_request":128,"mean":3.0,"p50":3.0,"p95":3.1,"p99":3.2}]}"#;
        let (t, d): (TtftFile, TpotFile) = (serde_json::from_str(ttft).unwrap(), serde_json::from_str(tpot).unwrap());
        let p = Profile::from_files(&t, &d).unwrap();
        assert_eq!(p.ttft_ms(64.0), 11.0);
        assert_eq!(p.tpot_ms(3.0, 4000.0), 3.0, "one point: constant");
        let mut bad = d.clone();
        bad.results[0].stats.p50 = f64::NAN;
        assert!(Profile::from_files(&t, &bad).unwrap_err().contains("tpot results[0].p50"));
        let mut holey = d.clone();
        holey.results.push(TpotRow { batch_size: 2, tokens_per_request: 512, stats: stats(3.0) });
        assert!(Profile::from_files(&t, &holey).unwrap_err().contains("grid must be full"));
        assert!(Profile::from_files(&TtftFile::default(), &d).unwrap_err().contains("ttft results"));
    }

    #[test]
    fn stats_of_samples() {
        let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.p50, s.min, s.max, s.mean), (2.0, Some(1.0), Some(3.0), 2.0));
        assert_eq!(Stats::of(&[]), None);
        assert_eq!(Stats::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn the_spread_is_the_error_of_each_points_p50_on_its_own_samples() {
        let point = |samples: &[f64]| Stats::of(samples).unwrap();
        // p50 10 over 8, 10, 12.5: errors 0.25, 0, 0.2; p50 100 over 100: 0.
        let (a, b) = (point(&[8.0, 10.0, 12.5]), point(&[100.0]));
        assert!((spread([&a, &b]).unwrap() - 0.45 / 4.0).abs() < 1e-12);
        let without = Stats { raw_data: Vec::new(), ..a };
        assert_eq!(spread([&without]), None, "no samples kept: no floor");
    }
}
