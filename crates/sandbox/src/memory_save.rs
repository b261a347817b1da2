//! How pauses, snapshots and forks save a running sandbox's VM.
//!
//! A sandbox's RAM is a private mapping of its template's memory blob, so
//! only the pages its guest wrote differ from that blob. By default a save
//! writes just those ([`siesta_vmm::VmInstance::save_changed_pages`], framed
//! by the template's own state file): its cost follows what the guest
//! wrote, not how much RAM it has. The saved state is then only valid over
//! that very blob, which the repository keeps alive: the snapshot record
//! references it, and a resume maps the record's blob, never whatever the
//! template's name points at by then. Where that cannot hold (a legacy
//! template outside the repository, a VM mapping another file than its
//! template's current blob) or the changed-pages save fails, all of RAM is
//! saved instead, which is valid over any blob of the right size.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use siesta_vmm::{MemorySave, SaveInfo, StateWrite, VmInstance, VmmError};

use siesta_template::Template;

/// How a save writes guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaveMemory {
    /// Only the pages changed since the template, where possible; otherwise
    /// all of RAM.
    #[default]
    Changed,
    /// As `Changed`, but the state file's writeback starts only at its
    /// fsync (what `Changed` did before it started writeback as it wrote;
    /// kept for `siesta bench pause --compare write-behind`).
    ChangedSyncAtEnd,
    /// All of guest RAM (what every save did before; kept for
    /// `siesta bench pause`, which compares the two).
    Full,
}

/// What one save did.
#[derive(Debug, Clone)]
pub struct SaveReport {
    /// Which kind of state file was written.
    pub memory: MemorySave,
    /// Bytes of the state file.
    pub state_bytes: u64,
    /// The VMM's save, fsync included.
    pub save: Duration,
    /// Of which writing the file, and waiting for its fsync.
    pub write: Duration,
    pub sync: Duration,
    /// The state file's SHA-256 where the save hashed it on the way.
    pub sha256: Option<String>,
}

/// Saves `vm` (a sandbox of `template`) to `state`. The VM is left paused.
pub(crate) async fn save(
    vm: &mut dyn VmInstance,
    template: &Template,
    state: &Path,
    how: SaveMemory,
) -> Result<SaveReport, VmmError> {
    let t0 = Instant::now();
    let write = match how {
        SaveMemory::Changed => Some(StateWrite::Behind),
        SaveMemory::ChangedSyncAtEnd => Some(StateWrite::AtEnd),
        SaveMemory::Full => None,
    };
    if let Some(write) = write.filter(|_| maps_template_blob(vm, template)) {
        match vm.save_changed_pages(state, &template.state, write).await {
            Ok(info) => return Ok(report(MemorySave::ChangedPages, &info, t0)),
            Err(e) => tracing::warn!(
                vm = vm.id(),
                "saving changed pages: {e}; saving all of RAM instead"
            ),
        }
    }
    let info = vm.save(state, MemorySave::InState).await?;
    Ok(report(MemorySave::InState, &info, t0))
}

fn report(memory: MemorySave, info: &SaveInfo, t0: Instant) -> SaveReport {
    SaveReport {
        memory,
        state_bytes: info.state_bytes,
        save: t0.elapsed(),
        write: info.write,
        sync: info.sync,
        sha256: info.sha256.clone(),
    }
}

/// Whether the VM's RAM is a mapping of the repository blob that the
/// template's record holds now (the blob a snapshot of it will reference).
fn maps_template_blob(vm: &dyn VmInstance, template: &Template) -> bool {
    if template.shared_memory().is_none() {
        return false;
    }
    match (
        std::fs::metadata(vm.memory_file()),
        std::fs::metadata(&template.memory),
    ) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
