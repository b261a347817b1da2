//! VMM backends for siesta sandboxes.
//!
//! Everything above this crate talks to a virtual machine monitor through two
//! traits: [`Vmm`] (a backend: which binary, which accelerator) and
//! [`VmInstance`] (one VMM process running one VM). A sandbox's machine is
//! described once, by a [`LaunchSpec`]; the backend derives its command line
//! or API calls from it. QEMU driven over QMP is the first backend
//! ([`qemu::QemuVmm`]); the traits use no QEMU notion so that a Firecracker
//! backend can implement them later without changes above this crate.

use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use async_trait::async_trait;

mod accel;
pub mod cgroup;
pub mod disk_image;
mod error;
mod info;
pub mod memory_return;
pub mod qemu;
mod spec;
pub mod vmm_users;

pub use accel::{Accel, AccelChoice};
pub use cgroup::{CgroupLimits, Cgroups, VmCgroup};
pub use error::VmmError;
pub use info::{VmmInfo, DEVICE_SET};
pub use spec::{
    BackingFile, DiskFormat, DiskSpec, LaunchMode, LaunchSpec, MemoryBacking, NetSpec,
    MAX_BACKING_DEPTH,
};
pub use vmm_users::{VmmUser, VmmUsers};

/// A VMM backend: knows how to start VMM processes of one kind.
#[async_trait]
pub trait Vmm: Send + Sync {
    /// What this backend is (kind, version, machine type, accelerator).
    /// Store it with every snapshot and check it with
    /// [`VmmInfo::check_compatible`] before restoring one.
    fn info(&self) -> &VmmInfo;

    /// Starts the VMM process and connects its control channel. The VM does
    /// not run yet: call [`VmInstance::boot`] (for [`LaunchMode::Boot`]) or
    /// [`VmInstance::restore`] (for [`LaunchMode::Incoming`]).
    async fn spawn(&self, spec: &LaunchSpec) -> Result<Box<dyn VmInstance>, VmmError>;
}

/// Where a save puts the guest's RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySave {
    /// RAM stays in the VM's shared (`MemoryBacking::shared == true`) backing
    /// file, which is flushed to disk; the state file holds device state only.
    /// This is how a template is made. Do not resume that VM afterwards:
    /// its writes would change the file under every VM restored from it.
    InBackingFile,
    /// Every guest RAM page is written into the state file. Needed when the
    /// VM's RAM is a private copy-on-write mapping: its written pages exist
    /// only in the VMM process.
    InState,
    /// Only the pages the guest changed since its RAM was mapped from the
    /// backing file are in the state file (see
    /// [`VmInstance::save_changed_pages`]); the rest is read from that same
    /// file on restore. Reported by restores; a save asks for it with
    /// `save_changed_pages`.
    ChangedPages,
}

/// How a save puts its state file on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateWrite {
    /// Start the writeback of every few MiB as they are written,
    /// then fsync.
    #[default]
    Behind,
    /// Write everything, then fsync (what saves did before; kept so that
    /// `siesta bench pause --compare write-behind` measures the two).
    AtEnd,
}

/// What a restore did and how long it took.
#[derive(Debug, Clone)]
pub struct RestoreInfo {
    /// From the load request to the VMM reporting the load complete.
    pub load: Duration,
    /// The whole `restore` call, including setup and the final state check.
    pub total: Duration,
    /// Size of the state file.
    pub state_bytes: u64,
    /// Whether the state file carried RAM or relied on the backing file.
    pub memory: MemorySave,
}

/// What a save wrote and how long it took.
#[derive(Debug, Clone)]
pub struct SaveInfo {
    /// Bytes in the state file.
    pub state_bytes: u64,
    /// From the save request to the VMM reporting it complete.
    pub write: Duration,
    /// fsync of the state file (and, for `InBackingFile`, the memory file).
    pub sync: Duration,
    /// The whole `save` call.
    pub total: Duration,
    /// The state file's SHA-256 when the save computed it on the way
    /// (`save_changed_pages` does), so callers need not read it again.
    pub sha256: Option<String>,
}

/// One VMM process running one VM.
///
/// Dropping an instance that was not shut down kills its process (SIGKILL by
/// PID) and reaps it, so no VMM outlives its owner by accident.
#[async_trait]
pub trait VmInstance: Send + Sync {
    /// The `LaunchSpec::id` it was spawned with.
    fn id(&self) -> &str;
    /// PID of the VMM process.
    fn pid(&self) -> u32;

    /// Starts the vCPUs of a VM spawned with [`LaunchMode::Boot`].
    async fn boot(&mut self) -> Result<(), VmmError>;

    /// Loads a state file written by [`VmInstance::save`] into a VM spawned
    /// with [`LaunchMode::Incoming`]. The VM is left paused; call
    /// [`VmInstance::resume`]. On failure the VMM process is killed and
    /// reaped: an instance whose restore failed cannot be reused.
    async fn restore(&mut self, state: &Path) -> Result<RestoreInfo, VmmError>;

    /// Runs a paused VM.
    async fn resume(&mut self) -> Result<(), VmmError>;

    /// Stops the vCPUs. Pausing a paused VM is not an error.
    async fn pause(&mut self) -> Result<(), VmmError>;

    /// Writes the VM's state to `state` (created or truncated) and fsyncs it.
    /// A running VM is paused first. [`MemorySave::InBackingFile`] requires
    /// shared memory. The VM stays paused afterwards.
    async fn save(&mut self, state: &Path, memory: MemorySave) -> Result<SaveInfo, VmmError>;

    /// Writes the VM's device state and only the RAM pages its guest wrote
    /// since its private memory was mapped from the backing file, to `state`
    /// (created or truncated), and fsyncs it. The RAM section's framing (block
    /// list, firmware pages) comes from `base`, a state file saved with
    /// [`MemorySave::InBackingFile`] by a VM of the same machine and memory
    /// size: its template. Restore it into a VM whose memory is a private
    /// mapping of the very same, unmodified backing file. A running VM is
    /// paused first and stays paused; on error it is as it was, so a full
    /// [`VmInstance::save`] may follow. `write` says when the file's
    /// writeback starts ([`StateWrite::Behind`] unless comparing).
    async fn save_changed_pages(
        &mut self,
        state: &Path,
        base: &Path,
        write: StateWrite,
    ) -> Result<SaveInfo, VmmError>;

    /// The file the VM's RAM is mapped from.
    fn memory_file(&self) -> &Path;

    /// Freezes the disk as it is now: from here on the VM's writes go to a
    /// new qcow2 overlay created at `overlay` (which must not exist), backed
    /// by the image written until now, which is left unchanged from then
    /// on. The guest should flush its caches first (`sync`) for the frozen
    /// image to hold what it wrote. A VM without a disk is an error.
    async fn checkpoint_disk(&mut self, overlay: &Path) -> Result<(), VmmError>;

    /// Gives a VM waiting in [`LaunchMode::Incoming`], before its state is
    /// loaded, another disk image in place of the one it was spawned with
    /// (which it closes): how a VMM spawned ahead of time over a fresh
    /// overlay resumes a paused sandbox over that sandbox's own disk. The
    /// image must be of the same size and writability. On error the VM
    /// keeps its old disk.
    async fn replace_disk(&mut self, disk: DiskSpec) -> Result<(), VmmError>;

    /// Takes another id and run directory: the caller has moved the run
    /// directory (with rename(2), so the control socket and the open log
    /// files move with it) to `run_dir`, for a VM handed to another
    /// sandbox.
    fn rename(&mut self, id: &str, run_dir: &Path);

    /// Asks the VMM to quit, kills it (SIGKILL by PID) after a short grace,
    /// and always reaps it. Idempotent.
    async fn shutdown(&mut self) -> Result<(), VmmError>;

    /// `Some` once the VMM process has exited (it is then reaped).
    fn try_exit_status(&mut self) -> Option<ExitStatus>;
}
