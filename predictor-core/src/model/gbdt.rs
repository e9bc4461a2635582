//! Gradient-boosted regression trees, small and dependency-free.
//!
//! Targets are latencies, trained in log space (errors are relative, as MAPE
//! is, and a quantile of the log is the log of the quantile). Splits are found
//! on per-feature histograms (at most [`MAX_BINS`] thresholds, from quantiles
//! of the training data); a split sends `x <= threshold` left, exactly as an
//! ONNX `TreeEnsembleRegressor` node in `BRANCH_LEQ` mode does. Leaves hold the
//! mean residual (mean objective) or the residuals' quantile (quantile
//! objective, Friedman's gradient boosting for quantiles), times the learning rate.
//!
//! Residual boosting ([`fit_residual`]): with an offset feature, the ensemble
//! starts from that column (the analytic prior's log latency) as its base margin
//! and fits `log(actual) - offset`; the prediction adds the column back. The
//! trees then only correct a physical model, which keeps its shape (more tokens,
//! more load, slower) where the samples have not been yet.

use headroom_protocol::stats::quantile_in_place as quantile;
use serde::{Deserialize, Serialize};

/// Most split thresholds per feature.
pub const MAX_BINS: usize = 64;

pub use headroom_predictor_config::Objective;

/// Training knobs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Params {
    pub trees: usize,
    pub max_depth: usize,
    pub learning_rate: f64,
    pub min_samples_leaf: usize,
    /// L2 regularisation of split gains.
    pub lambda: f64,
    pub objective: Objective,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            trees: 60,
            max_depth: 6,
            learning_rate: 0.15,
            min_samples_leaf: 10,
            lambda: 1.0,
            objective: Objective::Mean,
        }
    }
}

/// A tree node. Children are indices into the tree's node list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Node {
    Split { feature: usize, threshold: f32, left: usize, right: usize },
    Leaf { value: f64 },
}

/// A fitted ensemble predicting one target (in log space; [`Ensemble::predict`] undoes it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ensemble {
    pub base: f64,
    pub trees: Vec<Vec<Node>>,
    /// The feature added to the sum (log space), if the ensemble learnt a residual.
    #[serde(default)]
    pub offset_feature: Option<usize>,
}

impl Ensemble {
    /// The prediction in log space.
    pub fn predict_log(&self, row: &[f32]) -> f64 {
        let offset = self.offset_feature.map_or(0.0, |f| f64::from(row.get(f).copied().unwrap_or(0.0)));
        let mut sum = self.base + offset;
        for tree in &self.trees {
            let mut i = 0;
            loop {
                match tree.get(i) {
                    Some(Node::Split { feature, threshold, left, right }) => {
                        i = if row.get(*feature).copied().unwrap_or(0.0) <= *threshold { *left } else { *right };
                    }
                    Some(Node::Leaf { value }) => {
                        sum += value;
                        break;
                    }
                    None => break,
                }
            }
        }
        sum
    }

    /// The prediction in the target's units.
    pub fn predict(&self, row: &[f32]) -> f64 {
        self.predict_log(row).exp()
    }
}

/// Fits an ensemble to `rows` -> `targets` (> 0). `None` when there is nothing to fit.
pub fn fit<const F: usize>(rows: &[[f32; F]], targets: &[f64], params: &Params) -> Option<Ensemble> {
    fit_residual(rows, targets, params, None)
}

/// Fits `ln(target) - row[offset]` when `offset` names a feature (the residual of
/// that column), else `ln(target)`. `None` when there is nothing to fit.
pub fn fit_residual<const F: usize>(
    rows: &[[f32; F]],
    targets: &[f64],
    params: &Params,
    offset: Option<usize>,
) -> Option<Ensemble> {
    let offset = offset.filter(|&f| f < F);
    let margin = |i: usize| offset.map_or(0.0, |f| f64::from(rows[i][f]));
    let pairs: Vec<(usize, f64)> = targets
        .iter()
        .enumerate()
        .filter(|(i, t)| t.is_finite() && **t > 0.0 && margin(*i).is_finite())
        .map(|(i, t)| (i, t.ln() - margin(i)))
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let index: Vec<usize> = pairs.iter().map(|p| p.0).collect();
    let y: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let rows: Vec<&[f32; F]> = index.iter().map(|&i| &rows[i]).collect();
    let thresholds: Vec<Vec<f32>> = (0..F).map(|f| thresholds_of(rows.iter().map(|r| r[f]))).collect();
    let bins: Vec<[u8; F]> = rows
        .iter()
        .map(|r| {
            let mut b = [0u8; F];
            for f in 0..F {
                // NaN past every threshold: right at every split, as `x <= t` sends it.
                let k = thresholds[f].len();
                b[f] = if r[f].is_nan() { k } else { thresholds[f].partition_point(|t| *t < r[f]) } as u8;
            }
            b
        })
        .collect();
    // The same bins by feature: a split reads one feature of each of its samples, and a
    // column of bytes stays in the nearest cache where rows of every feature do not.
    let columns: Vec<Vec<u8>> = (0..F).map(|f| bins.iter().map(|b| b[f]).collect()).collect();
    let base = match params.objective {
        Objective::Mean => y.iter().sum::<f64>() / y.len() as f64,
        Objective::Quantile { q } => quantile(&mut y.clone(), q),
    };
    let mut pred = vec![base; y.len()];
    let mut trees = Vec::with_capacity(params.trees);
    // One buffer of sample indices, split in place node by node (each node's samples a
    // contiguous run, in their original order), and one scratch buffer beside it.
    let mut order: Vec<usize> = Vec::with_capacity(y.len());
    let mut scratch = vec![0usize; y.len()];
    for _ in 0..params.trees {
        let residual: Vec<f64> = y.iter().zip(&pred).map(|(y, p)| y - p).collect();
        let gradient: Vec<f64> = match params.objective {
            Objective::Mean => residual.clone(),
            // The pinball loss's negative gradient: q above the target, q - 1 below.
            Objective::Quantile { q } => residual.iter().map(|r| if *r > 0.0 { q } else { q - 1.0 }).collect(),
        };
        let mut tree = Vec::new();
        order.clear();
        order.extend(0..y.len());
        let data = Data {
            bins: &bins,
            columns: &columns,
            thresholds: &thresholds,
            gradient: &gradient,
            residual: &residual,
            params,
        };
        let root = (params.max_depth > 0 && y.len() >= 2 * params.min_samples_leaf)
            .then(|| Histogram::of(&order, &bins, &gradient));
        grow(&mut tree, &mut order, &mut scratch, 0, &data, &mut pred, root.as_ref());
        trees.push(tree);
    }
    Some(Ensemble { base, trees, offset_feature: offset })
}

/// Up to [`MAX_BINS`] distinct split points at quantiles of the values.
fn thresholds_of(values: impl Iterator<Item = f32>) -> Vec<f32> {
    let mut v: Vec<f32> = values.filter(|x| x.is_finite()).collect();
    // Unstable is as good: values equal under `total_cmp` are the same bits.
    v.sort_unstable_by(f32::total_cmp);
    v.dedup();
    if v.len() <= 1 {
        return Vec::new();
    }
    // Candidate thresholds are the distinct values except the largest (a split must leave something right).
    let candidates = &v[..v.len() - 1];
    if candidates.len() <= MAX_BINS {
        return candidates.to_vec();
    }
    let mut out: Vec<f32> = (1..=MAX_BINS).map(|k| candidates[k * candidates.len() / (MAX_BINS + 1)]).collect();
    out.dedup();
    out
}

/// What a tree is grown from: the samples' bins (by sample, and by feature), the thresholds
/// the bins stand for, and this round's gradient (what splits are judged on) and residual
/// (what leaves hold).
struct Data<'a, const F: usize> {
    bins: &'a [[u8; F]],
    columns: &'a [Vec<u8>],
    thresholds: &'a [Vec<f32>],
    gradient: &'a [f64],
    residual: &'a [f64],
    params: &'a Params,
}

/// Grows the subtree for `samples` and returns its root index. `samples` is reordered (left
/// child's first, each side in its original order); each sample's leaf value is added to
/// its `pred`, as predicting it through the finished tree would. `hist` is the samples'
/// histogram where the node may split (`None` where it may not: too deep or too few).
fn grow<const F: usize>(
    tree: &mut Vec<Node>,
    samples: &mut [usize],
    scratch: &mut [usize],
    depth: usize,
    d: &Data<F>,
    pred: &mut [f64],
    hist: Option<&Histogram<F>>,
) -> usize {
    let me = tree.len();
    tree.push(Node::Leaf { value: 0.0 });
    let params = d.params;
    match hist.and_then(|h| best_split(h, samples.len(), d.thresholds, params)) {
        Some((feature, bin)) => {
            let column = &d.columns[feature];
            let n = split_in_place(samples, scratch, |s| usize::from(column[s]) <= bin);
            let (l, r) = samples.split_at_mut(n);
            let (ls, rs) = scratch.split_at_mut(n);
            // Only the smaller side is counted; the larger side's histogram is the parent's
            // less it, which roughly halves the counting a tree costs.
            let splits = |side: &[usize]| depth + 1 < params.max_depth && side.len() >= 2 * params.min_samples_leaf;
            let (mut left_hist, mut right_hist) = (None, None);
            if let Some(parent) = hist.filter(|_| splits(l) || splits(r)) {
                let small = Histogram::of(if l.len() <= r.len() { &*l } else { &*r }, d.bins, d.gradient);
                let large = parent.less(&small);
                (left_hist, right_hist) =
                    if l.len() <= r.len() { (Some(small), Some(large)) } else { (Some(large), Some(small)) };
            }
            let left = grow(tree, l, ls, depth + 1, d, pred, left_hist.as_ref().filter(|_| splits(l)));
            let right = grow(tree, r, rs, depth + 1, d, pred, right_hist.as_ref().filter(|_| splits(r)));
            tree[me] = Node::Split { feature, threshold: d.thresholds[feature][bin], left, right };
        }
        None => {
            let mut rs: Vec<f64> = samples.iter().map(|&s| d.residual[s]).collect();
            let value = match params.objective {
                Objective::Mean => rs.iter().sum::<f64>() / rs.len().max(1) as f64,
                Objective::Quantile { q } => quantile(&mut rs, q),
            };
            let value = value * params.learning_rate;
            tree[me] = Node::Leaf { value };
            for &s in samples.iter() {
                pred[s] += value;
            }
        }
    }
    me
}

/// Per feature and bin, the gradient sum and the sample count of a node's samples.
struct Histogram<const F: usize> {
    sum: [[f64; MAX_BINS + 1]; F],
    count: [[u32; MAX_BINS + 1]; F],
    total: f64,
}

impl<const F: usize> Histogram<F> {
    /// Every feature's histogram in one pass over the samples (each sample's bins lie together).
    fn of(samples: &[usize], bins: &[[u8; F]], gradient: &[f64]) -> Self {
        let mut h = Histogram { sum: [[0.0; MAX_BINS + 1]; F], count: [[0; MAX_BINS + 1]; F], total: 0.0 };
        for &s in samples {
            let g = gradient[s];
            h.total += g;
            for (f, &b) in bins[s].iter().enumerate() {
                h.sum[f][usize::from(b)] += g;
                h.count[f][usize::from(b)] += 1;
            }
        }
        h
    }

    /// This histogram less `part` (a histogram of some of its samples).
    fn less(&self, part: &Self) -> Self {
        let mut h = Histogram { sum: self.sum, count: self.count, total: self.total - part.total };
        for f in 0..F {
            for b in 0..=MAX_BINS {
                h.sum[f][b] -= part.sum[f][b];
                h.count[f][b] -= part.count[f][b];
            }
        }
        h
    }
}

/// Moves the samples that `goes_left` to the front of `samples`, the rest after them, each
/// side in its original order; returns how many went left. `scratch` holds the right side
/// meanwhile (at least as long as `samples`).
///
/// Without a branch: each sample is written to both sides and only the side it belongs to
/// moves on. A branch on where it goes is a coin toss the CPU mispredicts half the time,
/// and splitting was a third of a tree's growing (docs/benchmark.md, "Speed").
fn split_in_place(samples: &mut [usize], scratch: &mut [usize], goes_left: impl Fn(usize) -> bool) -> usize {
    let (mut l, mut r) = (0, 0);
    for i in 0..samples.len() {
        let s = samples[i];
        let left = goes_left(s);
        // `l <= i`: the write never lands ahead of what is still to be read.
        samples[l] = s;
        scratch[r] = s;
        l += usize::from(left);
        r += usize::from(!left);
    }
    samples[l..].copy_from_slice(&scratch[..r]);
    l
}

/// The (feature, bin) split of a node of `n` samples with the best gain, if any improves
/// on none, read from the node's histogram; the first such bin on a tie.
///
/// Each feature's gains are summed up first and then computed in one loop without a branch
/// (which the compiler runs two bins at a time, with SSE2's packed division): the two
/// divisions a bin were most of the time a tree took to grow. A bin that cannot split (an
/// empty one splits as the one before it, a side with fewer than `min_samples_leaf`) gets
/// no gain.
fn best_split<const F: usize>(
    h: &Histogram<F>,
    n: usize,
    thresholds: &[Vec<f32>],
    params: &Params,
) -> Option<(usize, usize)> {
    let total = h.total;
    let parent = total * total / (n as f64 + params.lambda);
    let (n, min_leaf) = (n as f64, params.min_samples_leaf as f64);
    let mut best: Option<(f64, usize, usize)> = None;
    let (mut left_sum, mut left_count) = ([0.0f64; MAX_BINS + 1], [0.0f64; MAX_BINS + 1]);
    let mut gains = [0.0f64; MAX_BINS + 1];
    for (f, (sums, counts)) in h.sum.iter().zip(&h.count).enumerate() {
        let k = thresholds[f].len();
        let (mut gl, mut nl) = (0.0, 0.0);
        for b in 0..k {
            gl += sums[b];
            nl += f64::from(counts[b]);
            left_sum[b] = gl;
            left_count[b] = nl;
        }
        for b in 0..k {
            let (gl, nl) = (left_sum[b], left_count[b]);
            let (gr, nr) = (total - gl, n - nl);
            let gain = gl * gl / (nl + params.lambda) + gr * gr / (nr + params.lambda) - parent;
            let splits = counts[b] != 0 && nl >= min_leaf && nr >= min_leaf;
            gains[b] = if splits { gain } else { f64::NEG_INFINITY };
        }
        for (b, &gain) in gains.iter().enumerate().take(k) {
            if gain > 1e-12 && best.is_none_or(|(g, _, _)| gain > g) {
                best = Some((gain, f, b));
            }
        }
    }
    best.map(|(_, f, b)| (f, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random numbers in [0, 1).
    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A latency-like target: base + load * size, with multiplicative noise.
    fn data(n: usize, noise: f64, seed: u64) -> (Vec<[f32; 3]>, Vec<f64>) {
        let mut s = seed;
        let mut rows = Vec::new();
        let mut y = Vec::new();
        for _ in 0..n {
            let load = (lcg(&mut s) * 30.0).floor();
            let size = 100.0 + lcg(&mut s) * 3900.0;
            let junk = lcg(&mut s);
            let clean = 10.0 + 0.03 * size + 8.0 * load + 0.002 * load * size;
            y.push(clean * (1.0 + noise * (lcg(&mut s) - 0.5) * 2.0));
            rows.push([load as f32, size as f32, junk as f32]);
        }
        (rows, y)
    }

    #[test]
    fn fits_a_latency_surface_to_a_few_percent() {
        let (rows, y) = data(4000, 0.0, 1);
        let model = fit(&rows, &y, &Params::default()).unwrap_or_else(|| unreachable!());
        let (test_rows, test_y) = data(500, 0.0, 2);
        let mape = test_rows.iter().zip(&test_y).map(|(r, t)| (model.predict(r) - t).abs() / t).sum::<f64>() / 500.0;
        assert!(mape < 0.05, "MAPE {mape}");
    }

    #[test]
    fn quantile_objective_covers_its_quantile() {
        let (rows, y) = data(6000, 0.3, 3);
        let p90 = Params { objective: Objective::Quantile { q: 0.9 }, ..Params::default() };
        let model = fit(&rows, &y, &p90).unwrap_or_else(|| unreachable!());
        let (test_rows, test_y) = data(2000, 0.3, 4);
        let covered = test_rows.iter().zip(&test_y).filter(|(r, t)| model.predict(*r) >= **t).count() as f64 / 2000.0;
        assert!((covered - 0.9).abs() < 0.04, "p90 coverage {covered}");
        let mean = fit(&rows, &y, &Params::default()).unwrap_or_else(|| unreachable!());
        let covered_mean =
            test_rows.iter().zip(&test_y).filter(|(r, t)| mean.predict(*r) >= **t).count() as f64 / 2000.0;
        assert!(covered_mean < 0.7, "the mean model is not a p90 one: {covered_mean}");
    }

    #[test]
    fn splits_send_leq_left_and_ignore_bad_targets() {
        let rows: Vec<[f32; 1]> = (0..100).map(|i| [i as f32]).collect();
        let mut y: Vec<f64> = (0..100).map(|i| if i <= 49 { 10.0 } else { 100.0 }).collect();
        y[3] = f64::NAN;
        y[4] = -1.0;
        let params = Params { trees: 50, learning_rate: 0.5, ..Params::default() };
        let m = fit(&rows, &y, &params).unwrap_or_else(|| unreachable!());
        assert!((m.predict(&[49.0]) - 10.0).abs() < 0.5, "{}", m.predict(&[49.0]));
        assert!((m.predict(&[50.0]) - 100.0).abs() < 5.0, "{}", m.predict(&[50.0]));
        assert!(fit::<1>(&[], &[], &params).is_none());
    }
}
