//! siesta-tier: the object-store tier of the repository (docs/cluster.md, §2): a
//! template or a snapshot this node lacks is fetched from the shared S3
//! repository the first time a create names it, then resumed as a local
//! one (and stays local: the next create is an ordinary resume).
//!
//! A template is served lazily where the node mounted its FUSE file system
//! ([`LazyTier`]): the create resumes before its memory and disk are whole.
//! Everything else (user snapshots, their templates, pauses taken over)
//! is fetched whole, every file checked against its SHA-256 before it is
//! installed. Fetched templates and user snapshots are a cache under a
//! size bound ([`FetchCache`]): the least recently used ones nothing needs
//! are deleted locally and fetched again when named.

use std::time::Instant;

use siesta_snapshot::remote::{RemoteError, RemoteRepo};
use siesta_snapshot::{RepoError, Repository, SnapshotRecord};

use siesta_host::key_locks::KeyLocks;
use siesta_template::Template;

pub mod error;
pub mod fetch_cache;
pub mod lazy;

pub use error::{Error, Result};
pub use fetch_cache::FetchCache;
pub use lazy::LazyTier;

/// The node's view of the shared object store.
pub struct RemoteTier {
    remote: RemoteRepo,
    /// Fetches of one name run one at a time: two creates of one missing
    /// template fetch it once (the second finds it local), while creates
    /// of other names fetch beside them.
    fetching: KeyLocks,
    /// Taken after `fetching`, by snapshot id: two names for one snapshot
    /// (an alias and its id) never pull or lazily open it twice.
    pulling: KeyLocks,
    /// Where fetched snapshots are marked (none: kept without bound).
    cache: Option<FetchCache>,
    /// Serves templates before they are whole (none: fetched whole).
    lazy: Option<LazyTier>,
}

/// What a create's template name can be in the object store: the alias of
/// a template, a snapshot's id, or the alias of a named snapshot.
fn candidates(name: &str) -> [String; 3] {
    [
        siesta_template::alias(name),
        name.to_string(),
        format!("snapshot:{name}"),
    ]
}

impl RemoteTier {
    pub fn new(remote: RemoteRepo) -> Self {
        Self {
            remote,
            fetching: KeyLocks::default(),
            pulling: KeyLocks::default(),
            cache: None,
            lazy: None,
        }
    }

    /// Serves templates through `lazy` before they are whole.
    pub fn with_lazy(mut self, lazy: LazyTier) -> Self {
        self.lazy = Some(lazy);
        self
    }

    pub fn lazy(&self) -> Option<&LazyTier> {
        self.lazy.as_ref()
    }

    /// Template `name` from the store, served before it is whole: `None`
    /// when this tier serves nothing lazily, the store has no template of
    /// that name, or the node has it already (the caller opens it).
    pub async fn serve_template(&self, repo: &Repository, name: &str) -> Result<Option<Template>> {
        let Some(lazy) = &self.lazy else {
            return Ok(None);
        };
        let _this_name = self.fetching.lock(name).await;
        let alias = siesta_template::alias(name);
        if local_alias(repo, &alias).await?.is_some() {
            return Ok(None);
        }
        let id = match self.remote.alias_target(&alias).await {
            Ok(id) => id,
            Err(RemoteError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(remote_err(name, e)),
        };
        let _this_snapshot = self.pulling.lock(&id).await;
        if repo.get(&id).is_ok() {
            // Fetched by id before (a user snapshot's template): named now.
            set_local_alias(repo, &alias, &id).await?;
            return Ok(None);
        }
        let (repo2, cache) = (repo.clone(), self.cache.clone());
        let on_imported: crate::lazy::OnImported = Box::new(move |record| {
            repo2.set_alias(&alias, &record.id)?;
            match cache {
                Some(cache) => cache.mark(&record.id),
                None => Ok(()),
            }
        });
        let view = lazy.open(&self.remote, repo, &id, on_imported).await?;
        Ok(view.map(|v| {
            tracing::info!(name, snapshot = %id, "serving a template from the object store before it is whole");
            v.template.clone()
        }))
    }

    /// Waits until template snapshot `id`, if it is being served lazily,
    /// is whole and in the repository.
    pub async fn wait_imported(&self, id: &str) -> Result<()> {
        match &self.lazy {
            Some(lazy) => lazy.wait_imported(id).await,
            None => Ok(()),
        }
    }

    /// Marks what this tier fetches in `cache`, which bounds it.
    pub fn with_cache(mut self, cache: FetchCache) -> Self {
        self.cache = Some(cache);
        self
    }

    pub fn cache(&self) -> Option<&FetchCache> {
        self.cache.as_ref()
    }

    /// Fetches what a create's `name` names (a template, a snapshot id or
    /// a named snapshot) into `repo`, with its local alias: the record
    /// fetched, or `None` when the object store holds nothing of that
    /// name. A damaged object or an unreachable store is an error and
    /// installs nothing.
    pub async fn fetch(&self, repo: &Repository, name: &str) -> Result<Option<SnapshotRecord>> {
        self.fetch_first(repo, name, &candidates(name)).await
    }

    /// Fetches template `name` (the alias `template:NAME`).
    pub async fn fetch_template(
        &self,
        repo: &Repository,
        name: &str,
    ) -> Result<Option<SnapshotRecord>> {
        self.fetch_first(repo, name, &[siesta_template::alias(name)])
            .await
    }

    /// Fetches snapshot `id` (a user snapshot's template, say).
    pub async fn fetch_id(&self, repo: &Repository, id: &str) -> Result<Option<SnapshotRecord>> {
        self.fetch_first(repo, id, &[id.to_string()]).await
    }

    async fn fetch_first(
        &self,
        repo: &Repository,
        name: &str,
        candidates: &[String],
    ) -> Result<Option<SnapshotRecord>> {
        let _this_name = self.fetching.lock(name).await;
        for candidate in candidates {
            let is_alias = candidate.contains(':');
            if is_alias && local_alias(repo, candidate).await?.is_some() {
                // Fetched by a create that held the lock before this one.
                return Ok(Some(blocking_resolve(repo, candidate).await?));
            }
            let id = if is_alias {
                match self.remote.alias_target(candidate).await {
                    Ok(id) => id,
                    Err(RemoteError::NotFound(_)) => continue,
                    Err(e) => return Err(remote_err(name, e)),
                }
            } else {
                candidate.clone()
            };
            let _this_snapshot = self.pulling.lock(&id).await;
            if self.lazy.as_ref().and_then(|l| l.view(&id)).is_some() {
                // Being served lazily: its fill imports it.
                self.wait_imported(&id).await?;
            }
            let started = Instant::now();
            let record = match self.remote.pull(repo, &id).await {
                Ok(r) => r,
                // Not a snapshot id, or not one the store has.
                Err(
                    RemoteError::NotFound(_) | RemoteError::Repo(RepoError::InvalidName { .. }),
                ) if !is_alias => continue,
                Err(e) => return Err(remote_err(name, e)),
            };
            if is_alias {
                set_local_alias(repo, candidate, &record.id).await?;
            }
            if let Some(cache) = self.cache.as_ref().filter(|_| FetchCache::keeps(&record)) {
                cache.mark(&record.id)?;
            }
            tracing::info!(
                name,
                snapshot = %record.id,
                ms = started.elapsed().as_millis() as u64,
                "fetched from the object store"
            );
            return Ok(Some(record));
        }
        Ok(None)
    }
}

impl RemoteTier {
    /// Puts user snapshot `id` of `repo` in the store, with the template
    /// snapshot it was taken over (`parent`) if the store lacks it, and its
    /// `aliases` where the store has none of those names yet (another
    /// node's snapshot of the same name keeps it). Other nodes can then
    /// create from it.
    pub async fn share(
        &self,
        repo: &Repository,
        id: &str,
        parent: Option<&str>,
        aliases: &[String],
    ) -> Result<()> {
        let err = |e| write_err("sharing", id, e);
        if let Some(parent) = parent {
            if !self.remote.contains(parent).await.map_err(err)? {
                self.remote.push(repo, parent).await.map_err(err)?;
            }
        }
        self.remote.push(repo, id).await.map_err(err)?;
        for alias in aliases {
            if !self.remote.alias_if_absent(alias, id).await.map_err(err)? {
                tracing::warn!(
                    snapshot = id,
                    alias,
                    "the object store's alias names another node's snapshot; left as it is"
                );
            }
        }
        Ok(())
    }

    /// Deletes snapshot `id` from the store (a tombstone first: a push of
    /// it still running gives up).
    pub async fn unshare(&self, id: &str) -> Result<()> {
        self.remote
            .delete(id)
            .await
            .map(|_| ())
            .map_err(|e| write_err("deleting", id, e))
    }
}

fn write_err(what: &'static str, id: &str, e: RemoteError) -> Error {
    Error::RemoteWrite {
        what,
        id: id.to_string(),
        detail: e.to_string(),
    }
}

fn remote_err(name: &str, e: RemoteError) -> Error {
    Error::Remote {
        name: name.to_string(),
        detail: e.to_string(),
    }
}

async fn local_alias(repo: &Repository, alias: &str) -> Result<Option<String>> {
    let alias = alias.to_string();
    on_blocking_thread(repo, "reading a local alias", move |r| {
        r.alias_target(&alias)
    })
    .await
}

async fn blocking_resolve(repo: &Repository, alias: &str) -> Result<SnapshotRecord> {
    let alias = alias.to_string();
    on_blocking_thread(repo, "resolving a local alias", move |r| r.resolve(&alias)).await
}

async fn set_local_alias(repo: &Repository, alias: &str, id: &str) -> Result<()> {
    let (alias, id) = (alias.to_string(), id.to_string());
    on_blocking_thread(repo, "setting a local alias", move |r| {
        r.set_alias(&alias, &id)
    })
    .await
}

/// Runs `f` with the repository on a blocking thread (it fsyncs, and
/// waits while another writer holds a lock).
async fn on_blocking_thread<T, F>(repo: &Repository, what: &str, f: F) -> Result<T>
where
    F: FnOnce(&Repository) -> std::result::Result<T, RepoError> + Send + 'static,
    T: Send + 'static,
{
    let repo = repo.clone();
    siesta_host::blocking::run(what, move || Ok(f(&repo)?)).await
}
