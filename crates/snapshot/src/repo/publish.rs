//! Atomic publication of a snapshot.
//!
//! Steps, each durable before the next (fsync of files and directories):
//!
//! 1. `Staged`: `staging/<id>.<n>/` created, under the shared repo gate.
//! 2. `FilesWritten`: shared files moved or copied into `blobs/<sha256>`
//!    (through `tmp/`), private files into the staging directory.
//! 3. `RecordWritten`: `record.json` in the staging directory.
//! 4. `Locked`: the record lock of `<id>` taken; a tombstone (the id was
//!    deleted meanwhile) or an existing snapshot aborts here.
//! 5. `Renamed`: staging directory renamed to `snapshots/<id>`.
//! 6. `Committed`: `COMMITTED` written; only now does the snapshot exist.
//! 7. `Aliased`: aliases point at it.
//!
//! A crash before 6 leaves a staging directory, a snapshot directory without
//! marker or unreferenced blobs: `repair` removes them. A crash after 6
//! leaves a complete snapshot (perhaps without its aliases).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::fsutil::{io, now_ms, sync_dir, write_synced};
use super::lock::{RecordLock, RepoGate};
use super::{check_name, RepoError, Repository, COMMIT_MARKER, RECORD_FILE};
use crate::record::{FileLocation, FileRef, SnapshotKind, SnapshotRecord};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PublishStep {
    Staged,
    FilesWritten,
    RecordWritten,
    Locked,
    Renamed,
    Committed,
    Aliased,
}

impl PublishStep {
    pub const ALL: [PublishStep; 7] = [
        PublishStep::Staged,
        PublishStep::FilesWritten,
        PublishStep::RecordWritten,
        PublishStep::Locked,
        PublishStep::Renamed,
        PublishStep::Committed,
        PublishStep::Aliased,
    ];
}

/// How a file enters the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Shared blob; the source is moved (renamed) in, so a sparse file stays
    /// sparse and nothing is copied.
    BlobMove,
    /// Shared blob; the source is copied and stays.
    BlobCopy,
    /// Private to this snapshot; moved in.
    LocalMove,
    /// Private to this snapshot; copied in.
    LocalCopy,
    /// Private to this snapshot; hard-linked in (copied across file
    /// systems), so the source stays whole whatever happens to the
    /// publication. The caller must stop writing to the source and unlink
    /// it once published: both names are one file.
    LocalLink,
}

#[derive(Debug, Clone)]
pub struct PublishFile {
    pub role: String,
    pub source: PathBuf,
    pub placement: Placement,
    /// The source's SHA-256 when the caller already computed it. A blob
    /// without one is hashed; a private file's is kept in the record
    /// ([`FileRef::content_sha256`]) for [`Repository::verify_file`].
    pub sha256: Option<String>,
}

#[derive(Debug, Clone)]
pub struct PublishRequest {
    pub id: String,
    pub kind: SnapshotKind,
    pub parent: Option<String>,
    pub guest_memory_size: u64,
    pub files: Vec<PublishFile>,
    /// Files the record references that are already in the repository
    /// (a paused sandbox's memory: its template's blob).
    pub existing: Vec<(String, FileRef)>,
    pub aliases: Vec<String>,
    pub meta: serde_json::Value,
}

impl Repository {
    /// Publishes `req` atomically (see the module documentation).
    pub fn publish(&self, req: PublishRequest) -> Result<SnapshotRecord, RepoError> {
        check_name("snapshot id", &req.id, false)?;
        for a in &req.aliases {
            check_name("alias", a, true)?;
        }
        if self.is_tombstoned(&req.id) {
            return Err(RepoError::Deleted {
                id: req.id,
                what: "publication",
            });
        }
        if self.snapshot_dir(&req.id).exists() {
            return Err(RepoError::Exists(req.id));
        }
        let _gate = RepoGate::shared(&self.dir("locks"))?;
        let staging = self
            .dir("staging")
            .join(format!("{}.{:08x}", req.id, rand::random::<u32>()));
        std::fs::create_dir(&staging).map_err(io("creating staging directory", &staging))?;
        match self.publish_staged(&req, &staging) {
            Ok(r) => Ok(r),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                Err(e)
            }
        }
    }

    fn step(&self, step: PublishStep) -> Result<(), RepoError> {
        match &self.hook {
            Some(hook) => hook(step),
            None => Ok(()),
        }
    }

    fn publish_staged(
        &self,
        req: &PublishRequest,
        staging: &Path,
    ) -> Result<SnapshotRecord, RepoError> {
        sync_dir(&self.dir("staging"))?;
        self.step(PublishStep::Staged)?;

        let mut files: std::collections::BTreeMap<String, FileRef> =
            req.existing.iter().cloned().collect();
        for f in &req.files {
            let r = match f.placement {
                Placement::BlobMove | Placement::BlobCopy => self.add_blob(f)?,
                Placement::LocalMove | Placement::LocalCopy | Placement::LocalLink => {
                    add_local(f, staging)?
                }
            };
            files.insert(f.role.clone(), r);
        }
        sync_dir(staging)?;
        sync_dir(&self.dir("blobs"))?;
        self.step(PublishStep::FilesWritten)?;

        let record = SnapshotRecord {
            id: req.id.clone(),
            kind: req.kind,
            generation: rand::random::<u64>() | 1,
            created_at_unix_ms: now_ms(),
            parent: req.parent.clone(),
            files,
            guest_memory_size: req.guest_memory_size,
            manifest: None,
            meta: req.meta.clone(),
        };
        let _lock = self.commit_staged(&record, staging, "publication")?;

        for alias in &req.aliases {
            super::fsutil::replace_file(&self.dir("aliases").join(alias), req.id.as_bytes())?;
        }
        self.step(PublishStep::Aliased)?;
        Ok(record)
    }

    /// Steps 3-6 for a staging directory holding `record`'s private
    /// files: the record written, the record lock taken (returned, so the
    /// caller keeps it while it writes aliases), a tombstone or an existing
    /// snapshot refusing it, the rename, the commit marker. `what` names
    /// the operation in a refusal.
    pub(super) fn commit_staged(
        &self,
        record: &SnapshotRecord,
        staging: &Path,
        what: &'static str,
    ) -> Result<RecordLock, RepoError> {
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| RepoError::CorruptRecord {
            path: staging.join(RECORD_FILE),
            detail: e.to_string(),
        })?;
        write_synced(&staging.join(RECORD_FILE), &bytes)?;
        sync_dir(staging)?;
        self.step(PublishStep::RecordWritten)?;

        let lock = RecordLock::acquire(&self.dir("locks"), &record.id, Duration::from_secs(10))?;
        self.step(PublishStep::Locked)?;
        // Under the lock, a delete that ran while the files were copied is
        // seen here and wins: the publication is dropped, not resurrected.
        if self.is_tombstoned(&record.id) {
            return Err(RepoError::Deleted {
                id: record.id.clone(),
                what,
            });
        }
        let dest = self.snapshot_dir(&record.id);
        if dest.exists() {
            return Err(RepoError::Exists(record.id.clone()));
        }
        std::fs::rename(staging, &dest).map_err(io("publishing snapshot directory", &dest))?;
        sync_dir(&self.dir("snapshots"))?;
        self.step(PublishStep::Renamed)?;

        write_synced(
            &dest.join(COMMIT_MARKER),
            record.generation.to_string().as_bytes(),
        )?;
        sync_dir(&dest)?;
        self.step(PublishStep::Committed)?;
        Ok(lock)
    }

    fn add_blob(&self, f: &PublishFile) -> Result<FileRef, RepoError> {
        let size = std::fs::metadata(&f.source)
            .map_err(io("reading snapshot file", &f.source))?
            .len();
        let sha = match &f.sha256 {
            Some(s) => s.to_ascii_lowercase(),
            None => sha256_file(&f.source)?,
        };
        let dest = self.blob_path(&sha);
        let moving = f.placement == Placement::BlobMove;
        if !dest.exists() {
            let tmp = self
                .dir("tmp")
                .join(format!("{sha}.{:08x}", rand::random::<u32>()));
            place(&f.source, &tmp, moving)?;
            if let Err(e) = std::fs::rename(&tmp, &dest) {
                let _ = std::fs::remove_file(&tmp);
                return Err(io("adding blob", &dest)(e));
            }
        } else if moving {
            // Same content already shared: the source is no longer needed.
            let _ = std::fs::remove_file(&f.source);
        }
        Ok(FileRef {
            location: FileLocation::Blob { sha256: sha },
            size,
            content_sha256: None,
        })
    }
}

fn add_local(f: &PublishFile, staging: &Path) -> Result<FileRef, RepoError> {
    let name = f
        .source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| super::fsutil::valid_name(n, false) && n != RECORD_FILE && n != COMMIT_MARKER)
        .ok_or_else(|| RepoError::InvalidName {
            what: "snapshot file name",
            name: f.source.display().to_string(),
        })?;
    let dest = staging.join(&name);
    let linked =
        f.placement == Placement::LocalLink && std::fs::hard_link(&f.source, &dest).is_ok();
    if linked {
        std::fs::File::open(&dest)
            .and_then(|file| file.sync_all())
            .map_err(io("syncing snapshot file", &dest))?;
    } else {
        place(&f.source, &dest, f.placement == Placement::LocalMove)?;
    }
    let size = std::fs::metadata(&dest)
        .map_err(io("reading snapshot file", &dest))?
        .len();
    Ok(FileRef {
        location: FileLocation::Local { name },
        size,
        content_sha256: f.sha256.clone(),
    })
}

/// Moves (rename; copy across file systems) or copies `from` to `to` and
/// syncs it.
fn place(from: &Path, to: &Path, moving: bool) -> Result<(), RepoError> {
    let renamed = moving && std::fs::rename(from, to).is_ok();
    if !renamed {
        std::fs::copy(from, to).map_err(io("copying snapshot file", from))?;
        if moving {
            let _ = std::fs::remove_file(from);
        }
    }
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .map_err(io("syncing snapshot file", to))
}

/// Hex SHA-256 of a file's content.
pub fn sha256_file(path: &Path) -> Result<String, RepoError> {
    let mut file = std::fs::File::open(path).map_err(io("opening snapshot file", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(io("reading snapshot file", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}
