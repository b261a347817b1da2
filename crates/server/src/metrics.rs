//! Counters and stage histograms for Prometheus, kept by the API layer
//! (every create, resume and pause goes through it) and exposed with
//! `prometheus-client` in the OpenMetrics text format.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use siesta_sandbox::sandbox::SandboxInfo;
use siesta_sandbox::stages::Stage;

/// The exposition's content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds (ms) of the stage histogram buckets.
const BUCKETS_MS: [f64; 14] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 10000.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    /// create, resume or pause.
    op: String,
    /// ok or error.
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: String,
}

fn stage_histogram() -> Histogram {
    Histogram::new(BUCKETS_MS)
}

pub struct Metrics {
    registry: Registry,
    sandboxes: Family<StateLabel, Gauge>,
    operations: Family<OpLabels, Counter>,
    stages: Family<StageLabel, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let sandboxes = Family::<StateLabel, Gauge>::default();
        let operations = Family::<OpLabels, Counter>::default();
        let stages = Family::<StageLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            stage_histogram,
        );
        let mut registry = Registry::default();
        registry.register("siesta_sandboxes", "Sandboxes by state", sandboxes.clone());
        registry.register(
            "siesta_operations",
            "Creates, resumes and pauses by outcome",
            operations.clone(),
        );
        registry.register(
            "siesta_resume_stage_ms",
            "Duration of each resume stage",
            stages.clone(),
        );
        Self {
            registry,
            sandboxes,
            operations,
            stages,
        }
    }
}

impl Metrics {
    /// Counts a create or resume and, when it worked, its stage timings.
    pub fn observe_resume(&self, op: &'static str, outcome: &siesta_sandbox::Result<SandboxInfo>) {
        self.count(op, outcome.is_ok());
        let Ok(info) = outcome else { return };
        let Some(t) = &info.timings else { return };
        let observe = |stage: &str, ms: f64| {
            self.stages
                .get_or_create(&StageLabel {
                    stage: stage.to_string(),
                })
                .observe(ms);
        };
        for stage in Stage::ALL {
            if t.stages.iter().any(|(s, _)| *s == stage) {
                observe(stage.name(), t.get(stage));
            }
        }
        observe("unattributed", t.unattributed_ms());
        observe("total", t.total_ms);
    }

    pub fn observe_pause(&self, outcome: &siesta_sandbox::Result<()>) {
        self.count("pause", outcome.is_ok());
    }

    pub fn count_failure(&self, op: &'static str, _err: &siesta_sandbox::Error) {
        self.count(op, false);
    }

    fn count(&self, op: &str, ok: bool) {
        let labels = OpLabels {
            op: op.to_string(),
            outcome: if ok { "ok" } else { "error" }.to_string(),
        };
        self.operations.get_or_create(&labels).inc();
    }

    /// The exposition text; `by_state` is (state, number of sandboxes), set
    /// on the gauges as of this scrape.
    pub fn render(&self, by_state: &[(&str, usize)]) -> String {
        for (state, n) in by_state {
            let label = StateLabel {
                state: state.to_string(),
            };
            self.sandboxes
                .get_or_create(&label)
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!("encoding the metrics: {e}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_gauges_counters_and_cumulative_buckets() {
        let m = Metrics::default();
        m.observe_pause(&Ok(()));
        m.stages
            .get_or_create(&StageLabel {
                stage: "snapshot_load".into(),
            })
            .observe(0.3);
        m.stages
            .get_or_create(&StageLabel {
                stage: "snapshot_load".into(),
            })
            .observe(7.0);
        let text = m.render(&[("running", 2)]);
        assert!(
            text.contains("siesta_sandboxes{state=\"running\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("siesta_operations_total{op=\"pause\",outcome=\"ok\"} 1"),
            "{text}"
        );
        let bucket = |le: &str| {
            format!("siesta_resume_stage_ms_bucket{{le=\"{le}\",stage=\"snapshot_load\"}}")
        };
        assert!(text.contains(&format!("{} 0", bucket("0.1"))), "{text}");
        assert!(text.contains(&format!("{} 1", bucket("0.5"))), "{text}");
        assert!(text.contains(&format!("{} 2", bucket("10.0"))), "{text}");
        assert!(
            text.contains("siesta_resume_stage_ms_count{stage=\"snapshot_load\"} 2"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
