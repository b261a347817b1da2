//! Paused sandboxes as repository snapshots.
//!
//! A pause publishes a snapshot of kind `paused`, aliased `sandbox:<id>`,
//! holding the sandbox's device state and RAM (`state.bin`, moved in), its
//! disk overlay (`disk.qcow2`, hard-linked in, then unlinked from the
//! sandbox directory) and, by reference, its template's shared memory blob.
//! The overlay's backing file is the template's disk blob, so nothing of the
//! template is copied.
//!
//! A paused snapshot is consumed by its resume: the disk is taken back into
//! the sandbox directory (a rename), the VM restored from the state, and the
//! snapshot deleted once the row says running. A failed resume gives the
//! disk back, so nothing is lost. After a crash, [`Saved::inspect`] tells
//! recovery which of these steps was interrupted.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use siesta_snapshot::record::{DISK, MEMORY, STATE};
use siesta_snapshot::repo::{new_id, Placement, PublishFile, PublishRequest};
use siesta_snapshot::{RepoError, Repository, SnapshotKind, SnapshotRecord};

use crate::error::{Error, IoContext, Result};
use crate::template::Template;

/// What is kept with a paused snapshot (the record's `meta`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PausedMeta {
    pub sandbox: String,
    pub template: String,
}

/// The alias of sandbox `id`'s paused snapshot.
pub fn alias(id: &str) -> String {
    format!("sandbox:{id}")
}

/// Publishes the pause of sandbox `id`: `state` and `disk` are linked in
/// (not moved: a failed publication must leave them whole). On error the
/// repository holds nothing of it and both files are where they were. On
/// success `state`'s own name is unlinked; the caller unlinks `disk` once
/// the pause is committed.
pub(crate) fn publish(
    repo: &Repository,
    template: &Template,
    id: &str,
    state: &Path,
    disk: &Path,
) -> Result<SnapshotRecord> {
    let meta = PausedMeta {
        sandbox: id.to_string(),
        template: template.record.name.clone(),
    };
    let file = |role: &str, source: &Path, placement| PublishFile {
        role: role.to_string(),
        source: source.to_path_buf(),
        placement,
        sha256: None,
    };
    let (parent, memory) = template.shared_memory().unzip();
    let record = repo.publish(PublishRequest {
        id: new_id("paused"),
        kind: SnapshotKind::Paused,
        parent,
        guest_memory_size: template.record.memory.size,
        files: vec![
            file(STATE, state, Placement::LocalLink),
            file(DISK, disk, Placement::LocalLink),
        ],
        existing: memory
            .map(|m| (MEMORY.to_string(), m))
            .into_iter()
            .collect(),
        aliases: vec![alias(id)],
        meta: serde_json::to_value(&meta).map_err(|e| Error::Invalid(e.to_string()))?,
    })?;
    let _ = std::fs::remove_file(state);
    Ok(record)
}

/// Where sandbox `id`'s paused snapshot stands.
#[derive(Debug)]
pub(crate) enum Saved {
    /// Published with every file: a complete pause.
    Complete(SnapshotRecord),
    /// Its disk was taken by a resume that had not finished.
    DiskTaken(SnapshotRecord),
    /// No paused snapshot.
    Missing,
}

impl Saved {
    pub(crate) fn inspect(repo: &Repository, id: &str) -> Result<Self> {
        let record = match repo.resolve(&alias(id)) {
            Ok(r) if r.kind == SnapshotKind::Paused => r,
            Ok(_) | Err(RepoError::NotFound(_)) => return Ok(Saved::Missing),
            Err(e) => return Err(e.into()),
        };
        if repo.file_path(&record, DISK)?.is_file() {
            Ok(Saved::Complete(record))
        } else {
            Ok(Saved::DiskTaken(record))
        }
    }
}

/// Unlinks `disk` from a sandbox directory if it is the very file the
/// paused snapshot holds (a pause interrupted before its own unlink).
pub(crate) fn drop_link(repo: &Repository, record: &SnapshotRecord, disk: &Path) -> Result<()> {
    let held = repo.file_path(record, DISK)?;
    let same = |a: &Path, b: &Path| -> bool {
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    };
    if same(disk, &held) {
        std::fs::remove_file(disk).ctx("unlinking a paused sandbox's disk", disk)?;
    }
    Ok(())
}

/// The paused snapshot of sandbox `id`, for its resume: a clear error when
/// there is none.
pub(crate) fn for_resume(repo: &Repository, id: &str) -> Result<SnapshotRecord> {
    match Saved::inspect(repo, id)? {
        Saved::Complete(r) => Ok(r),
        Saved::DiskTaken(r) => Err(Error::CorruptSnapshot {
            path: repo.snapshot_dir(&r.id),
            detail: format!("the disk of paused sandbox {id} is missing"),
        }),
        Saved::Missing => Err(Error::CorruptSnapshot {
            path: repo.root().join("aliases").join(alias(id)),
            detail: format!("paused sandbox {id} has no saved snapshot in the repository"),
        }),
    }
}
