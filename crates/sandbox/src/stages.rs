//! Stage timings of the resume path.
//!
//! Every resume records how long each stage took, named as in the seed
//! analysis (`shared/seeds/000_*`) where the stage exists here. Time between
//! stages that no stage claims is reported as `unattributed`, so the stages
//! always add up to the total.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One stage of the resume path, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Take a pre-spawned VMM process (waiting for an incoming snapshot) from
    /// the warm pool, or spawn one when the pool is empty.
    VmmPoolAcquire,
    /// Give the sandbox its copy-on-write disk over the template image.
    RootfsBind,
    /// Take a network slot and apply its egress policy.
    NetworkSetup,
    /// Map the snapshot's memory file privately into the VMM.
    MemoryBind,
    /// Load the device state (and any saved RAM) into the VMM.
    SnapshotLoad,
    /// Start the vCPUs.
    Resume,
    /// Wait until the guest agent answers `GET /health`.
    GuestHealth,
    /// `POST /init`: clock, entropy, environment, access token.
    AgentInit,
    /// Booting the template's kernel over the sandbox's disk instead of
    /// loading a snapshot (a filesystem-only pause's resume): spawn, boot,
    /// first `/health`.
    ColdBoot,
    /// Reading the startup manifest's pages of the memory file into the page
    /// cache. Runs in the background, concurrently with the stages above
    /// (never on the critical path), so it is recorded apart from them: see
    /// [`BackgroundTiming`].
    MemoryPrefetch,
}

impl Stage {
    pub const ALL: [Stage; 9] = [
        Stage::ColdBoot,
        Stage::VmmPoolAcquire,
        Stage::RootfsBind,
        Stage::NetworkSetup,
        Stage::MemoryBind,
        Stage::SnapshotLoad,
        Stage::Resume,
        Stage::GuestHealth,
        Stage::AgentInit,
    ];

    /// The name used in logs, metrics and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            Stage::VmmPoolAcquire => "vmm_pool_acquire",
            Stage::RootfsBind => "rootfs_bind",
            Stage::NetworkSetup => "network_setup",
            Stage::MemoryBind => "memory_bind",
            Stage::SnapshotLoad => "snapshot_load",
            Stage::Resume => "resume",
            Stage::GuestHealth => "guest_health",
            Stage::AgentInit => "agent_init",
            Stage::ColdBoot => "cold_boot",
            Stage::MemoryPrefetch => "memory_prefetch",
        }
    }
}

/// A stage that ran beside the critical path (the memory prefetch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackgroundTiming {
    pub stage: Stage,
    /// How long it ran: to its end if it ended before the guest was ready,
    /// else to the end of `guest_health` (where it was let go).
    pub ms: f64,
    /// Whether it finished its work before `guest_health` ended.
    pub finished_before_ready: bool,
    /// Bytes it read.
    pub bytes: u64,
}

/// The measured durations of one resume.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StageTimings {
    /// Stages in the order they ran, with their durations in milliseconds.
    pub stages: Vec<(Stage, f64)>,
    /// Wall time of the whole resume, in milliseconds.
    pub total_ms: f64,
    /// Stages that overlapped the others; not part of the sum to total.
    #[serde(default)]
    pub background: Vec<BackgroundTiming>,
}

impl StageTimings {
    /// Milliseconds of `stage`, or 0 when it did not run.
    pub fn get(&self, stage: Stage) -> f64 {
        self.stages
            .iter()
            .filter(|(s, _)| *s == stage)
            // Not `sum()`: an empty f64 sum is -0.0, printed "-0.0".
            .fold(0.0, |total, (_, ms)| total + ms)
    }

    /// Time inside the total that no stage accounts for.
    pub fn unattributed_ms(&self) -> f64 {
        let staged: f64 = self.stages.iter().map(|(_, ms)| ms).sum();
        (self.total_ms - staged).max(0.0)
    }

    /// Host-side time: everything but the guest's own execution, i.e. the
    /// total less `guest_health` and `agent_init` (both are the guest running
    /// its kernel and agent; the host only waits on a socket), and less a
    /// `cold_boot` (mostly the guest booting).
    pub fn host_side_ms(&self) -> f64 {
        self.total_ms
            - self.get(Stage::GuestHealth)
            - self.get(Stage::AgentInit)
            - self.get(Stage::ColdBoot)
    }

    /// The background timing of `stage`, if it ran.
    pub fn background(&self, stage: Stage) -> Option<&BackgroundTiming> {
        self.background.iter().find(|b| b.stage == stage)
    }

    /// One line for the logs: `total=… vmm_pool_acquire=… …`.
    pub fn summary(&self) -> String {
        let mut line = format!("total={:.2}ms", self.total_ms);
        for (stage, ms) in &self.stages {
            line.push_str(&format!(" {}={ms:.2}ms", stage.name()));
        }
        line.push_str(&format!(" unattributed={:.2}ms", self.unattributed_ms()));
        for b in &self.background {
            line.push_str(&format!(
                " [{}={:.2}ms {} {}KiB]",
                b.stage.name(),
                b.ms,
                if b.finished_before_ready {
                    "done-before-ready"
                } else {
                    "unfinished-at-ready"
                },
                b.bytes >> 10
            ));
        }
        line
    }
}

/// Measures consecutive stages against one start instant.
#[derive(Debug)]
pub struct StageClock {
    started: Instant,
    timings: StageTimings,
}

impl Default for StageClock {
    fn default() -> Self {
        Self::start()
    }
}

impl StageClock {
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            timings: StageTimings::default(),
        }
    }

    /// Runs `fut` as `stage` and records its duration, whatever its outcome.
    pub async fn time<T>(&mut self, stage: Stage, fut: impl std::future::Future<Output = T>) -> T {
        let begun = Instant::now();
        let out = fut.await;
        self.record(stage, begun.elapsed());
        out
    }

    /// Records a stage that ran in the background.
    pub fn record_background(&mut self, timing: BackgroundTiming) {
        self.timings.background.push(timing);
    }

    /// Records a stage measured elsewhere.
    pub fn record(&mut self, stage: Stage, took: Duration) {
        self.timings.stages.push((stage, took.as_secs_f64() * 1e3));
    }

    /// Stops the clock and returns what it measured.
    pub fn finish(mut self) -> StageTimings {
        self.timings.total_ms = self.started.elapsed().as_secs_f64() * 1e3;
        self.timings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stages_and_unattributed_add_up_to_total() {
        let mut clock = StageClock::start();
        clock
            .time(
                Stage::SnapshotLoad,
                tokio::time::sleep(Duration::from_millis(5)),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(3)).await;
        clock.record(Stage::GuestHealth, Duration::from_millis(2));
        let t = clock.finish();
        assert!(t.get(Stage::SnapshotLoad) >= 5.0);
        assert_eq!(t.get(Stage::AgentInit), 0.0);
        let sum: f64 = t.stages.iter().map(|(_, ms)| ms).sum::<f64>() + t.unattributed_ms();
        assert!((sum - t.total_ms).abs() < 1e-6);
        assert!(t.summary().contains("snapshot_load="));
        assert!((t.host_side_ms() - (t.total_ms - 2.0)).abs() < 1e-6); // no agent_init here
    }
}
