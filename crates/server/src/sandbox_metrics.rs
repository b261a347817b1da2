//! Per-sandbox metric samples (`GET /sandboxes/{id}/metrics`): each sample
//! taken from a guest is kept, so a request for a time range gets the
//! samples of that range, as E2B's API answers, and one that reaches the
//! present also gets a fresh sample. Timestamps are whole seconds, the
//! precision of the query's `start` and `end`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

/// Samples kept per sandbox: an hour at one sample every 5 s.
const KEEP: usize = 720;

/// A sandbox sampled last longer ago than this is forgotten when another is
/// sampled: it was killed (by its timeout, or its VM died) or has not been
/// asked about for an hour, and the map must not grow with every sandbox
/// the node ever ran.
const FORGET_AFTER_SECS: i64 = 3600;

#[derive(Debug, Clone)]
pub struct Sample {
    pub unix: i64,
    pub value: Value,
}

#[derive(Default)]
pub struct SandboxMetrics {
    samples: Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl SandboxMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Sample>>> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `sample` for sandbox `id`.
    pub fn record(&self, id: &str, sample: Sample) {
        let mut all = self.lock();
        let horizon = sample.unix - FORGET_AFTER_SECS;
        all.retain(|_, q| q.back().is_some_and(|s| s.unix >= horizon));
        let q = all.entry(id.to_string()).or_default();
        if q.back().is_some_and(|s| s.unix == sample.unix) {
            q.pop_back(); // one sample a second: the newest wins
        }
        q.push_back(sample);
        while q.len() > KEEP {
            q.pop_front();
        }
    }

    /// The samples of `id` with `start <= unix <= end` (either bound may be
    /// absent), oldest first.
    pub fn range(&self, id: &str, start: Option<i64>, end: Option<i64>) -> Vec<Sample> {
        self.lock().get(id).map_or_else(Vec::new, |q| {
            q.iter()
                .filter(|s| start.is_none_or(|t| s.unix >= t) && end.is_none_or(|t| s.unix <= t))
                .cloned()
                .collect()
        })
    }

    /// Forgets sandbox `id` (killed).
    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(unix: i64) -> Sample {
        Sample {
            unix,
            value: Value::from(unix),
        }
    }

    #[test]
    fn ranges_select_what_was_sampled_then() {
        let m = SandboxMetrics::default();
        for t in [100, 105, 110, 110] {
            m.record("a", s(t));
        }
        let unix = |v: Vec<Sample>| v.iter().map(|s| s.unix).collect::<Vec<_>>();
        assert_eq!(unix(m.range("a", None, None)), [100, 105, 110]);
        assert_eq!(unix(m.range("a", Some(101), Some(110))), [105, 110]);
        assert!(m.range("a", Some(0), Some(99)).is_empty());
        assert!(m.range("b", None, None).is_empty());
        m.forget("a");
        // One not sampled for over an hour goes when another is sampled.
        m.record("old", s(1_000));
        m.record("new", s(1_000 + FORGET_AFTER_SECS + 1));
        assert!(m.range("old", None, None).is_empty());
        assert_eq!(m.range("new", None, None).len(), 1);
        assert!(m.range("a", None, None).is_empty());
    }
}
