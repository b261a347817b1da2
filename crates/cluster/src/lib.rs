//! siesta-cluster: the state several siesta nodes share, kept in etcd.
//!
//! - [`membership`]: each node registers `/siesta/nodes/<id>` (its API
//!   address) under a lease it keeps alive; a dead node's key expires.
//! - [`directory`]: which node owns which sandbox, and the owner's copy of
//!   its row, written from the node's SQLite store in commit order.
//!
//! The server uses [`Cluster::locate`] to forward requests for a sandbox
//! held by another node, and [`Cluster::take_over`] to claim a paused
//! sandbox of a node whose lease expired. With no etcd configured a node
//! has no [`Cluster`] and works alone. Design: `docs/cluster.md` §3.

pub mod directory;
mod error;
pub mod etcd;
pub mod membership;
pub mod reconcile;
pub mod seal;
mod state;

use std::sync::Arc;
use std::time::Duration;

pub use directory::{ClusterRow, Owned, RowWriter};
pub use error::{Error, Result};
pub use etcd::{Etcd, EtcdConfig};
pub use membership::NodeInfo;
pub use seal::ClusterKey;
use state::ClusterState;

/// How a node joins the cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Where etcd is and how this node signs in to it.
    pub etcd: EtcdConfig,
    /// The key every node of the cluster shares ([`seal`]).
    pub key: Arc<ClusterKey>,
    /// This node's id, unique in the cluster.
    pub node_id: String,
    /// `host:port` at which the other nodes reach this node's API.
    pub advertise: String,
    /// How long the node's registration outlives its last renewal.
    pub lease_ttl: Duration,
}

/// Default lease: a dead node's paused sandboxes can be taken over 10 s
/// after its last renewal.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Registers `me`; if its id is still held, waits up to a lease (and a
/// little) for it to free: that is this node's own registration from
/// before a crash and restart, which expires. A live node with the same id
/// keeps renewing it, and this one is then refused.
async fn register_when_free(st: &ClusterState, me: &NodeInfo, ttl: Duration) -> Result<i64> {
    let deadline = tokio::time::Instant::now() + ttl + Duration::from_secs(2);
    let mut told = false;
    loop {
        match membership::register(st, me, ttl).await {
            Err(Error::NodeIdTaken { .. }) if tokio::time::Instant::now() < deadline => {
                if !told {
                    tracing::info!(
                        node = me.id,
                        "node id still registered (this node before a restart?): waiting up to {ttl:?} for it to expire"
                    );
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

/// Where a sandbox is, seen from one node.
#[derive(Debug, Clone)]
pub enum Location {
    /// No node holds it.
    Unknown,
    /// This node holds it.
    Here,
    /// A live node holds it, with its row as that node last wrote it.
    Elsewhere(NodeInfo, Box<Owned>),
    /// A node whose lease expired holds it: it may be taken over.
    Orphaned(Box<Owned>),
}

/// This node's membership of the cluster.
pub struct Cluster {
    st: ClusterState,
    me: Arc<NodeInfo>,
    rows: Arc<RowWriter>,
    stop: tokio::sync::watch::Sender<bool>,
    renewer: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Cluster {
    /// Registers this node (failing if etcd does not answer, or a live
    /// node has its id) and keeps the registration alive until
    /// [`Cluster::leave`].
    pub async fn join(config: ClusterConfig) -> Result<Arc<Self>> {
        if config.node_id.is_empty() || config.node_id.contains('/') {
            return Err(Error::Config(format!(
                "node id {:?} must be non-empty and contain no '/'",
                config.node_id
            )));
        }
        let st = ClusterState {
            etcd: Etcd::new(&config.etcd)?,
            key: config.key,
        };
        let me = Arc::new(NodeInfo {
            id: config.node_id,
            api: config.advertise,
        });
        let lease = register_when_free(&st, &me, config.lease_ttl).await?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let renewer = tokio::spawn(membership::keep_registered(
            st.clone(),
            me.clone(),
            lease,
            config.lease_ttl,
            stopped,
        ));
        let rows = Arc::new(RowWriter::start(st.clone(), me.id.clone()));
        tracing::info!(node = me.id, api = me.api, "joined the cluster");
        Ok(Arc::new(Self {
            st,
            me,
            rows,
            stop,
            renewer: tokio::sync::Mutex::new(Some(renewer)),
        }))
    }

    pub fn node(&self) -> &NodeInfo {
        &self.me
    }

    /// What the node's store reports its row changes to.
    pub fn row_writer(&self) -> Arc<RowWriter> {
        self.rows.clone()
    }

    /// Where sandbox `id` is.
    pub async fn locate(&self, id: &str) -> Result<Location> {
        let Some(owned) = directory::lookup(&self.st, id).await? else {
            return Ok(Location::Unknown);
        };
        if owned.node == self.me.id {
            return Ok(Location::Here);
        }
        Ok(match membership::lookup(&self.st, &owned.node).await? {
            Some(node) => Location::Elsewhere(node, Box::new(owned)),
            None => Location::Orphaned(Box::new(owned)),
        })
    }

    /// Claims sandbox `id` from node `from` (whose lease expired); false if
    /// another node claimed it first.
    pub async fn take_over(&self, id: &str, from: &str) -> Result<bool> {
        directory::take_over(&self.st.etcd, id, from, &self.me.id).await
    }

    /// Gives sandbox `id`, claimed by this node, back to node `to` (a
    /// takeover that could not finish: another node may try again).
    pub async fn give_back(&self, id: &str, to: &str) -> Result<bool> {
        directory::take_over(&self.st.etcd, id, &self.me.id, to).await
    }

    /// Writes out what is pending and deregisters: other nodes see this
    /// node gone at once.
    pub async fn leave(&self) {
        self.rows.flush().await;
        let _ = self.stop.send(true);
        if let Some(renewer) = self.renewer.lock().await.take() {
            let _ = renewer.await;
        }
    }

    /// Every sandbox row in the cluster, with where it stands.
    pub async fn rows(&self) -> Result<Vec<directory::ClusterRow>> {
        let live: std::collections::HashSet<String> =
            self.nodes().await?.into_iter().map(|n| n.id).collect();
        directory::all_rows(&self.st, &live).await
    }

    /// The nodes registered now (a record that does not open with the
    /// cluster key is no node of this cluster, and is passed over).
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>> {
        let kvs = self.st.etcd.get_prefix(membership::NODES).await?;
        let mut nodes = Vec::new();
        for kv in kvs {
            match self
                .st
                .open(&kv)
                .and_then(|v| membership::parse(&kv.key, &v))
            {
                Ok(node) => nodes.push(node),
                Err(e) => tracing::warn!("not a node of this cluster: {e}"),
            }
        }
        Ok(nodes)
    }
}
