//! The one quantile definition every component reports and trains with.

/// Nearest-rank quantile `q` (0..=1) of `values`, sorting them in place; 0 when empty.
pub fn quantile_in_place(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// Nearest-rank quantile `q` of `values` (copied); `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    (!values.is_empty()).then(|| quantile_in_place(&mut values.to_vec(), q))
}

/// How far samples spread around a center of their own: over every positive sample of
/// every `(center, samples)` group, the mean of `|sample - center| / sample`, the error a
/// predictor that said the center for each of them would score (`None`: no sample). The
/// reference figures of a profile's idle points and of a run's prompt-length buckets.
pub fn spread_around<'a>(groups: impl IntoIterator<Item = (f64, &'a [f64])>) -> Option<f64> {
    let (mut sum, mut n) = (0.0, 0usize);
    for (center, samples) in groups {
        for x in samples.iter().filter(|x| **x > 0.0) {
            sum += (x - center).abs() / x;
            n += 1;
        }
    }
    (n > 0).then(|| sum / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(5.0));
        assert_eq!(quantile(&v, 0.9), Some(9.0));
        assert_eq!(quantile(&v, 1.0), Some(10.0));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile_in_place(&mut [], 0.5), 0.0);
    }
}
