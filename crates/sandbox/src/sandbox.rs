//! One sandbox: its record (kept in the node's SQLite store, see
//! [`crate::store`]) and, while it runs, its VM and slot.

use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use siesta_net::Slot;
use siesta_vmm::VmInstance;

use crate::stages::StageTimings;

pub const DISK_FILE: &str = "disk.qcow2";
/// The saved state of a paused sandbox. It exists exactly while the
/// sandbox is paused: a resume deletes it, so a crash recovery that finds it
/// next to a row still marked running knows the pause had completed.
pub const STATE_FILE: &str = "state.bin";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
    /// Its VM is gone and cannot come back (VMM died, or the server stopped
    /// without pausing it); see [`SandboxRecord::dead_reason`]. Kept until
    /// killed so that clients see what happened.
    Dead,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Dead => "dead",
        }
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SandboxState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "running" => Ok(Self::Running),
            "paused" => Ok(Self::Paused),
            "dead" => Ok(Self::Dead),
            other => Err(format!(
                "unknown sandbox state {other:?}: use running, paused or dead"
            )),
        }
    }
}

/// What happens when a running sandbox's deadline (`end_at`) passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// Saved to disk; resumable (E2B `autoPause: true`, our default: nothing
    /// is lost by an idle timeout).
    #[default]
    Pause,
    Kill,
}

impl OnTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Pause => "pause",
            OnTimeout::Kill => "kill",
        }
    }
}

impl std::str::FromStr for OnTimeout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pause" => Ok(Self::Pause),
            "kill" => Ok(Self::Kill),
            other => Err(format!("unknown onTimeout {other:?}: use pause or kill")),
        }
    }
}

/// The E2B `lifecycle` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Lifecycle {
    pub on_timeout: OnTimeout,
    /// Whether traffic to a paused sandbox resumes it.
    pub auto_resume: bool,
    /// A timeout's pause keeps only the disk (E2B's `autoPauseMemory:
    /// false`): the resume cold-boots.
    #[serde(default)]
    pub filesystem_only: bool,
}

/// Everything kept about a sandbox: one row of the store, and what callers
/// see ([`SandboxInfo`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub template: String,
    pub state: SandboxState,
    pub created_at: DateTime<Utc>,
    /// When it last started running (create or resume).
    pub started_at: DateTime<Utc>,
    /// Its deadline: when it is paused or killed (see `lifecycle`) unless
    /// the timeout is extended.
    pub end_at: DateTime<Utc>,
    /// Stays the same across pause and resume: clients keep using it.
    pub access_token: String,
    pub env_vars: HashMap<String, String>,
    pub metadata: HashMap<String, String>,
    /// What it may reach; kept across pause and resume, and given to its
    /// forks and snapshots' sandboxes.
    pub egress: siesta_net::EgressPolicy,
    /// With E2B's `allowPublicTraffic: false`: what requests to its ports
    /// through the front door must carry in `e2b-traffic-access-token`.
    pub traffic_token: Option<String>,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_size_mb: u64,
    pub lifecycle: Lifecycle,
    /// Where the host reaches the sandbox's agent, while it runs.
    pub agent_addr: Option<SocketAddr>,
    /// PID of its VMM, while it runs (recovery after a crash checks it).
    pub vmm_pid: Option<u32>,
    /// Stage timings of the last resume.
    pub timings: Option<StageTimings>,
    /// Why a dead sandbox died.
    pub dead_reason: Option<String>,
    /// The user and working directory commands get by default (its
    /// template's last USER and WORKDIR).
    #[serde(default)]
    pub guest_defaults: GuestDefaults,
    /// Volumes mounted in it; kept across pause and resume, and given to
    /// its forks and to sandboxes made from its snapshots.
    #[serde(default)]
    pub volume_mounts: Vec<crate::volumes::VolumeMount>,
    /// Paused with its disk only: the resume is a cold boot, and traffic
    /// does not resume it.
    #[serde(default)]
    pub paused_disk_only: bool,
}

/// Who a guest's commands run as, and where: the agent client's type.
pub use siesta_envd_client::GuestDefaults;

/// What callers see of a sandbox: its record.
pub type SandboxInfo = SandboxRecord;

/// The live parts of a running sandbox.
pub struct Running {
    pub vm: Box<dyn VmInstance>,
    pub slot: Slot,
    /// The NFS servers of its volumes, in its slot.
    pub exports: crate::volumes::Exports,
    pub run_dir: PathBuf,
    pub agent_addr: SocketAddr,
    pub timings: StageTimings,
    /// The template it was resumed on: its pause and snapshots are taken
    /// over this one (its memory is what the VMM maps), whatever the
    /// template's name names by then.
    pub template: siesta_template::Template,
}

/// A sandbox as the manager holds it.
pub struct Sandbox {
    pub dir: PathBuf,
    pub record: SandboxRecord,
    /// `Some` while running.
    pub running: Option<Running>,
    /// A pause's stop of the VMM, left to finish after the pause returned
    /// (see `running::stop_in_background`); whatever uses the sandbox's
    /// disk or VM next waits for it.
    pub stopping: Option<tokio::task::JoinHandle<()>>,
}

impl Sandbox {
    pub fn disk_path(&self) -> PathBuf {
        self.dir.join(DISK_FILE)
    }
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }
    pub fn info(&self) -> SandboxInfo {
        self.record.clone()
    }
}

/// The virtual size in bytes of a qcow2 image, read from its header (big
/// endian u64 at offset 24 after the `QFI\xfb` magic): what the guest sees
/// as its disk, whatever the overlay's allocation.
pub fn qcow2_virtual_size(path: &Path) -> std::io::Result<u64> {
    let mut header = [0u8; 32];
    std::fs::File::open(path)?.read_exact(&mut header)?;
    if header[..4] != *b"QFI\xfb" {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a qcow2 image (bad magic)",
        ));
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&header[24..32]);
    Ok(u64::from_be_bytes(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_virtual_size_of_a_qcow2_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.qcow2");
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"QFI\xfb");
        h[24..32].copy_from_slice(&(2u64 << 30).to_be_bytes());
        std::fs::write(&path, &h).unwrap();
        assert_eq!(qcow2_virtual_size(&path).unwrap(), 2 << 30);
        std::fs::write(&path, b"raw image, not qcow2 at all, 32+ bytes long").unwrap();
        assert!(qcow2_virtual_size(&path).is_err());
    }

    #[test]
    fn states_round_trip_through_their_names() {
        for s in [
            SandboxState::Running,
            SandboxState::Paused,
            SandboxState::Dead,
        ] {
            assert_eq!(s.as_str().parse::<SandboxState>().unwrap(), s);
        }
        assert!("zombie".parse::<SandboxState>().is_err());
        assert_eq!("kill".parse::<OnTimeout>().unwrap(), OnTimeout::Kill);
    }
}
