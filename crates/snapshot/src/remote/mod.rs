//! The shared copy of the repository in object storage (S3 API), for more
//! than one node (design: `docs/cluster.md`).
//!
//! ```text
//! chunks/<sha256>          content-addressed chunks of files (chunks.rs)
//! files/<sha256>.idx       a file as its chunks, size and SHA-256
//! records/<snapshot-id>    the record and which file each role is
//! aliases/<alias>          the id it names
//! tombstones/<snapshot-id> written first by a delete
//! ```
//!
//! A push uploads the chunks and indexes first (idempotent: same key, same
//! bytes), then the record with `If-None-Match: *`, so one record wins an
//! id and a record never names a file that is not there. Aliases move by
//! compare-and-swap (`If-Match` on the ETag read). A pull fetches every
//! file, checks each chunk and each file against its SHA-256, and installs
//! the snapshot in the local repository under the same id and generation
//! ([`Repository::import`]). A delete writes a tombstone first, then drops
//! the aliases naming the id and the record; a push that finds a tombstone
//! (before its record, or after: then it takes its record back) gives up,
//! so a delete racing a push never leaves a half state. A record with a
//! tombstone (a delete that died before removing it) is gone to every
//! reader, and `check --repair` finishes that delete. What either leaves
//! behind (chunks, indexes, aliases) is found by [`RemoteRepo::check`].

mod check;
mod chunks;
mod config;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::record::{SnapshotRecord, MANIFEST_FILE};
use crate::repo::{RepoError, Repository};
pub use check::RemoteReport;
pub use chunks::{FileIndex, CHUNK_SIZE, FETCH_CONCURRENCY};
pub use config::S3Config;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("object store: {0}")]
    Config(String),
    #[error("object store: {what} {key}: {source}")]
    Store {
        what: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("object {key} is damaged: {detail}")]
    Corrupt { key: String, detail: String },
    #[error("snapshot {0:?} is already in the object store with other content")]
    Conflict(String),
    #[error("{0} is not in the object store")]
    NotFound(String),
    #[error("alias {0:?} changed in the object store while it was moved; try again")]
    AliasRace(String),
    #[error("snapshot {0:?} was deleted from the object store; it cannot be pushed again")]
    Deleted(String),
    #[error(transparent)]
    Repo(#[from] RepoError),
}

pub(crate) fn store_err(
    what: &'static str,
    key: &Key,
) -> impl FnOnce(object_store::Error) -> RemoteError {
    let key = key.to_string();
    move |source| match source {
        object_store::Error::NotFound { .. } => RemoteError::NotFound(key),
        source => RemoteError::Store { what, key, source },
    }
}

/// The whole object at `key`.
pub(crate) async fn get_bytes(
    store: &Arc<dyn ObjectStore>,
    key: &Key,
) -> Result<bytes::Bytes, RemoteError> {
    store
        .get(key)
        .await
        .map_err(store_err("fetching", key))?
        .bytes()
        .await
        .map_err(store_err("reading", key))
}

/// A record as stored remotely: the record itself and, for each of its
/// files (and its startup manifest), the SHA-256 naming the file's index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RemoteRecord {
    record: SnapshotRecord,
    files: BTreeMap<String, String>,
    #[serde(default)]
    manifest: Option<String>,
}

/// The points of a push and a delete between two writes to the store,
/// where the crash tests stop a process (see [`RemoteRepo::with_step_hook`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteStep {
    /// A push uploaded every chunk and file index, not its record yet.
    Uploaded,
    /// A push wrote its record (its aliases come after).
    Recorded,
    /// A delete wrote its tombstone, nothing else yet.
    Tombstoned,
    /// A delete removed the aliases naming the id, not its record yet.
    Unaliased,
}

impl RemoteStep {
    pub const ALL: [RemoteStep; 4] = [
        RemoteStep::Uploaded,
        RemoteStep::Recorded,
        RemoteStep::Tombstoned,
        RemoteStep::Unaliased,
    ];
}

/// Called at every [`RemoteStep`] (tests only).
pub type StepHook = Arc<dyn Fn(RemoteStep) + Send + Sync>;

/// The object store holding the shared repository.
#[derive(Clone)]
pub struct RemoteRepo {
    store: Arc<dyn ObjectStore>,
    step_hook: Option<StepHook>,
    /// Chunks a pull has in flight at once.
    fetch_concurrency: usize,
    /// What it was opened with, to open another client
    /// ([`RemoteRepo::separate_client`]).
    config: Option<S3Config>,
}

fn record_key(id: &str) -> Key {
    Key::from(format!("records/{id}"))
}

fn tombstone_key(id: &str) -> Key {
    Key::from(format!("tombstones/{id}"))
}

fn alias_key(alias: &str) -> Key {
    Key::from(format!("aliases/{alias}"))
}

impl RemoteRepo {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            step_hook: None,
            fetch_concurrency: chunks::FETCH_CONCURRENCY,
            config: None,
        }
    }

    /// Fetches up to `n` chunks at once in a pull (default
    /// [`FETCH_CONCURRENCY`]; 1: one after another).
    pub fn with_fetch_concurrency(mut self, n: usize) -> Self {
        self.fetch_concurrency = n.max(1);
        self
    }

    /// Runs `hook` at every step of this handle's pushes and deletes: the
    /// crash tests kill the process there.
    pub fn with_step_hook(mut self, hook: StepHook) -> Self {
        self.step_hook = Some(hook);
        self
    }

    fn step(&self, step: RemoteStep) {
        if let Some(hook) = &self.step_hook {
            hook(step);
        }
    }

    pub fn open(config: &S3Config) -> Result<Self, RemoteError> {
        let mut repo = Self::new(config.build()?);
        repo.config = Some(config.clone());
        Ok(repo)
    }

    /// The same store through a client of its own (its own connections):
    /// for requests made from another tokio runtime, whose connections
    /// must not depend on this one's threads. A handle made by
    /// [`RemoteRepo::new`] has no configuration to open one with: a clone.
    pub fn separate_client(&self) -> Result<Self, RemoteError> {
        match &self.config {
            Some(config) => Ok(Self {
                fetch_concurrency: self.fetch_concurrency,
                ..Self::open(config)?
            }),
            None => Ok(self.clone()),
        }
    }

    /// Uploads local snapshot `id`. Pushing the same snapshot again is a
    /// no-op; another record under the same id is [`RemoteError::Conflict`].
    pub async fn push(&self, repo: &Repository, id: &str) -> Result<SnapshotRecord, RemoteError> {
        let record = repo.get(id)?;
        let mut files = BTreeMap::new();
        for role in record.files.keys() {
            let path = repo.file_path(&record, role)?;
            files.insert(role.clone(), chunks::put_file(&self.store, &path).await?);
        }
        let manifest = match record.manifest {
            Some(_) => {
                let path = repo.snapshot_dir(id).join(MANIFEST_FILE);
                Some(chunks::put_file(&self.store, &path).await?)
            }
            None => None,
        };
        let remote = RemoteRecord {
            record: record.clone(),
            files,
            manifest,
        };
        let key = record_key(id);
        let body = serde_json::to_vec_pretty(&remote).map_err(|e| RemoteError::Corrupt {
            key: key.to_string(),
            detail: e.to_string(),
        })?;
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        if self.is_tombstoned(id).await? {
            return Err(RemoteError::Deleted(id.to_string()));
        }
        self.step(RemoteStep::Uploaded);
        let written = self
            .store
            .put_opts(&key, PutPayload::from(body), create)
            .await;
        if written.is_ok() {
            self.step(RemoteStep::Recorded);
        }
        match written {
            Ok(_) if self.is_tombstoned(id).await? => {
                // A delete ran while this push uploaded: it wins.
                let _ = self.store.delete(&key).await;
                Err(RemoteError::Deleted(id.to_string()))
            }
            Ok(_) => Ok(record),
            Err(object_store::Error::AlreadyExists { .. }) => {
                if self.remote_record(id).await? == remote {
                    Ok(record)
                } else {
                    Err(RemoteError::Conflict(id.to_string()))
                }
            }
            Err(e) => Err(store_err("publishing", &key)(e)),
        }
    }

    /// Fetches snapshot `id` into `repo` (a no-op if it is there already),
    /// every file checked against its SHA-256 first.
    pub async fn pull(&self, repo: &Repository, id: &str) -> Result<SnapshotRecord, RemoteError> {
        if let Ok(r) = repo.get(id) {
            return Ok(r);
        }
        let remote = self.remote_record(id).await?;
        if self.is_tombstoned(id).await? {
            // A delete that has not finished (or died half-way): gone.
            return Err(RemoteError::NotFound(format!(
                "snapshot {id:?} (deleted from the object store)"
            )));
        }
        let tmp = repo.import_dir();
        let fetched = Fetched::default();
        let mut fetched = fetched;
        for (role, sha) in &remote.files {
            let dest = tmp.join(format!("pull-{id}-{role}.{:08x}", rand::random::<u32>()));
            fetched.paths.push(dest.clone());
            chunks::get_file(&self.store, sha, &dest, self.fetch_concurrency).await?;
            fetched.files.insert(role.clone(), dest);
        }
        let manifest = match &remote.manifest {
            Some(sha) => {
                let dest = tmp.join(format!("pull-{id}-manifest.{:08x}", rand::random::<u32>()));
                fetched.paths.push(dest.clone());
                chunks::get_file(&self.store, sha, &dest, self.fetch_concurrency).await?;
                Some(dest)
            }
            None => None,
        };
        for (role, f) in &remote.record.files {
            let got = remote.files.get(role).map(String::as_str);
            if f.digest().is_some_and(|want| Some(want) != got) {
                return Err(RemoteError::Corrupt {
                    key: record_key(id).to_string(),
                    detail: format!("file {role:?} is not the one the record's digest names"),
                });
            }
        }
        let (repo2, record) = (repo.clone(), remote.record.clone());
        let files = fetched.files.clone();
        let installed =
            tokio::task::spawn_blocking(move || repo2.import(&record, &files, manifest.as_deref()))
                .await
                .map_err(|e| RemoteError::Config(format!("installing snapshot {id}: {e}")))??;
        Ok(installed)
    }

    /// Snapshot `id`'s record and the index of each of its files, each
    /// index checked against the digest the record keeps, for a reader
    /// that fetches chunks as it needs them ([`RemoteRepo::chunk`]).
    pub async fn view(&self, id: &str) -> Result<RemoteView, RemoteError> {
        let remote = self.remote_record(id).await?;
        if self.is_tombstoned(id).await? {
            return Err(RemoteError::NotFound(format!(
                "snapshot {id:?} (deleted from the object store)"
            )));
        }
        let mut files = BTreeMap::new();
        for (role, sha) in &remote.files {
            let want = remote.record.files.get(role).and_then(|f| f.digest());
            if want.is_some_and(|want| want != sha) {
                return Err(RemoteError::Corrupt {
                    key: record_key(id).to_string(),
                    detail: format!("file {role:?} is not the one the record's digest names"),
                });
            }
            files.insert(role.clone(), chunks::get_index(&self.store, sha).await?);
        }
        let manifest = match &remote.manifest {
            Some(sha) => Some(chunks::get_index(&self.store, sha).await?),
            None => None,
        };
        Ok(RemoteView {
            record: remote.record,
            files,
            manifest,
        })
    }

    /// Chunk `sha` of `len` bytes, checked against its SHA-256.
    pub async fn chunk(&self, sha: &str, len: usize) -> Result<bytes::Bytes, RemoteError> {
        chunks::get_chunk(&self.store, sha, len).await
    }

    /// Fetches the whole file `index` describes into `dest`, checked.
    pub async fn fetch_file(&self, index: &FileIndex, dest: &Path) -> Result<(), RemoteError> {
        chunks::get_file(&self.store, &index.sha256, dest, self.fetch_concurrency).await
    }

    /// Points remote `alias` at `id` (which must be pushed): created if
    /// absent, else replaced only if nobody moved it since it was read.
    pub async fn set_alias(&self, alias: &str, id: &str) -> Result<(), RemoteError> {
        self.remote_record(id).await?;
        let key = alias_key(alias);
        let mode = match self.store.head(&key).await {
            Ok(meta) => PutMode::Update(UpdateVersion {
                e_tag: meta.e_tag,
                version: meta.version,
            }),
            Err(object_store::Error::NotFound { .. }) => PutMode::Create,
            Err(e) => return Err(store_err("reading", &key)(e)),
        };
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        let body = PutPayload::from(id.as_bytes().to_vec());
        match self.store.put_opts(&key, body, opts).await {
            Ok(_) => Ok(()),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Err(RemoteError::AliasRace(alias.to_string())),
            Err(e) => Err(store_err("moving", &key)(e)),
        }
    }

    /// Points remote `alias` at `id` only if the alias does not exist yet:
    /// `Ok(false)` when it names another snapshot (left as it is).
    pub async fn alias_if_absent(&self, alias: &str, id: &str) -> Result<bool, RemoteError> {
        self.remote_record(id).await?;
        let key = alias_key(alias);
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let body = PutPayload::from(id.as_bytes().to_vec());
        match self.store.put_opts(&key, body, create).await {
            Ok(_) => Ok(true),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(self.alias_target(alias).await? == id),
            Err(e) => Err(store_err("creating", &key)(e)),
        }
    }

    /// Whether the store holds a record of snapshot `id`.
    pub async fn contains(&self, id: &str) -> Result<bool, RemoteError> {
        match self.remote_record(id).await {
            Ok(_) => Ok(!self.is_tombstoned(id).await?),
            Err(RemoteError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes remote snapshot `id`: tombstone, the aliases naming it, the
    /// record. Its chunks go at the next `check --repair` (other records
    /// may share them). `Ok(false)` when there was no such record.
    pub async fn delete(&self, id: &str) -> Result<bool, RemoteError> {
        let existed = match self.remote_record(id).await {
            Ok(_) => true,
            Err(RemoteError::NotFound(_)) => false,
            Err(e) => return Err(e),
        };
        let tomb = tombstone_key(id);
        self.store
            .put(&tomb, PutPayload::from_static(b"deleted"))
            .await
            .map_err(store_err("writing", &tomb))?;
        self.step(RemoteStep::Tombstoned);
        self.finish_delete(id).await?;
        Ok(existed)
    }

    /// The rest of a delete once its tombstone is written: the aliases
    /// naming `id`, then its record. Also what `check --repair` runs for a
    /// delete that died half-way.
    async fn finish_delete(&self, id: &str) -> Result<(), RemoteError> {
        for alias in self.aliases_naming(id).await? {
            let key = alias_key(&alias);
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_err("removing", &key)(e)),
            }
        }
        self.step(RemoteStep::Unaliased);
        let key = record_key(id);
        match self.store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_err("removing", &key)(e)),
        }
    }

    async fn is_tombstoned(&self, id: &str) -> Result<bool, RemoteError> {
        let key = tombstone_key(id);
        match self.store.head(&key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_err("reading", &key)(e)),
        }
    }

    async fn aliases_naming(&self, id: &str) -> Result<Vec<String>, RemoteError> {
        let mut out = Vec::new();
        for alias in self.names_under("aliases").await? {
            if self.alias_target(&alias).await.ok().as_deref() == Some(id) {
                out.push(alias);
            }
        }
        Ok(out)
    }

    /// The id remote `alias` names.
    pub async fn alias_target(&self, alias: &str) -> Result<String, RemoteError> {
        let bytes = get_bytes(&self.store, &alias_key(alias)).await?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// Ids of every pushed snapshot.
    pub async fn list(&self) -> Result<Vec<String>, RemoteError> {
        self.names_under("records").await
    }

    /// The last path segment of every object under `prefix/`, sorted.
    async fn names_under(&self, prefix: &str) -> Result<Vec<String>, RemoteError> {
        use futures::TryStreamExt;
        let prefix = Key::from(prefix);
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(store_err("listing", &prefix))?;
        let mut names: Vec<String> = metas
            .into_iter()
            .filter_map(|m| m.location.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    async fn remote_record(&self, id: &str) -> Result<RemoteRecord, RemoteError> {
        let key = record_key(id);
        let bytes = get_bytes(&self.store, &key).await.map_err(|e| match e {
            RemoteError::NotFound(_) => RemoteError::NotFound(format!(
                "snapshot {id:?} (`siesta repo remote-list` lists what is there)"
            )),
            other => other,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| RemoteError::Corrupt {
            key: key.to_string(),
            detail: e.to_string(),
        })
    }
}

/// A remote snapshot as [`RemoteRepo::view`] reads it.
#[derive(Debug, Clone)]
pub struct RemoteView {
    pub record: SnapshotRecord,
    /// The index of each file, by role.
    pub files: BTreeMap<String, FileIndex>,
    /// The index of its startup manifest, if it has one.
    pub manifest: Option<FileIndex>,
}

/// Files a pull wrote under the repository's `tmp/`: removed if the pull
/// does not install them (an import moves them away first).
#[derive(Default)]
struct Fetched {
    paths: Vec<PathBuf>,
    files: BTreeMap<String, PathBuf>,
}

impl Drop for Fetched {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}
