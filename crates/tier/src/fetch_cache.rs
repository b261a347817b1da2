//! Snapshots fetched from the object store, kept in the local repository
//! under a size bound (`fetch_cache_mib`): when a fetch takes the fetched
//! snapshots over it, the least recently used ones that nothing on this
//! node needs are deleted locally (docs/cluster.md, §2). The object store
//! still holds each of them, so the next create that names one fetches it
//! again.
//!
//! A fetched template or user snapshot gets a marker named by its id under
//! `cache/fetched/`; the marker's modification time is its last use (a
//! create from it). Only marked snapshots are ever evicted: what this node
//! built, took or paused itself stays until deleted. A snapshot is needed
//! (never evicted) while
//! - another local record names it as its parent (a paused sandbox's pause
//!   or a user snapshot taken over it: their disks are written over its
//!   disk, their memory over its memory),
//! - a sandbox of this node, running or paused, was made from it (the
//!   caller's `in_use`), or
//! - it was used less than `min_idle` ago: a create that has just opened it
//!   may not have started its VMM yet.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use siesta_snapshot::{RepoError, Repository, SnapshotKind, SnapshotRecord};

use crate::error::{Error, IoContext, Result};

/// How long after its last use a fetched snapshot is safe from eviction.
pub const MIN_IDLE: Duration = Duration::from_secs(60);

/// The fetched snapshots of one node (see the module documentation).
#[derive(Debug, Clone)]
pub struct FetchCache {
    dir: PathBuf,
    max_bytes: u64,
}

/// A snapshot [`FetchCache::prune`] deleted locally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evicted {
    pub id: String,
    /// Its local aliases (`template:NAME`, `snapshot:NAME`) before it went.
    pub aliases: Vec<String>,
}

impl FetchCache {
    /// Markers under `dir`; fetched snapshots may take `max_bytes` on disk.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> Self {
        Self {
            dir: dir.into(),
            max_bytes,
        }
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The same cache under another bound (a prune asked for by hand).
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Whether `record` is kept as a fetched snapshot: templates and user
    /// snapshots. A fetched pause (another node's sandbox taken over) is
    /// republished as this node's own and is not a cache entry.
    pub fn keeps(record: &SnapshotRecord) -> bool {
        matches!(record.kind, SnapshotKind::Template | SnapshotKind::User)
    }

    /// Records that snapshot `id` was fetched (and is used now).
    pub fn mark(&self, id: &str) -> Result<()> {
        std::fs::create_dir_all(&self.dir).ctx("creating the fetched-snapshot cache", &self.dir)?;
        let path = self.marker(id);
        std::fs::write(&path, id).ctx("marking a fetched snapshot", &path)
    }

    /// Records a use of snapshot `id` if it is a fetched one (otherwise
    /// nothing happens).
    pub fn touch(&self, id: &str) {
        let path = self.marker(id);
        if let Ok(file) = std::fs::File::options().write(true).open(&path) {
            if let Err(e) = file.set_modified(SystemTime::now()) {
                tracing::debug!("marking a use of {}: {e}", path.display());
            }
        }
    }

    fn marker(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// Deletes fetched snapshots, least recently used first, until what
    /// the fetched ones take on disk is within the bound; skips the ones
    /// still needed (module documentation). Returns what it deleted.
    pub fn prune(
        &self,
        repo: &Repository,
        in_use: &HashSet<String>,
        min_idle: Duration,
    ) -> Result<Vec<Evicted>> {
        let mut evicted = Vec::new();
        loop {
            let entries = self.entries(repo)?;
            if total_bytes(&entries) <= self.max_bytes {
                return Ok(evicted);
            }
            let parents = parents(repo)?;
            let now = SystemTime::now();
            let victim = entries.iter().find(|e| {
                !in_use.contains(&e.id)
                    && !parents.contains(&e.id)
                    && now.duration_since(e.used).unwrap_or_default() >= min_idle
            });
            let Some(victim) = victim else {
                tracing::warn!(
                    bytes = total_bytes(&entries),
                    bound = self.max_bytes,
                    "the fetched snapshots are over their bound, but every one is in use"
                );
                return Ok(evicted);
            };
            evicted.push(self.evict(repo, &victim.id)?);
        }
    }

    fn evict(&self, repo: &Repository, id: &str) -> Result<Evicted> {
        let aliases = repo
            .aliases()?
            .into_iter()
            .filter(|(_, target)| target == id)
            .map(|(alias, _)| alias)
            .collect();
        match repo.evict(id) {
            Ok(()) | Err(RepoError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let marker = self.marker(id);
        std::fs::remove_file(&marker).ctx("removing a fetched-snapshot marker", &marker)?;
        tracing::info!(
            snapshot = id,
            "evicted a fetched snapshot (the object store keeps it)"
        );
        Ok(Evicted {
            id: id.to_string(),
            aliases,
        })
    }

    /// The marked snapshots still in `repo`, least recently used first,
    /// with the files each takes; markers of snapshots gone are removed.
    fn entries(&self, repo: &Repository) -> Result<Vec<Entry>> {
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).ctx("listing the fetched-snapshot cache", &self.dir),
        };
        let mut entries = Vec::new();
        for item in listing {
            let item = item.ctx("listing the fetched-snapshot cache", &self.dir)?;
            let id = item.file_name().to_string_lossy().into_owned();
            let path = item.path();
            let used = item
                .metadata()
                .and_then(|m| m.modified())
                .ctx("reading a fetched-snapshot marker", &path)?;
            let record = match repo.get(&id) {
                Ok(r) => r,
                Err(RepoError::NotFound(_) | RepoError::InvalidName { .. }) => {
                    // Deleted through the API since it was fetched.
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let files = allocated_files(repo, &record)?;
            entries.push(Entry { id, used, files });
        }
        entries.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.id.cmp(&b.id)));
        Ok(entries)
    }
}

struct Entry {
    id: String,
    used: SystemTime,
    /// Each file of the snapshot and the bytes it takes on disk.
    files: Vec<(PathBuf, u64)>,
}

/// What the entries take on disk, a file shared by two of them (a user
/// snapshot's memory is its template's blob) counted once.
fn total_bytes(entries: &[Entry]) -> u64 {
    let unique: BTreeMap<&Path, u64> = entries
        .iter()
        .flat_map(|e| e.files.iter().map(|(p, b)| (p.as_path(), *b)))
        .collect();
    unique.values().sum()
}

/// The files of `record` and the bytes each has allocated (sparse files
/// count what they hold).
fn allocated_files(repo: &Repository, record: &SnapshotRecord) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for role in record.files.keys() {
        let path = repo.file_path(record, role)?;
        let bytes = match std::fs::metadata(&path) {
            Ok(m) => m.blocks() * 512,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => {
                return Err(Error::Io {
                    what: "sizing a fetched snapshot's file",
                    path,
                    source: e,
                })
            }
        };
        out.push((path, bytes));
    }
    Ok(out)
}

/// Ids that some local record names as its parent.
fn parents(repo: &Repository) -> Result<HashSet<String>> {
    Ok(repo.list()?.into_iter().filter_map(|r| r.parent).collect())
}

#[cfg(test)]
mod tests;
