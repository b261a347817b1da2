//! The POSIX snapshot repository.
//!
//! ```text
//! <root>/
//!   snapshots/<id>/      record.json, COMMITTED, private files (state.bin,
//!                        startup.manifest); published iff COMMITTED exists
//!   aliases/<alias>      the id it names (e.g. `template:base`)
//!   blobs/<sha256>       shared content-addressed files (template memory, disk)
//!   staging/<id>.<n>/    a publication in progress
//!   tombstones/<id>      written by delete; a late publish or attach of that
//!                        id sees it and gives up
//!   locks/<id>.lock      record locks (pid + lease); repo.gate (flock)
//!   tmp/                 temporary files of blobs being added
//! ```
//!
//! Repository operations are blocking file-system calls; async callers run
//! them on `spawn_blocking`.

mod check;
mod fsutil;
mod import;
mod lock;
mod mutate;
mod publish;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use check::{CheckReport, Issue, IssueKind};
pub use lock::{LockOwner, RecordLock};
pub use publish::{sha256_file, Placement, PublishFile, PublishRequest, PublishStep};

use crate::manifest::{Manifest, ManifestError};
use crate::record::{FileLocation, SnapshotRecord, MANIFEST_FILE};
use fsutil::io;

pub const RECORD_FILE: &str = "record.json";
pub const COMMIT_MARKER: &str = "COMMITTED";

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("snapshot {0:?} not found")]
    NotFound(String),
    #[error("snapshot {0:?} already exists")]
    Exists(String),
    #[error("snapshot {id:?} was deleted; {what} abandoned")]
    Deleted { id: String, what: &'static str },
    #[error("snapshot {id:?} is locked by live process {pid}")]
    Locked { id: String, pid: u32 },
    #[error("repository is busy ({path} held by a writer)")]
    Busy { path: PathBuf },
    #[error("invalid {what} {name:?}: use 1-128 letters, digits, '-', '_', '.' (and ':' in aliases), not starting with '.'")]
    InvalidName { what: &'static str, name: String },
    #[error("record {path} is corrupt: {detail}")]
    CorruptRecord { path: PathBuf, detail: String },
    #[error("startup manifest of snapshot {id:?}: {source}")]
    Manifest {
        id: String,
        #[source]
        source: ManifestError,
    },
    #[error("file {role:?} of snapshot {id:?} ({}) is damaged: {detail}", path.display())]
    Corrupt {
        id: String,
        role: String,
        path: PathBuf,
        detail: String,
    },
    #[error("snapshot {id:?} has no file {role:?}")]
    NoFile { id: String, role: String },
    #[error("file {role:?} of snapshot {id:?} is a shared blob; it cannot be taken")]
    Shared { id: String, role: String },
    #[error("publication stopped by test hook at {0:?}")]
    Hook(PublishStep),
}

/// Called at each publication step; tests use it to crash or pause there.
pub type PublishHook = Arc<dyn Fn(PublishStep) -> Result<(), RepoError> + Send + Sync>;

#[derive(Clone)]
pub struct Repository {
    root: PathBuf,
    hook: Option<PublishHook>,
}

impl std::fmt::Debug for Repository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repository")
            .field("root", &self.root)
            .finish()
    }
}

const DIRS: [&str; 7] = [
    "snapshots",
    "aliases",
    "blobs",
    "staging",
    "tombstones",
    "locks",
    "tmp",
];

impl Repository {
    /// Opens (creating the directories of) the repository at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, RepoError> {
        let root = root.into();
        for d in DIRS {
            let p = root.join(d);
            std::fs::create_dir_all(&p).map_err(io("creating repository directory", &p))?;
        }
        Ok(Self { root, hook: None })
    }

    /// Installs a hook run at every publication step (tests only).
    #[cfg(feature = "test-hooks")]
    pub fn with_publish_hook(mut self, hook: PublishHook) -> Self {
        self.hook = Some(hook);
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub(crate) fn dir(&self, which: &str) -> PathBuf {
        self.root.join(which)
    }
    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.root.join("snapshots").join(id)
    }
    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.root.join("blobs").join(sha256)
    }
    fn tombstone(&self, id: &str) -> PathBuf {
        self.root.join("tombstones").join(id)
    }
    pub(crate) fn is_tombstoned(&self, id: &str) -> bool {
        self.tombstone(id).exists()
    }

    /// The committed record of `id`.
    pub fn get(&self, id: &str) -> Result<SnapshotRecord, RepoError> {
        check_name("snapshot id", id, false)?;
        let dir = self.snapshot_dir(id);
        if !dir.join(COMMIT_MARKER).exists() || self.is_tombstoned(id) {
            return Err(RepoError::NotFound(id.to_string()));
        }
        read_record(&dir.join(RECORD_FILE))
    }

    /// An alias (`template:base`) or an id, to its record.
    pub fn resolve(&self, name: &str) -> Result<SnapshotRecord, RepoError> {
        match self.alias_target(name)? {
            Some(id) => self.get(&id),
            // Not an alias, and not even a possible id: not found either.
            None if !fsutil::valid_name(name, false) => Err(RepoError::NotFound(name.to_string())),
            None => self.get(name),
        }
    }

    pub fn alias_target(&self, alias: &str) -> Result<Option<String>, RepoError> {
        check_name("alias", alias, true)?;
        let path = self.dir("aliases").join(alias);
        match std::fs::read_to_string(&path) {
            Ok(id) => Ok(Some(id.trim().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading alias", &path)(e)),
        }
    }

    /// Points `alias` at `id` (atomically replacing what it named).
    pub fn set_alias(&self, alias: &str, id: &str) -> Result<(), RepoError> {
        check_name("alias", alias, true)?;
        self.get(id)?;
        fsutil::replace_file(&self.dir("aliases").join(alias), id.as_bytes())
    }

    /// Every alias with the id it names.
    pub fn aliases(&self) -> Result<Vec<(String, String)>, RepoError> {
        let mut out = Vec::new();
        for name in list_names(&self.dir("aliases"))? {
            if let Ok(Some(id)) = self.alias_target(&name) {
                out.push((name, id));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Every committed snapshot, by id.
    pub fn list(&self) -> Result<Vec<SnapshotRecord>, RepoError> {
        let mut out = Vec::new();
        for id in list_names(&self.dir("snapshots"))? {
            if let Ok(r) = self.get(&id) {
                out.push(r);
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Where the file of `role` of `record` is.
    pub fn file_path(&self, record: &SnapshotRecord, role: &str) -> Result<PathBuf, RepoError> {
        let f = record.files.get(role).ok_or_else(|| RepoError::NoFile {
            id: record.id.clone(),
            role: role.to_string(),
        })?;
        Ok(match &f.location {
            FileLocation::Blob { sha256 } => self.blob_path(sha256),
            FileLocation::Local { name } => self.snapshot_dir(&record.id).join(name),
        })
    }

    /// Checks the file of `role` of `record` against the size and digest the
    /// record promises (a file without a digest: its size only). Reads the
    /// whole file: call it from a blocking thread.
    pub fn verify_file(&self, record: &SnapshotRecord, role: &str) -> Result<PathBuf, RepoError> {
        let path = self.file_path(record, role)?;
        let f = &record.files[role];
        let corrupt = |detail: String| RepoError::Corrupt {
            id: record.id.clone(),
            role: role.to_string(),
            path: path.clone(),
            detail,
        };
        let size = std::fs::metadata(&path)
            .map_err(|e| corrupt(format!("cannot be read: {e}")))?
            .len();
        if size != f.size {
            return Err(corrupt(format!("{size} bytes, the record says {}", f.size)));
        }
        if let Some(want) = f.digest() {
            let got = publish::sha256_file(&path)?;
            if got != want {
                return Err(corrupt(format!("SHA-256 {got}, the record says {want}")));
            }
        }
        Ok(path)
    }

    /// Reads and validates the startup manifest of `record`: `Ok(None)` when
    /// it has none, an error when it is missing, corrupt or for another
    /// memory size. Callers fall back to on-demand paging on any error.
    pub fn load_manifest(&self, record: &SnapshotRecord) -> Result<Option<Manifest>, RepoError> {
        let Some(desc) = &record.manifest else {
            return Ok(None);
        };
        let path = self.snapshot_dir(&record.id).join(MANIFEST_FILE);
        let meta = std::fs::metadata(&path).map_err(io("opening startup manifest", &path))?;
        // The bound is checked before reading, so a huge file costs nothing.
        if meta.len() > crate::manifest::MAX_MANIFEST_BYTES {
            return Err(RepoError::Manifest {
                id: record.id.clone(),
                source: ManifestError::TooLarge {
                    size: meta.len(),
                    max: crate::manifest::MAX_MANIFEST_BYTES,
                },
            });
        }
        let bytes = std::fs::read(&path).map_err(io("reading startup manifest", &path))?;
        Manifest::verify(&bytes, desc, record.guest_memory_size)
            .map(Some)
            .map_err(|source| RepoError::Manifest {
                id: record.id.clone(),
                source,
            })
    }
}

pub(crate) fn read_record(path: &Path) -> Result<SnapshotRecord, RepoError> {
    let bytes = std::fs::read(path).map_err(io("reading snapshot record", path))?;
    serde_json::from_slice(&bytes).map_err(|e| RepoError::CorruptRecord {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

pub(crate) fn check_name(what: &'static str, name: &str, alias: bool) -> Result<(), RepoError> {
    if fsutil::valid_name(name, alias) {
        Ok(())
    } else {
        Err(RepoError::InvalidName {
            what,
            name: name.to_string(),
        })
    }
}

/// Names in `dir` that are not hidden (hidden ones are temporary files).
pub(crate) fn list_names(dir: &Path) -> Result<Vec<String>, RepoError> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io("listing", dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io("listing", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// A fresh snapshot id: time-ordered and random, never reused.
pub fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}-{:x}-{:08x}",
        fsutil::now_ms(),
        rand::random::<u32>()
    )
}
