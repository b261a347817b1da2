//! Paired differences with Student-t intervals, for the randomized-block
//! comparisons of `bench resume --compare`.

/// Two-sided 95% quantiles of Student's t (t_{0.975, df}) for df = 1..=30;
/// beyond that the table steps to 40, 60, 120 and the normal 1.96.
const T975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// t_{0.975, df}; conservative between table rows (the smaller df's value).
pub fn t975(df: usize) -> f64 {
    match df {
        0 => f64::INFINITY,
        1..=30 => T975[df - 1],
        31..=39 => T975[29],
        40..=59 => 2.021,
        60..=119 => 2.000,
        120..=999 => 1.980,
        _ => 1.960,
    }
}

/// Mean of the differences and its 95% t interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Paired {
    pub n: usize,
    pub mean: f64,
    pub lo: f64,
    pub hi: f64,
}

pub fn paired(diffs: &[f64]) -> Paired {
    let n = diffs.len();
    if n == 0 {
        return Paired {
            n,
            mean: f64::NAN,
            lo: f64::NAN,
            hi: f64::NAN,
        };
    }
    let mean = diffs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Paired {
            n,
            mean,
            lo: f64::NEG_INFINITY,
            hi: f64::INFINITY,
        };
    }
    let var = diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t975(n - 1) * (var / n as f64).sqrt();
    Paired {
        n,
        mean,
        lo: mean - half,
        hi: mean + half,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_table_rows() {
        assert_eq!(t975(7), 2.365);
        assert_eq!(t975(1), 12.706);
        assert_eq!(t975(35), 2.042);
        assert_eq!(t975(5000), 1.960);
    }

    #[test]
    fn interval_of_known_sample() {
        // mean 2, sd 1 (n = 8): half width 2.365 / sqrt(8).
        let d = [1.0, 3.0, 1.0, 3.0, 1.0, 3.0, 1.0, 3.0];
        let p = paired(&d);
        let sd = (8.0f64 / 7.0).sqrt();
        let half = 2.365 * sd / 8f64.sqrt();
        assert!((p.mean - 2.0).abs() < 1e-12);
        assert!((p.lo - (2.0 - half)).abs() < 1e-9);
        assert!((p.hi - (2.0 + half)).abs() < 1e-9);
    }
}
