//! Counters and stage histograms for Prometheus, kept by the API layer
//! (every create, resume and pause goes through it).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use siesta_sandbox::sandbox::SandboxInfo;
use siesta_sandbox::stages::Stage;

/// Upper bounds (ms) of the stage histogram buckets.
const BUCKETS_MS: [f64; 14] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 10000.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS_MS.len()],
    sum_ms: f64,
    n: u64,
}

impl Histogram {
    fn observe(&mut self, ms: f64) {
        for (i, le) in BUCKETS_MS.iter().enumerate() {
            if ms <= *le {
                self.counts[i] += 1;
            }
        }
        self.sum_ms += ms;
        self.n += 1;
    }
}

#[derive(Default)]
struct Inner {
    /// (operation, outcome) -> count; operation is create, resume or pause.
    ops: BTreeMap<(&'static str, &'static str), u64>,
    stages: BTreeMap<&'static str, Histogram>,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    /// Counts a create or resume and, when it worked, its stage timings.
    pub fn observe_resume(&self, op: &'static str, outcome: &siesta_sandbox::Result<SandboxInfo>) {
        let Ok(mut m) = self.inner.lock() else { return };
        let ok = outcome.is_ok();
        *m.ops
            .entry((op, if ok { "ok" } else { "error" }))
            .or_default() += 1;
        let Ok(info) = outcome else { return };
        let Some(t) = &info.timings else { return };
        for stage in Stage::ALL {
            let ms = t.get(stage);
            if t.stages.iter().any(|(s, _)| *s == stage) {
                m.stages.entry(stage.name()).or_default().observe(ms);
            }
        }
        m.stages
            .entry("unattributed")
            .or_default()
            .observe(t.unattributed_ms());
        m.stages.entry("total").or_default().observe(t.total_ms);
    }

    pub fn observe_pause(&self, outcome: &siesta_sandbox::Result<()>) {
        if let Ok(mut m) = self.inner.lock() {
            let outcome = if outcome.is_ok() { "ok" } else { "error" };
            *m.ops.entry(("pause", outcome)).or_default() += 1;
        }
    }

    pub fn count_failure(&self, op: &'static str, _err: &siesta_sandbox::Error) {
        if let Ok(mut m) = self.inner.lock() {
            *m.ops.entry((op, "error")).or_default() += 1;
        }
    }

    /// The exposition text; `by_state` is (state, number of sandboxes).
    pub fn render(&self, by_state: &[(&str, usize)]) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP siesta_sandboxes Sandboxes by state.");
        let _ = writeln!(out, "# TYPE siesta_sandboxes gauge");
        for (state, n) in by_state {
            let _ = writeln!(out, "siesta_sandboxes{{state=\"{state}\"}} {n}");
        }
        let Ok(m) = self.inner.lock() else { return out };
        let _ = writeln!(
            out,
            "# HELP siesta_operations_total Creates, resumes and pauses by outcome."
        );
        let _ = writeln!(out, "# TYPE siesta_operations_total counter");
        for ((op, outcome), n) in &m.ops {
            let _ = writeln!(
                out,
                "siesta_operations_total{{op=\"{op}\",outcome=\"{outcome}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP siesta_resume_stage_ms Duration of each resume stage."
        );
        let _ = writeln!(out, "# TYPE siesta_resume_stage_ms histogram");
        for (stage, h) in &m.stages {
            for (le, count) in BUCKETS_MS.iter().zip(h.counts) {
                let _ = writeln!(
                    out,
                    "siesta_resume_stage_ms_bucket{{stage=\"{stage}\",le=\"{le}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "siesta_resume_stage_ms_bucket{{stage=\"{stage}\",le=\"+Inf\"}} {}",
                h.n
            );
            let _ = writeln!(
                out,
                "siesta_resume_stage_ms_sum{{stage=\"{stage}\"}} {}",
                h.sum_ms
            );
            let _ = writeln!(
                out,
                "siesta_resume_stage_ms_count{{stage=\"{stage}\"}} {}",
                h.n
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::default();
        h.observe(0.3);
        h.observe(7.0);
        assert_eq!(h.counts[0], 0);
        assert_eq!(h.counts[1], 1); // <= 0.5
        assert_eq!(h.counts[5], 2); // <= 10
        assert_eq!(h.n, 2);
    }

    #[test]
    fn renders_counters() {
        let m = Metrics::default();
        m.observe_pause(&Ok(()));
        let text = m.render(&[("running", 2)]);
        assert!(text.contains("siesta_sandboxes{state=\"running\"} 2"));
        assert!(text.contains("siesta_operations_total{op=\"pause\",outcome=\"ok\"} 1"));
    }
}
