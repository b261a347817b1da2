//! Node registration: `/siesta/nodes/<id>` under a lease the node keeps
//! alive. When the node dies (or is cut off) the lease runs out, etcd
//! deletes the key, and other nodes may take over its paused sandboxes.
//! The record is sealed with the cluster key: a node that is not in the
//! cluster cannot register itself and have requests forwarded to it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::etcd::Compare;
use crate::state::ClusterState;

pub(crate) const NODES: &str = "/siesta/nodes/";

/// What a node publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: String,
    /// `host:port` where other nodes reach its API and front door.
    pub api: String,
}

pub(crate) fn node_key(id: &str) -> String {
    format!("{NODES}{id}")
}

/// Registers `info` under a new lease of `ttl`; fails if a live node
/// already holds the id (two nodes with one id would each take the
/// other's sandboxes for their own).
pub(crate) async fn register(st: &ClusterState, info: &NodeInfo, ttl: Duration) -> Result<i64> {
    let etcd = &st.etcd;
    let lease = etcd.grant(ttl.as_secs().max(2)).await?;
    let value = serde_json::to_vec(info).map_err(|e| Error::Config(e.to_string()))?;
    let key = node_key(&info.id);
    let put = st.sealed_put(key.clone(), &value, Some(lease))?;
    if etcd.txn(&[Compare::Absent(key)], &[put]).await? {
        Ok(lease)
    } else {
        let _ = etcd.revoke(lease).await;
        Err(Error::NodeIdTaken {
            id: info.id.clone(),
        })
    }
}

/// Renews `lease` every third of `ttl` until `stop` fires; then revokes
/// it, so other nodes see this one gone at once rather than a TTL later.
/// A lease that expired anyway (etcd unreachable for longer than `ttl`)
/// is registered again under a new one.
pub(crate) async fn keep_registered(
    st: ClusterState,
    info: Arc<NodeInfo>,
    mut lease: i64,
    ttl: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let period = ttl / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => break,
        }
        match st.etcd.keep_alive(lease).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!(node = info.id, "cluster lease expired: registering again");
                match register(&st, &info, ttl).await {
                    Ok(new) => lease = new,
                    Err(e) => tracing::warn!(node = info.id, "registering again: {e}"),
                }
            }
            Err(e) => tracing::warn!(node = info.id, "renewing the cluster lease: {e}"),
        }
    }
    if let Err(e) = st.etcd.revoke(lease).await {
        tracing::warn!(node = info.id, "revoking the cluster lease: {e}");
    }
}

/// The node registered as `id`, if its lease is alive.
pub(crate) async fn lookup(st: &ClusterState, id: &str) -> Result<Option<NodeInfo>> {
    let Some(kv) = st.etcd.get(&node_key(id)).await? else {
        return Ok(None);
    };
    parse(&kv.key, &st.open(&kv)?).map(Some)
}

/// A node record, checked to be the node its key names.
pub(crate) fn parse(key: &str, value: &[u8]) -> Result<NodeInfo> {
    let info: NodeInfo = serde_json::from_slice(value).map_err(|e| Error::BadRecord {
        key: key.to_string(),
        detail: e.to_string(),
    })?;
    if key.strip_prefix(NODES) != Some(info.id.as_str()) {
        return Err(Error::BadRecord {
            key: key.to_string(),
            detail: format!("it names node {:?}", info.id),
        });
    }
    Ok(info)
}
