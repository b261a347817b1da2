//! Lists across the cluster: `GET /v2/sandboxes` and `GET /sandboxes` on
//! any node show every node's sandboxes.
//!
//! The rows come from etcd (each owner mirrors its own, written before any
//! call that changed them answered) and go through the very query a
//! node's own list runs ([`Store::list`]: filters, order, cursor pages),
//! on an in-memory copy. A sandbox whose node died shows as it can be
//! had: paused if its pause is in the object store (a connect takes it
//! over), dead otherwise.

use siesta_cluster::{Cluster, ClusterRow};
use siesta_sandbox::sandbox::{SandboxInfo, SandboxState};
use siesta_sandbox::store::{ListQuery, Store, StoreError};

use crate::error::ApiError;

/// One page of the cluster's sandboxes matching `q`, and the next page's
/// token.
pub async fn list_page(
    cluster: &Cluster,
    q: &ListQuery,
) -> Result<(Vec<SandboxInfo>, Option<String>), ApiError> {
    let rows = cluster.rows().await.map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("listing the cluster's sandboxes: {e}"),
        )
    })?;
    let q = q.clone();
    let listed = tokio::task::spawn_blocking(move || {
        let store = Store::in_memory()?;
        for r in rows {
            store.put(&as_listed(r))?;
        }
        store.list(&q)
    })
    .await
    .map_err(|e| {
        ApiError::from(siesta_sandbox::Error::Internal {
            what: "listing the cluster's sandboxes".into(),
            detail: e.to_string(),
        })
    })?;
    listed.map_err(|e| match e {
        StoreError::BadCursor(_) => ApiError::from(siesta_sandbox::Error::Invalid(e.to_string())),
        e => ApiError::from(siesta_sandbox::Error::from(e)),
    })
}

/// A row as the list shows it: a dead node's sandbox is dead unless its
/// pause can move.
fn as_listed(r: ClusterRow) -> SandboxInfo {
    let mut row = r.row;
    let movable = row.state == SandboxState::Paused && r.stored;
    if !r.owner_alive && !movable && row.state != SandboxState::Dead {
        row.dead_reason = Some(format!(
            "its node {} died (its lease expired) while it was {}",
            r.owner,
            row.state.as_str()
        ));
        row.state = SandboxState::Dead;
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: SandboxState, alive: bool, stored: bool) -> ClusterRow {
        let now = chrono::Utc::now();
        ClusterRow {
            owner: "a".into(),
            owner_alive: alive,
            stored,
            row: SandboxInfo {
                id: "sb".into(),
                template: "base".into(),
                state,
                created_at: now,
                started_at: now,
                end_at: now,
                access_token: "t".into(),
                env_vars: Default::default(),
                metadata: Default::default(),
                egress: Default::default(),
                traffic_token: None,
                cpu_count: 2,
                memory_mb: 512,
                disk_size_mb: 2048,
                lifecycle: Default::default(),
                agent_addr: None,
                vmm_pid: None,
                timings: None,
                dead_reason: None,
                guest_defaults: siesta_sandbox::sandbox::GuestDefaults {
                    user: "user".into(),
                    workdir: "/home/user".into(),
                },
                volume_mounts: Vec::new(),
                paused_disk_only: false,
            },
        }
    }

    #[test]
    fn a_dead_nodes_sandbox_is_dead_unless_its_pause_can_move() {
        let listed = |state, alive, stored| as_listed(row(state, alive, stored)).state;
        assert_eq!(
            listed(SandboxState::Running, true, false),
            SandboxState::Running
        );
        assert_eq!(
            listed(SandboxState::Paused, false, true),
            SandboxState::Paused
        );
        assert_eq!(
            listed(SandboxState::Paused, false, false),
            SandboxState::Dead
        );
        let dead = as_listed(row(SandboxState::Running, false, false));
        assert_eq!(dead.state, SandboxState::Dead);
        assert!(dead.dead_reason.unwrap().contains("node a died"));
    }
}
