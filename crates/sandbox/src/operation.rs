//! The manager's state-changing operations, each run as a task of its own.
//!
//! A create, pause, resume, snapshot, fork or kill changes a VM, a network
//! slot, files and a row in several steps. Run inside an HTTP handler's
//! future, it would stop at whichever await it had reached when the client
//! hung up (hyper drops the future): a slot taken for good, a paused
//! sandbox's disk moved out of its pause, a row that no longer says what
//! is on disk. So every public operation here spawns its body (the
//! `*_op` method next to the state it changes) on the manager's
//! [`operations`](SandboxManager::wait_operations) tracker and awaits it:
//! a caller that goes away leaves the operation to finish, and its result
//! is dropped. A clean stop waits for the operations in flight before it
//! pauses what runs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use siesta_net::EgressPolicy;

use crate::error::{Error, Result};
use crate::idempotent::KeyedOutcome;
use crate::manager::{CreateRequest, SandboxManager};
use crate::memory_save::{SaveMemory, SaveReport};
use crate::sandbox::{SandboxInfo, SandboxRecord};
use crate::snapshots::SnapshotInfo;

impl SandboxManager {
    /// Runs `op` as a tracked task and waits for its result; `what` names
    /// it in the error if the task panicked.
    async fn outliving<T, F>(&self, what: &str, op: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        match self.operations.spawn(op).await {
            Ok(result) => result,
            Err(e) => Err(Error::Internal {
                what: what.to_string(),
                detail: if e.is_panic() {
                    "the operation panicked".into()
                } else {
                    e.to_string()
                },
            }),
        }
    }

    /// Waits up to `limit` for the operations in flight; false if some
    /// were still running then.
    pub async fn wait_operations(&self, limit: Duration) -> bool {
        self.operations.close();
        let done = tokio::time::timeout(limit, self.operations.wait()).await;
        self.operations.reopen();
        done.is_ok()
    }

    /// Resumes a new sandbox from a template, or from a user snapshot when
    /// `req.template` names one.
    pub async fn create(self: &Arc<Self>, req: CreateRequest) -> Result<SandboxInfo> {
        let this = self.clone();
        // Boxed: a create's future is large (clippy::large_futures).
        let op = Box::pin(async move { Box::pin(this.create_op(req)).await });
        self.outliving("creating a sandbox", op).await
    }

    /// Creates as `req` asks unless `key` already made a sandbox (see
    /// [`crate::idempotent`]).
    pub async fn create_keyed(
        self: &Arc<Self>,
        key: &str,
        request_sha256: &str,
        req: CreateRequest,
    ) -> Result<(SandboxInfo, KeyedOutcome)> {
        let (this, key, sha) = (self.clone(), key.to_string(), request_sha256.to_string());
        let op = Box::pin(async move { Box::pin(this.create_keyed_op(&key, &sha, req)).await });
        self.outliving("creating a sandbox", op).await
    }

    /// Saves the sandbox's memory, devices and disk, then stops its VM and
    /// frees its slot. Its files and processes come back on `resume`.
    pub async fn pause(self: &Arc<Self>, id: &str) -> Result<()> {
        self.pause_with(id, SaveMemory::Changed).await.map(drop)
    }

    /// [`SandboxManager::pause`], saving guest RAM as `how` says; reports
    /// what was saved (`siesta bench pause` compares the two ways).
    pub async fn pause_with(self: &Arc<Self>, id: &str, how: SaveMemory) -> Result<SaveReport> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("pausing a sandbox", async move {
            this.pause_with_op(&id, how).await
        })
        .await
    }

    /// E2B's filesystem-only pause: the guest's file systems are synced and
    /// only its disk is kept; processes are not. The resume is a cold boot.
    pub async fn pause_disk_only(self: &Arc<Self>, id: &str) -> Result<()> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("pausing a sandbox", async move {
            this.pause_disk_only_op(&id).await
        })
        .await
    }

    /// Brings a paused sandbox back with its files and processes, with the
    /// default timeout.
    pub async fn resume(self: &Arc<Self>, id: &str) -> Result<SandboxInfo> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving(
            "resuming a sandbox",
            async move { this.resume_op(&id).await },
        )
        .await
    }

    /// E2B `connect`: resumes a paused sandbox with `timeout_secs` (default
    /// [`crate::manager::DEFAULT_TIMEOUT_SECS`]), or returns a running one,
    /// extending its deadline to `timeout_secs` from now if that is later.
    /// The flag says whether it was resumed.
    pub async fn connect(
        self: &Arc<Self>,
        id: &str,
        timeout_secs: Option<u64>,
    ) -> Result<(SandboxInfo, bool)> {
        self.connect_with(id, timeout_secs, false).await
    }

    /// [`SandboxManager::connect`]; with `reboot` (E2B's `memory: false`), a
    /// paused sandbox comes back from its disk alone, by a cold boot.
    pub async fn connect_with(
        self: &Arc<Self>,
        id: &str,
        timeout_secs: Option<u64>,
        reboot: bool,
    ) -> Result<(SandboxInfo, bool)> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("connecting to a sandbox", async move {
            this.connect_with_op(&id, timeout_secs, reboot).await
        })
        .await
    }

    /// Stops the sandbox and deletes everything it had.
    pub async fn kill(self: &Arc<Self>, id: &str) -> Result<()> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("killing a sandbox", async move { this.kill_op(&id).await })
            .await
    }

    /// Snapshots running sandbox `id` under an optional `name`.
    pub async fn snapshot(
        self: &Arc<Self>,
        id: &str,
        name: Option<String>,
    ) -> Result<SnapshotInfo> {
        self.snapshot_with(id, name, true).await
    }

    /// [`SandboxManager::snapshot`]; without `memory` (E2B's filesystem-only
    /// snapshot) the guest is synced and only its disk is kept, and
    /// sandboxes made from it cold-boot.
    pub async fn snapshot_with(
        self: &Arc<Self>,
        id: &str,
        name: Option<String>,
        memory: bool,
    ) -> Result<SnapshotInfo> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("snapshotting a sandbox", async move {
            this.snapshot_with_op(&id, name, memory).await
        })
        .await
    }

    /// `count` new sandboxes, each continuing where running sandbox `id`
    /// is now; the source runs on. One result per child, in order.
    pub async fn fork(
        self: &Arc<Self>,
        id: &str,
        count: u32,
        timeout_secs: Option<u64>,
    ) -> Result<Vec<Result<SandboxInfo>>> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("forking a sandbox", async move {
            this.fork_op(&id, count, timeout_secs).await
        })
        .await
    }

    /// Makes paused sandbox `row` (another node's, taken over) this node's
    /// from its pause `snapshot` in the object store.
    pub async fn adopt_paused(
        self: &Arc<Self>,
        row: SandboxRecord,
        snapshot: &str,
    ) -> Result<SandboxInfo> {
        let (this, snapshot) = (self.clone(), snapshot.to_string());
        self.outliving("taking a sandbox over", async move {
            this.adopt_paused_op(row, &snapshot).await
        })
        .await
    }

    /// Sets the deadline of sandbox `id` to `secs` seconds from now (E2B
    /// `set_timeout`).
    pub async fn set_timeout(self: &Arc<Self>, id: &str, secs: u64) -> Result<SandboxInfo> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("setting a sandbox's timeout", async move {
            this.set_timeout_op(&id, secs).await
        })
        .await
    }

    /// Replaces what the sandbox may reach (E2B's `update_network`).
    pub async fn set_egress(
        self: &Arc<Self>,
        id: &str,
        egress: EgressPolicy,
    ) -> Result<SandboxInfo> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("changing a sandbox's network rules", async move {
            this.set_egress_op(&id, egress).await
        })
        .await
    }

    /// E2B's refresh: keeps a running sandbox alive at least `secs` more
    /// seconds.
    pub async fn refresh(self: &Arc<Self>, id: &str, secs: u64) -> Result<SandboxInfo> {
        let (this, id) = (self.clone(), id.to_string());
        self.outliving("refreshing a sandbox", async move {
            this.refresh_op(&id, secs).await
        })
        .await
    }
}
