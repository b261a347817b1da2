//! One sandbox: its record on disk and, while it runs, its VM and slot.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use siesta_net::Slot;
use siesta_vmm::VmInstance;

use crate::error::{Error, IoContext, Result};
use crate::stages::StageTimings;
use crate::template::record::{sync_dir, write_synced};

pub const RECORD_FILE: &str = "sandbox.json";
pub const DISK_FILE: &str = "disk.qcow2";
pub const STATE_FILE: &str = "state.bin";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
        })
    }
}

/// What is kept on disk about a sandbox (`sandboxes/<id>/sandbox.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub template: String,
    pub state: SandboxState,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Stays the same across pause and resume: clients keep using it.
    pub access_token: String,
    pub env_vars: HashMap<String, String>,
    pub metadata: HashMap<String, String>,
    pub allow_internet: bool,
}

impl SandboxRecord {
    pub fn store(&self, dir: &Path) -> Result<()> {
        let tmp = dir.join(format!("{RECORD_FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::Invalid(e.to_string()))?;
        write_synced(&tmp, &bytes)?;
        let path = dir.join(RECORD_FILE);
        std::fs::rename(&tmp, &path).ctx("publishing sandbox record", &path)?;
        sync_dir(dir)
    }
}

/// The live parts of a running sandbox.
pub struct Running {
    pub vm: Box<dyn VmInstance>,
    pub slot: Slot,
    pub run_dir: PathBuf,
    pub agent_addr: SocketAddr,
    pub timings: StageTimings,
}

/// A sandbox as the manager holds it.
pub struct Sandbox {
    pub dir: PathBuf,
    pub record: SandboxRecord,
    /// `Some` while running.
    pub running: Option<Running>,
}

impl Sandbox {
    pub fn disk_path(&self) -> PathBuf {
        self.dir.join(DISK_FILE)
    }
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }
    pub fn info(&self) -> SandboxInfo {
        SandboxInfo {
            id: self.record.id.clone(),
            template: self.record.template.clone(),
            state: self.record.state,
            created_at: self.record.created_at,
            access_token: self.record.access_token.clone(),
            agent_addr: self.running.as_ref().map(|r| r.agent_addr),
            vmm_pid: self.running.as_ref().map(|r| r.vm.pid()),
            metadata: self.record.metadata.clone(),
            timings: self.running.as_ref().map(|r| r.timings.clone()),
        }
    }
}

/// What callers see of a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub template: String,
    pub state: SandboxState,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub access_token: String,
    /// Where the host reaches the sandbox's agent, while it runs.
    pub agent_addr: Option<SocketAddr>,
    pub vmm_pid: Option<u32>,
    pub metadata: HashMap<String, String>,
    /// Stage timings of the last resume.
    pub timings: Option<StageTimings>,
}
