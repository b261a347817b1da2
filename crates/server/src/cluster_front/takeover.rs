//! Taking over a paused sandbox of a node whose lease expired, when a
//! request for it arrives here.
//!
//! The claim is a compare-and-swap on the sandbox's owner key, so of
//! several nodes asked at once exactly one adopts it; the others forward
//! to that one from then on. The adoption itself (fetching the pause from
//! the object store, publishing it here, committing the row) is the
//! sandbox manager's ([`SandboxManager::adopt_paused`]); if it fails, the
//! claim is given back so the sandbox is not stranded on this node.

use axum::http::StatusCode;
use siesta_cluster::Owned;
use siesta_sandbox::sandbox::SandboxState;

use super::ClusterFront;
use crate::error::ApiError;

/// Makes orphaned sandbox `id` this node's; an error says why it cannot be.
pub(super) async fn adopt(
    front: &ClusterFront,
    id: &str,
    owned: Box<Owned>,
) -> Result<(), ApiError> {
    let Owned { node, row, stored } = *owned;
    let gone = |why: String| {
        // The SDK reads a 404 as "not found", which the sandbox now is.
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {id} was not found: {why}"),
        )
    };
    let Some(row) = row else {
        return Err(gone(format!(
            "node {node}, which held it, died before recording it"
        )));
    };
    // A row stored under one id that names another is forged or corrupt.
    if row.id != id {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "sandbox {id}'s row in the cluster store names another sandbox; not taking it over"
            ),
        ));
    }
    if row.state != SandboxState::Paused {
        return Err(gone(format!(
            "it was {} on node {node}, which died (its lease expired); what was only in its memory went with it",
            row.state.as_str()
        )));
    }
    let Some(snapshot) = stored else {
        return Err(gone(format!(
            "it was paused on node {node}, which died before its pause reached the object store"
        )));
    };
    let claimed = front.cluster.take_over(id, &node).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("taking over sandbox {id} from dead node {node}: {e}"),
        )
    })?;
    if !claimed {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} was just taken over by another node; retry the request"),
        ));
    }
    tracing::info!(
        sandbox = id,
        from = node,
        snapshot,
        "taking over a paused sandbox of a dead node"
    );
    if let Err(e) = front.manager.adopt_paused(row, &snapshot).await {
        if let Err(back) = front.cluster.give_back(id, &node).await {
            tracing::warn!(
                sandbox = id,
                "giving it back after a failed takeover: {back}"
            );
        }
        let mut err = ApiError::from(e);
        err.message = format!(
            "taking over sandbox {id} from dead node {node}: {}",
            err.message
        );
        return Err(err);
    }
    Ok(())
}
