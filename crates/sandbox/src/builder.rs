//! How a [`SandboxManager`] is made: everything it holds for its life (the
//! node, its volumes, its object store) is given before it starts, so no
//! setter can race a create that already runs.
//!
//! ```ignore
//! let manager = SandboxManager::builder(node)
//!     .volumes(volumes)
//!     .remote(remote)
//!     .open()?;
//! ```

use std::sync::Arc;

use siesta_tier::fetch_cache::FetchCache;
use siesta_tier::lazy::LazyTier;
use siesta_tier::RemoteTier;

use crate::config::NodeConfig;
use crate::error::{IoContext, Result};
use crate::manager::{Parts, SandboxManager};
use crate::node::Node;
use crate::store::{Store, DB_FILE};

/// A manager to be: see [`SandboxManager::builder`].
pub struct ManagerBuilder {
    node: Arc<Node>,
    volumes: Option<Arc<siesta_volume::Volumes>>,
    remote: Option<RemoteTier>,
    #[cfg(feature = "test-hooks")]
    publish_hook: Option<siesta_snapshot::repo::PublishHook>,
}

impl ManagerBuilder {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self {
            node,
            volumes: None,
            remote: None,
            #[cfg(feature = "test-hooks")]
            publish_hook: None,
        }
    }

    /// The node's volumes, which sandboxes may mount (none: mounts are
    /// refused).
    pub fn volumes(mut self, volumes: Arc<siesta_volume::Volumes>) -> Self {
        self.volumes = Some(volumes);
        self
    }

    /// The node's object store: a create that names a template or
    /// snapshot not here fetches it from there first. A tier given without
    /// a cache or lazy serving gets the node's (`fetch_cache_mib`, and
    /// `lazy_fetch` where FUSE works).
    pub fn remote(mut self, remote: RemoteTier) -> Self {
        self.remote = Some(remote);
        self
    }

    /// Has every publication of the manager (pauses, snapshots) run `hook`
    /// at each step; tests use it to make a publication slow or stop it.
    #[cfg(feature = "test-hooks")]
    pub fn publish_hook(mut self, hook: siesta_snapshot::repo::PublishHook) -> Self {
        self.publish_hook = Some(hook);
        self
    }

    /// Opens the node's sandboxes: takes the data directory's lock, opens
    /// (or creates) `$SIESTA_HOME/siesta.db`, recovers what a previous
    /// server left (see [`crate::recovery`]) and starts the reaper. Paused
    /// sandboxes are listed and resumable; running ones whose VM did not
    /// survive are reported dead. Call within a tokio runtime.
    pub fn open(self) -> Result<Arc<SandboxManager>> {
        let layout = self.node.config.layout();
        let sandboxes = layout.sandboxes();
        std::fs::create_dir_all(&sandboxes).ctx("creating sandboxes directory", &sandboxes)?;
        let lock = crate::recovery::lock_home(layout.home())?;
        let store = Store::open(&layout.home().join(DB_FILE))?;
        let records = crate::recovery::recover(&store, &layout)?;
        Ok(self.start(store, records, Some(lock)))
    }

    /// A manager whose state lives in memory only (benchmarks, tests): it
    /// recovers nothing and kills its sandboxes at shutdown. It shares the
    /// data directory's `sandboxes/` with a server that may run beside it,
    /// so it never cleans other directories there.
    pub fn ephemeral(self) -> Result<Arc<SandboxManager>> {
        Ok(self.start(Store::in_memory()?, Vec::new(), None))
    }

    fn start(
        self,
        store: Store,
        records: Vec<crate::sandbox::SandboxRecord>,
        home_lock: Option<std::fs::File>,
    ) -> Arc<SandboxManager> {
        let remote = self
            .remote
            .map(|r| Arc::new(with_node_defaults(r, &self.node.config)));
        SandboxManager::start(Parts {
            persistent: home_lock.is_some(),
            node: self.node,
            store,
            records,
            home_lock,
            volumes: self.volumes,
            remote,
            #[cfg(feature = "test-hooks")]
            publish_hook: self.publish_hook,
        })
    }
}

/// `remote` with the node's fetch cache (`fetch_cache_mib`) and, where
/// `lazy_fetch` is on and FUSE works, lazy serving, unless it came with
/// its own.
fn with_node_defaults(remote: RemoteTier, config: &NodeConfig) -> RemoteTier {
    let remote = match remote.cache() {
        Some(_) => remote,
        None => remote.with_cache(FetchCache::new(
            config.layout().fetched(),
            config.fetch_cache_mib << 20,
        )),
    };
    match remote.lazy() {
        Some(_) => remote,
        None if !config.lazy_fetch => remote,
        None => match LazyTier::mount(&config.layout().lazy()) {
            Ok(lazy) => remote.with_lazy(lazy),
            Err(e) => {
                tracing::warn!("templates from the object store are fetched whole: {e}");
                remote
            }
        },
    }
}
