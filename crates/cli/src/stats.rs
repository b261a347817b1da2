//! Summary statistics for benchmark tables.

/// Mean, median and extremes of a sample.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    pub min: f64,
    pub max: f64,
}

pub fn summarize(values: &[f64]) -> Summary {
    if values.is_empty() {
        return Summary::default();
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let p50 = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Summary {
        n,
        mean: v.iter().sum::<f64>() / n as f64,
        p50,
        min: v[0],
        max: v[n - 1],
    }
}

/// The `q`-quantile (0..=1) of `values` by the nearest-rank method: the
/// smallest value at least `q` of the sample is not above.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = (q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize;
    v[rank.saturating_sub(1).min(v.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&[5.0, 1.0], 0.99), 5.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn median_of_even_and_odd_samples() {
        let s = summarize(&[3.0, 1.0, 2.0]);
        assert_eq!((s.p50, s.min, s.max, s.mean), (2.0, 1.0, 3.0, 2.0));
        assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]).p50, 2.5);
        assert_eq!(summarize(&[]).n, 0);
    }
}
