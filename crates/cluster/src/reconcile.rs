//! What a node does with its own sandboxes when it joins: those another
//! node took over while this one was gone (its lease expired) are not
//! this node's any more, and are dropped here so that requests for them
//! are forwarded to their new owner instead of resuming a stale copy.

use siesta_sandbox::sandbox::SandboxState;
use siesta_sandbox::SandboxManager;

use crate::{Cluster, Location, Result};

/// Drops every paused or dead sandbox of `manager` that the cluster says
/// another node owns; returns their ids.
pub async fn drop_moved(cluster: &Cluster, manager: &SandboxManager) -> Result<Vec<String>> {
    let mut dropped = Vec::new();
    for sandbox in manager.list().await {
        if sandbox.state == SandboxState::Running {
            continue;
        }
        let owner = match cluster.locate(&sandbox.id).await? {
            Location::Elsewhere(node, _) => node.id,
            Location::Orphaned(owned) if owned.node != cluster.node().id => owned.node,
            _ => continue,
        };
        match manager.forget_moved(&sandbox.id).await {
            Ok(true) => {
                tracing::info!(
                    sandbox = sandbox.id,
                    owner,
                    "taken over by another node while this one was gone: dropped here"
                );
                dropped.push(sandbox.id);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(sandbox = sandbox.id, "dropping a sandbox that moved: {e}"),
        }
    }
    Ok(dropped)
}
