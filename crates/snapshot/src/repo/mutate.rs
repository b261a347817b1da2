//! Changes to published snapshots: deletion and manifest attachment, both
//! under the record lock, coordinated through tombstones.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::fsutil::{io, replace_file, sync_dir, write_synced};
use super::lock::{RecordLock, RepoGate};
use super::{
    check_name, list_names, read_record, RepoError, Repository, COMMIT_MARKER, RECORD_FILE,
};
use crate::manifest::Manifest;
use crate::record::{FileLocation, SnapshotRecord, MANIFEST_FILE};

const LOCK_WAIT: Duration = Duration::from_secs(10);

impl Repository {
    /// Deletes snapshot `id` (also one still being published: its publisher
    /// finds the tombstone at commit and gives up). Aliases naming it go;
    /// blobs nobody references any more are collected when no writer runs.
    pub fn delete(&self, id: &str) -> Result<(), RepoError> {
        check_name("snapshot id", id, false)?;
        {
            let _gate = RepoGate::shared(&self.dir("locks"))?;
            let _lock = RecordLock::acquire(&self.dir("locks"), id, LOCK_WAIT)?;
            let dir = self.snapshot_dir(id);
            let staging = self.staging_of(id)?;
            if !dir.exists() && staging.is_empty() {
                return Err(RepoError::NotFound(id.to_string()));
            }
            let generation = read_record(&dir.join(RECORD_FILE))
                .map(|r| r.generation)
                .unwrap_or(0);
            // The tombstone first: from here on no publish or attach of this
            // id succeeds, whatever happens to the rest of the deletion.
            let tomb = self.tombstone(id);
            write_synced(&tomb, generation.to_string().as_bytes())?;
            sync_dir(&self.dir("tombstones"))?;
            match std::fs::remove_file(dir.join(COMMIT_MARKER)) {
                Ok(()) => sync_dir(&dir)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("uncommitting snapshot", &dir)(e)),
            }
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(io("removing snapshot directory", &dir))?;
            }
            for (alias, target) in self.aliases()? {
                if target == id {
                    let p = self.dir("aliases").join(&alias);
                    let _ = std::fs::remove_file(&p);
                }
            }
            sync_dir(&self.dir("snapshots"))?;
        }
        // Best effort: skipped while another writer runs; `repair` catches up.
        if let Err(e) = self.collect_blobs() {
            tracing::debug!("blob collection after delete of {id}: {e}");
        }
        Ok(())
    }

    /// Deletes snapshot `id` as [`Repository::delete`] does, then lets the
    /// id be imported again: for the local copy of a snapshot that lives
    /// elsewhere too (the object store), evicted from this node's cache.
    /// The tombstone stands until the snapshot is gone, so a publication of
    /// the id racing the eviction still gives up, and it stays where the
    /// deletion was left half done (`repair` finishes it).
    pub fn evict(&self, id: &str) -> Result<(), RepoError> {
        self.delete(id)?;
        let _gate = RepoGate::shared(&self.dir("locks"))?;
        let _lock = RecordLock::acquire(&self.dir("locks"), id, LOCK_WAIT)?;
        if self.snapshot_dir(id).exists() || !self.staging_of(id)?.is_empty() {
            return Ok(());
        }
        let tomb = self.tombstone(id);
        match std::fs::remove_file(&tomb) {
            Ok(()) => sync_dir(&self.dir("tombstones")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("removing tombstone", &tomb)(e)),
        }
    }

    /// Stores `manifest` beside snapshot `id` and attaches its descriptor to
    /// the record, under the record lock. Fails with `Deleted` when the
    /// snapshot was deleted (or replaced: `generation` differs) since the
    /// caller read it, so a late recorder never brings a snapshot back.
    pub fn attach_manifest(
        &self,
        id: &str,
        generation: u64,
        manifest: &Manifest,
    ) -> Result<SnapshotRecord, RepoError> {
        check_name("snapshot id", id, false)?;
        let _gate = RepoGate::shared(&self.dir("locks"))?;
        let _lock = RecordLock::acquire(&self.dir("locks"), id, LOCK_WAIT)?;
        let gone = || RepoError::Deleted {
            id: id.to_string(),
            what: "manifest attachment",
        };
        if self.is_tombstoned(id) {
            return Err(gone());
        }
        let mut record = match self.get(id) {
            Ok(r) if r.generation == generation => r,
            Ok(_) | Err(RepoError::NotFound(_)) => return Err(gone()),
            Err(e) => return Err(e),
        };
        let bytes = manifest.encode();
        let descriptor = manifest.descriptor(&bytes);
        let dir = self.snapshot_dir(id);
        replace_file(&dir.join(MANIFEST_FILE), &bytes)?;
        record.manifest = Some(descriptor);
        let json = serde_json::to_vec_pretty(&record).map_err(|e| RepoError::CorruptRecord {
            path: dir.join(RECORD_FILE),
            detail: e.to_string(),
        })?;
        replace_file(&dir.join(RECORD_FILE), &json)?;
        Ok(record)
    }

    /// Moves the private file of `role` out of snapshot `id` to `dest` (a
    /// rename on the same file system), for a caller that consumes the
    /// snapshot: a paused sandbox's resume takes its disk back to write on.
    /// Until the file is given back ([`Repository::return_file`]) or the
    /// snapshot deleted, `check` reports it missing. Shared blobs cannot be
    /// taken: other snapshots read them.
    pub fn take_file(&self, id: &str, role: &str, dest: &Path) -> Result<(), RepoError> {
        check_name("snapshot id", id, false)?;
        let _lock = RecordLock::acquire(&self.dir("locks"), id, LOCK_WAIT)?;
        let from = self.private_file(id, role)?;
        std::fs::rename(&from, dest).map_err(io("taking snapshot file", &from))?;
        sync_dir(&self.snapshot_dir(id))?;
        sync_dir(super::fsutil::parent(dest))
    }

    /// Puts back a file taken by [`Repository::take_file`].
    pub fn return_file(&self, id: &str, role: &str, src: &Path) -> Result<(), RepoError> {
        check_name("snapshot id", id, false)?;
        let _lock = RecordLock::acquire(&self.dir("locks"), id, LOCK_WAIT)?;
        let to = self.private_file(id, role)?;
        std::fs::rename(src, &to).map_err(io("returning snapshot file", src))?;
        sync_dir(&self.snapshot_dir(id))?;
        sync_dir(super::fsutil::parent(src))
    }

    /// Where the private file of `role` of live snapshot `id` belongs.
    fn private_file(&self, id: &str, role: &str) -> Result<PathBuf, RepoError> {
        if self.is_tombstoned(id) {
            return Err(RepoError::NotFound(id.to_string()));
        }
        let record = self.get(id)?;
        match record.files.get(role).map(|f| &f.location) {
            Some(FileLocation::Local { name }) => Ok(self.snapshot_dir(id).join(name)),
            Some(FileLocation::Blob { .. }) => Err(RepoError::Shared {
                id: id.to_string(),
                role: role.to_string(),
            }),
            None => Err(RepoError::NoFile {
                id: id.to_string(),
                role: role.to_string(),
            }),
        }
    }

    /// Staging directories of `id` (publications in progress or crashed).
    pub(crate) fn staging_of(&self, id: &str) -> Result<Vec<String>, RepoError> {
        let prefix = format!("{id}.");
        Ok(list_names(&self.dir("staging"))?
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect())
    }

    /// Removes blobs no committed record references; only while no writer
    /// runs (a publisher may be about to reference one).
    pub(crate) fn collect_blobs(&self) -> Result<usize, RepoError> {
        let Some(_gate) = RepoGate::try_exclusive(&self.dir("locks"))? else {
            return Err(RepoError::Busy {
                path: self.dir("locks").join("repo.gate"),
            });
        };
        let live = self.referenced_blobs()?;
        let mut removed = 0;
        for name in list_names(&self.dir("blobs"))? {
            if !live.contains(&name) {
                let p = self.blob_path(&name);
                std::fs::remove_file(&p).map_err(io("removing unreferenced blob", &p))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Blobs referenced by any snapshot directory's record. A committed
    /// record that cannot be read stops collection: its blobs are unknown.
    pub(crate) fn referenced_blobs(&self) -> Result<std::collections::HashSet<String>, RepoError> {
        let mut live = std::collections::HashSet::new();
        for id in list_names(&self.dir("snapshots"))? {
            let dir = self.snapshot_dir(&id);
            match read_record(&dir.join(RECORD_FILE)) {
                Ok(r) => live.extend(r.blobs().map(str::to_string)),
                Err(e) if dir.join(COMMIT_MARKER).exists() => return Err(e),
                Err(_) => {} // half-published, without record: no references
            }
        }
        Ok(live)
    }
}
