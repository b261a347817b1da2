//! The sandbox manager's side of the fetched-snapshot cache: which fetched
//! snapshots its sandboxes need, a use recorded at every create, and the
//! prune run after every fetch.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use siesta_snapshot::Repository;

use crate::manager::SandboxManager;
use crate::pool::VmmPool;
use crate::sandbox::SandboxState;
use crate::store::Store;
use crate::Result;
use siesta_tier::fetch_cache::{Evicted, FetchCache, MIN_IDLE};

impl SandboxManager {
    /// Records a use of snapshot `id` (a template or user snapshot a create
    /// resumes from) when it was fetched from the object store.
    pub(crate) fn used_fetched(&self, id: &str) {
        if let Some(cache) = self.remote().and_then(|r| r.cache()) {
            cache.touch(id);
        }
    }

    /// Prunes the fetched snapshots in the background, after a fetch (it
    /// never delays the create that fetched).
    pub(crate) async fn prune_fetched_later(&self) {
        let Some(cache) = self.remote().and_then(|r| r.cache()).cloned() else {
            return;
        };
        let Ok(repo) = self.repo() else { return };
        let Some(running) = self.running_templates().await else {
            tracing::debug!("fetched snapshots not pruned: a sandbox is busy; next fetch");
            return;
        };
        let (store, pool) = (Arc::clone(&self.store), Arc::clone(&self.pool));
        self.transfers.spawn(async move {
            if let Err(e) = prune(&cache, &repo, &store, &pool, running, MIN_IDLE).await {
                tracing::warn!("pruning the fetched snapshots: {e}");
            }
        });
    }

    /// The template snapshots the running sandboxes were resumed on;
    /// `None` while one is busy (a pause or resume holds it): what it runs
    /// on is then unknown.
    async fn running_templates(&self) -> Option<HashSet<String>> {
        let mut ids = HashSet::new();
        for entry in self.sandboxes.lock().await.values() {
            let sb = entry.try_lock().ok()?;
            let running = sb.running.as_ref().map(|r| &r.template.snapshot);
            if let Some(Some(snap)) = running {
                ids.insert(snap.id.clone());
            }
        }
        Some(ids)
    }

    /// Prunes the fetched snapshots now, to `max_bytes` (none: the
    /// configured bound), sparing those used within `min_idle`. Returns
    /// what was deleted locally; without an object store, nothing.
    pub async fn prune_fetched(
        &self,
        max_bytes: Option<u64>,
        min_idle: Duration,
    ) -> Result<Vec<Evicted>> {
        let Some(cache) = self.remote().and_then(|r| r.cache()) else {
            return Ok(Vec::new());
        };
        let mut cache = cache.clone();
        if let Some(bytes) = max_bytes {
            cache = cache.with_max_bytes(bytes);
        }
        let Some(running) = self.running_templates().await else {
            return Ok(Vec::new());
        };
        prune(
            &cache,
            &self.repo()?,
            &self.store,
            &self.pool,
            running,
            min_idle,
        )
        .await
    }
}

async fn prune(
    cache: &FetchCache,
    repo: &Repository,
    store: &Arc<Store>,
    pool: &VmmPool,
    running: HashSet<String>,
    min_idle: Duration,
) -> Result<Vec<Evicted>> {
    let (cache2, repo2, store) = (cache.clone(), repo.clone(), Arc::clone(store));
    let evicted = crate::blocking::run("pruning the fetched snapshots", move || {
        let mut in_use = in_use(&store, &repo2)?;
        in_use.extend(running);
        Ok::<_, crate::Error>(cache2.prune(&repo2, &in_use, min_idle)?)
    })
    .await?;
    // Pooled VMMs of an evicted template map its deleted files: they would
    // keep the disk space taken.
    for gone in &evicted {
        pool.discard_snapshot(&gone.id).await;
    }
    Ok(evicted)
}

/// The snapshots the node's sandboxes (running or paused) may have been
/// made from, by name: what each row's template name names here (a
/// template, a snapshot id, a named snapshot). Paused ones are held by
/// their pause's parent, running ones by the template they run on.
fn in_use(store: &Store, repo: &Repository) -> Result<HashSet<String>> {
    let mut ids = HashSet::new();
    for row in store.all()? {
        if row.state == SandboxState::Dead {
            continue;
        }
        let name = &row.template;
        ids.insert(name.clone());
        for alias in [siesta_template::alias(name), format!("snapshot:{name}")] {
            if let Ok(Some(id)) = repo.alias_target(&alias) {
                ids.insert(id);
            }
        }
    }
    Ok(ids)
}
