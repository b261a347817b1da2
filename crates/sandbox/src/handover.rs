//! Paused sandboxes handed from one node to another through the object
//! store (docs/cluster.md §3).
//!
//! In a cluster with a store configured, every pause is shared in the background once
//! committed ([`SandboxManager::share_pause`]): its snapshot is pushed
//! (the template it was taken over first, if the store lacks it), and the
//! row observer is told which snapshot holds the pause, which the cluster
//! records beside the sandbox's row. A resume or a kill takes it out of
//! the store again. A node that takes over a paused sandbox of a dead node
//! calls [`SandboxManager::adopt_paused`] with the row and that snapshot
//! id: the snapshot is fetched (every file checked against its SHA-256),
//! its disk re-pointed at this node's template disk, and published here as
//! an ordinary pause of this node, with the row: from then on a connect
//! resumes it as if it had been paused here.

use std::sync::Arc;

use siesta_snapshot::record::{DISK, STATE};
use siesta_snapshot::SnapshotRecord;
use tokio::sync::Mutex;

use crate::blocking;
use crate::error::{Error, IoContext, Result};
use crate::manager::SandboxManager;
use crate::sandbox::{Sandbox, SandboxInfo, SandboxRecord, SandboxState, DISK_FILE};
use crate::store;

impl SandboxManager {
    /// Pushes paused sandbox `id`'s snapshot to the object store in the
    /// background and reports it to the row observer once there. Only in a
    /// cluster (a row observer is set) with a store: alone, no other node
    /// could take the pause over, and pushing it would be wasted.
    pub(crate) fn share_pause(&self, id: &str, snapshot: &SnapshotRecord) {
        let (Some(remote), Ok(repo), Some(observer)) =
            (self.remote().cloned(), self.repo(), self.store.observer())
        else {
            return;
        };
        let (id, snap, parent) = (id.to_string(), snapshot.id.clone(), snapshot.parent.clone());
        self.transfers.spawn(async move {
            let started = std::time::Instant::now();
            if let Err(e) = remote.share(&repo, &snap, parent.as_deref(), &[]).await {
                // A resume that came first deleted it (tombstone): expected.
                tracing::warn!(sandbox = %id, snapshot = %snap, "pause not shared: {e}");
                return;
            }
            // Still this sandbox's pause? A resume in between spent it.
            let current = repo.alias_target(&crate::paused::alias(&id)).ok().flatten();
            if current.as_deref() != Some(snap.as_str()) {
                return;
            }
            tracing::info!(sandbox = %id, snapshot = %snap,
                ms = started.elapsed().as_millis() as u64, "pause shared through the object store");
            observer.pause_stored(&id, Some(&snap));
        });
    }

    /// Takes spent or deleted pause `snapshot` of sandbox `id` out of the
    /// object store, in the background (the store's copy must not be
    /// resumed elsewhere once this one moved on).
    pub(crate) fn unshare_pause(&self, id: &str, snapshot: &str) {
        let (Some(remote), Some(observer)) = (self.remote().cloned(), self.store.observer()) else {
            return;
        };
        observer.pause_stored(id, None);
        let (id, snap) = (id.to_string(), snapshot.to_string());
        self.transfers.spawn(async move {
            if let Err(e) = remote.unshare(&snap).await {
                tracing::warn!(sandbox = %id, snapshot = %snap,
                    "spent pause left in the object store: {e}; `siesta repo check --remote --repair` removes it");
            }
        });
    }

    /// Makes paused sandbox `row` (another node's, taken over) this node's:
    /// fetches its pause `snapshot` from the object store and publishes it
    /// here, then commits the row. On error nothing of it is left here.
    pub(crate) async fn adopt_paused_op(
        &self,
        row: SandboxRecord,
        snapshot: &str,
    ) -> Result<SandboxInfo> {
        self.check_open()?;
        // The row comes from the cluster's store, not from this node: its id
        // is joined to a directory below, removed whole if anything fails.
        if !crate::ids::is_sandbox_id(&row.id) {
            return Err(Error::Invalid(format!(
                "refusing to adopt a sandbox row whose id {:?} is not letters and digits",
                row.id
            )));
        }
        if row.state != SandboxState::Paused {
            return Err(Error::Invalid(format!(
                "sandbox {} is {}, not paused: only a paused sandbox can move to another node",
                row.id,
                row.state.as_str()
            )));
        }
        let remote = self.remote().cloned().ok_or_else(|| {
            Error::Invalid(format!(
                "sandbox {} is paused on another node, and this node has no object store \
                 configured to fetch it from (SIESTA_S3_*)",
                row.id
            ))
        })?;
        let template = self.open_template(&row.template).await?;
        let repo = self.repo()?;
        let fetched = remote
            .fetch_id(&repo, snapshot)
            .await?
            .ok_or_else(|| Error::Remote {
                name: row.id.clone(),
                detail: format!("its paused snapshot {snapshot} is not in the object store"),
            })?;
        let dir = self.node.config.layout().sandbox_dir(&row.id);
        let published = republish(&repo, &template, &row, &fetched, &dir).await;
        // The fetched copy has served its purpose either way.
        let spent = fetched.id.clone();
        if let Err(e) =
            blocking::repo(&repo, "dropping a fetched pause", move |r| r.delete(&spent)).await
        {
            tracing::warn!(sandbox = %row.id, "dropping fetched pause {}: {e}", fetched.id);
        }
        let published = match published {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let mut row = row;
        row.agent_addr = None;
        row.vmm_pid = None;
        if let Err(e) = self.save_record(&row).await {
            self.delete_pause(&row.id).await;
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let sandbox = Sandbox {
            dir,
            record: row,
            running: None,
            stopping: None,
        };
        let info = sandbox.info();
        tracing::info!(sandbox = %info.id, snapshot, "took over a paused sandbox");
        // Its pause is this node's now: shared under this node's snapshot
        // (so a third node could take it over from here), and the dead
        // node's copy removed from the store.
        self.share_pause(&info.id, &published);
        let (old, sandbox_id) = (snapshot.to_string(), info.id.clone());
        self.transfers.spawn(async move {
            if let Err(e) = remote.unshare(&old).await {
                tracing::warn!(
                    sandbox = sandbox_id,
                    snapshot = old,
                    "the dead node's pause stays in the object store: {e}"
                );
            }
        });
        self.sandboxes
            .lock()
            .await
            .insert(info.id.clone(), Arc::new(Mutex::new(sandbox)));
        Ok(info)
    }
}

/// Publishes `fetched` (another node's pause of `row`) as this node's pause
/// of it: its disk taken into `dir` and re-pointed at this node's template
/// disk, its state linked in as it is.
async fn republish(
    repo: &siesta_snapshot::Repository,
    template: &siesta_template::Template,
    row: &SandboxRecord,
    fetched: &SnapshotRecord,
    dir: &std::path::Path,
) -> Result<SnapshotRecord> {
    std::fs::create_dir_all(dir).ctx("creating sandbox directory", dir)?;
    let disk = dir.join(DISK_FILE);
    let state = dir.join("taken-over.state");
    let (id, d, s) = (fetched.id.clone(), disk.clone(), state.clone());
    let has_state = fetched.files.contains_key(STATE);
    blocking::repo(repo, "taking a fetched pause's files", move |r| {
        r.take_file(&id, DISK, &d)?;
        if has_state {
            r.take_file(&id, STATE, &s)?;
        }
        Ok(())
    })
    .await?;
    siesta_host::disk::rebase_onto(&disk, &template.disk_path()).await?;
    let state_sha = fetched
        .files
        .get(STATE)
        .and_then(|f| f.digest().map(String::from));
    let (repo, template, sandbox) = (repo.clone(), template.clone(), row.id.clone());
    let (d, s) = (disk.clone(), state.clone());
    let record = blocking::run("publishing a taken-over pause", move || {
        let disk_sha = siesta_snapshot::repo::sha256_file(&d)?;
        let state = has_state.then_some((s.as_path(), state_sha));
        crate::paused::publish(&repo, &template, &sandbox, state, (&d, disk_sha), false)
    })
    .await?;
    // The repository holds the disk now (as after a pause here).
    std::fs::remove_file(&disk).ctx("unlinking a taken-over disk", &disk)?;
    Ok(record)
}

impl SandboxManager {
    /// Waits (at most `limit`) for the background transfers to the object
    /// store to finish, after [`SandboxManager::shutdown`]: the pauses it
    /// made reach the store, so another node can take them over. Returns
    /// false if some were still running at the limit.
    pub async fn wait_transfers(&self, limit: std::time::Duration) -> bool {
        self.transfers.close();
        tokio::time::timeout(limit, self.transfers.wait())
            .await
            .is_ok()
    }

    /// Drops paused (or dead) sandbox `id` from this node without touching
    /// the object store: another node took it over while this one was
    /// gone, and the sandbox lives there now. A running sandbox is left
    /// alone (false): it never moves.
    pub async fn forget_moved(&self, id: &str) -> Result<bool> {
        let mut sb = self.lock(id).await?;
        if sb.record.state == SandboxState::Running {
            return Ok(false);
        }
        let row = id.to_string();
        store::db(&self.store, "forgetting a sandbox that moved", move |s| {
            s.delete(&row)
        })
        .await?;
        self.sandboxes.lock().await.remove(id);
        sb.record.id.clear();
        // The store's copy is the new owner's business now.
        self.delete_local_pause(id).await?;
        match std::fs::remove_dir_all(&sb.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).ctx("removing sandbox directory", &sb.dir)
            }
            _ => Ok(true),
        }
    }
}
