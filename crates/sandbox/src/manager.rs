//! The sandbox manager: create, list, exec, pause, resume, kill, timeouts.
//!
//! Every sandbox has a row in the node's SQLite store ([`crate::store`]);
//! every state change is written there before the call returns, after the
//! files it depends on (a pause publishes its snapshot in the repository,
//! see [`crate::paused`], then commits the row).
//! In memory the manager keeps one entry per sandbox: the record mirrored
//! from the store, a lock serialising operations on it, and, only while it
//! runs, its VM and network slot. A background reaper ([`crate::lifecycle`])
//! pauses or kills sandboxes whose deadline passed and marks those whose VMM
//! died. [`SandboxManager::open`] recovers the state a previous server left
//! ([`crate::recovery`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::Utc;
use siesta_net::EgressPolicy;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::builder::ManagerBuilder;
use crate::error::{Error, IoContext, Result};
use crate::lifecycle::{deadline, Reaper};
use crate::memory_save::{SaveMemory, SaveReport};
use crate::node::Node;
use crate::paused::PauseMode;
use crate::pool::VmmPool;
use crate::resume::{self, ResumeParams, Resumed};
use crate::running::{finish_stopping, running, set_running, stop_running};
use crate::sandbox::{
    qcow2_virtual_size, Lifecycle, Sandbox, SandboxInfo, SandboxRecord, SandboxState, DISK_FILE,
};
use crate::store;
use crate::store::{ListQuery, Store, StoreError};
use siesta_envd_client::{EnvdClient, ExecOutput, InitParams};
use siesta_template::Template;

pub use crate::lifecycle::{DEFAULT_TIMEOUT_SECS, MAX_TIMEOUT_SECS};

/// What `create` needs.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub template: String,
    pub env_vars: HashMap<String, String>,
    pub metadata: HashMap<String, String>,
    /// What it may reach (E2B's `allow_internet_access` and `network`).
    /// `None`: not given, so the default (the internet) for a template,
    /// and the source's rules for a user snapshot.
    pub egress: Option<EgressPolicy>,
    /// Its ports through the front door need a traffic access token (E2B's
    /// `allowPublicTraffic: false`); it gets its own.
    pub private_traffic: bool,
    /// Seconds until the sandbox times out; [`DEFAULT_TIMEOUT_SECS`] if
    /// `None`, at most [`MAX_TIMEOUT_SECS`].
    pub timeout_secs: Option<u64>,
    /// What its timeout does (pause by default) and whether traffic to it
    /// while paused resumes it.
    pub lifecycle: Lifecycle,
    /// Volumes to mount (checked with [`crate::volumes::check_mounts`]).
    pub volume_mounts: Vec<crate::volumes::VolumeMount>,
}

pub(crate) type Entry = Arc<Mutex<Sandbox>>;

/// How long a clean stop waits for operations in flight.
const SHUTDOWN_OPERATIONS_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Where a create resumes from.
enum Source {
    Template(Box<Template>),
    Snapshot(siesta_snapshot::SnapshotRecord),
}

pub struct SandboxManager {
    pub(crate) node: Arc<Node>,
    pub(crate) pool: Arc<VmmPool>,
    pub(crate) store: Arc<Store>,
    pub(crate) sandboxes: Mutex<HashMap<String, Entry>>,
    /// False for [`SandboxManager::ephemeral`]: nothing outlives it, so
    /// shutdown kills instead of pausing.
    persistent: bool,
    /// Set by shutdown: no new VM starts afterwards.
    closed: AtomicBool,
    pub(crate) reaper: Reaper,
    /// Creates with one idempotency key run one at a time, so two retries
    /// of one request never both create (other keys do not wait).
    pub(crate) keyed_creates: siesta_host::key_locks::KeyLocks,
    /// Run at every step of this manager's publications (tests only).
    #[cfg(feature = "test-hooks")]
    publish_hook: Option<siesta_snapshot::repo::PublishHook>,
    /// The shared object store, where templates and snapshots this node
    /// lacks are fetched from (none configured: only local ones exist).
    remote: Option<Arc<siesta_tier::RemoteTier>>,
    /// Exclusive lock on the data directory (`siesta.lock`), held for the
    /// manager's life: two managers on one home would each "recover" the
    /// other's live sandboxes.
    _home_lock: Option<std::fs::File>,
    /// The node's volumes, which sandboxes may mount (none: mounts refused).
    pub(crate) volumes: Option<Arc<siesta_volume::Volumes>>,
    /// Background transfers to and from the object store (shared pauses
    /// and snapshots, deleted copies): a clean stop waits for them
    /// ([`SandboxManager::wait_transfers`]).
    pub(crate) transfers: tokio_util::task::TaskTracker,
    /// The state-changing operations in flight, each a task of its own so
    /// that a caller who goes away cannot cut one short ([`crate::operation`]).
    pub(crate) operations: tokio_util::task::TaskTracker,
}

/// What a manager starts with ([`crate::builder::ManagerBuilder`]).
pub(crate) struct Parts {
    pub node: Arc<Node>,
    pub store: Store,
    /// The rows recovered from the store.
    pub records: Vec<SandboxRecord>,
    pub persistent: bool,
    pub home_lock: Option<std::fs::File>,
    pub volumes: Option<Arc<siesta_volume::Volumes>>,
    pub remote: Option<Arc<siesta_tier::RemoteTier>>,
    #[cfg(feature = "test-hooks")]
    pub publish_hook: Option<siesta_snapshot::repo::PublishHook>,
}

impl SandboxManager {
    /// A manager for `node`, given what it holds for its life, then opened
    /// on the node's home ([`ManagerBuilder::open`]) or kept in memory
    /// ([`ManagerBuilder::ephemeral`]).
    pub fn builder(node: Arc<Node>) -> ManagerBuilder {
        ManagerBuilder::new(node)
    }

    /// `SandboxManager::builder(node).open()`: the node's sandboxes, with
    /// no volumes and no object store.
    pub fn open(node: Arc<Node>) -> Result<Arc<Self>> {
        Self::builder(node).open()
    }

    /// `SandboxManager::builder(node).ephemeral()`.
    pub fn ephemeral(node: Arc<Node>) -> Result<Arc<Self>> {
        Self::builder(node).ephemeral()
    }

    pub(crate) fn start(parts: Parts) -> Arc<Self> {
        let Parts {
            node,
            store,
            records,
            persistent,
            home_lock,
            volumes,
            remote,
            #[cfg(feature = "test-hooks")]
            publish_hook,
        } = parts;
        let layout = node.config.layout();
        let entries = records
            .into_iter()
            .map(|record| {
                let sb = Sandbox {
                    dir: layout.sandbox_dir(&record.id),
                    record,
                    running: None,
                    stopping: None,
                };
                (sb.record.id.clone(), Arc::new(Mutex::new(sb)))
            })
            .collect();
        let manager = Arc::new(Self {
            pool: VmmPool::new(Arc::clone(&node)),
            node,
            store: Arc::new(store),
            sandboxes: Mutex::new(entries),
            persistent,
            closed: AtomicBool::new(false),
            reaper: Reaper::default(),
            keyed_creates: siesta_host::key_locks::KeyLocks::default(),
            #[cfg(feature = "test-hooks")]
            publish_hook,
            remote,
            _home_lock: home_lock,
            volumes,
            transfers: tokio_util::task::TaskTracker::new(),
            operations: tokio_util::task::TaskTracker::new(),
        });
        manager.reaper.start(Arc::downgrade(&manager));
        manager
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Whether this is the server's manager (its sandboxes outlive it)
    /// rather than an ephemeral one (a bench's).
    pub(crate) fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// Pre-spawns pooled VMMs for `template` so the first create is a hit.
    pub fn warm(&self, template: &str) -> Result<()> {
        let t = Template::open(&self.node.config.layout(), template)?;
        self.pool.refill(t);
        Ok(())
    }

    /// Waits until a pre-spawned VMM for `template` is ready.
    pub async fn wait_pool_ready(
        &self,
        template: &str,
        timeout: std::time::Duration,
    ) -> Result<()> {
        self.pool.wait_ready(template, timeout).await
    }

    /// Waits until the pool holds as many VMMs for `template` as it keeps.
    pub async fn wait_pool_full(&self, template: &str, timeout: std::time::Duration) -> Result<()> {
        self.pool.wait_full(template, timeout).await
    }

    /// Resumes a new sandbox from a template, or from a user snapshot when
    /// `req.template` names one (see `snapshots.rs`).
    pub(crate) async fn create_op(&self, req: CreateRequest) -> Result<SandboxInfo> {
        self.check_open()?;
        let timeout = deadline(req.timeout_secs)?;
        let template = match self.source(&req.template).await? {
            Source::Template(t) => *t,
            Source::Snapshot(snap) => return Box::pin(self.create_from_snapshot(&snap, req)).await,
        };
        crate::volumes::check_mounts(&req.volume_mounts)?;
        self.node.check_template(&template).await?;
        let record = new_record(&req, &template, timeout);
        let params = self.resume_params(&record);
        let resumed = resume::from_template(&self.node, &self.pool, &template, &params).await?;
        self.adopt(record, resumed, timeout).await
    }

    /// What a create's `template` names: a local template, else a local
    /// user snapshot, else (with an object store) either of them fetched
    /// from the store (see `siesta_tier`).
    async fn source(&self, name: &str) -> Result<Source> {
        for fetched in [false, true] {
            match Template::open(&self.node.config.layout(), name) {
                Ok(t) => {
                    if let Some((id, _)) = t.shared_memory() {
                        self.used_fetched(&id);
                    }
                    return Ok(Source::Template(Box::new(t)));
                }
                Err(siesta_template::Error::TemplateNotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if let Some(snap) = self.find_snapshot(name)? {
                self.used_fetched(&snap.id);
                return Ok(Source::Snapshot(snap));
            }
            let Some(remote) = self.remote.as_ref().filter(|_| !fetched) else {
                break;
            };
            if let Some(t) = remote.serve_template(&self.repo()?, name).await? {
                self.trust_when_imported(&t);
                self.prune_fetched_later().await;
                return Ok(Source::Template(Box::new(t)));
            }
            if remote.fetch(&self.repo()?, name).await?.is_none() {
                break;
            }
            self.prune_fetched_later().await;
        }
        Err(Error::TemplateNotFound {
            name: name.to_string(),
        })
    }

    /// The object-store tier, if one is configured.
    pub fn remote(&self) -> Option<&Arc<siesta_tier::RemoteTier>> {
        self.remote.as_ref()
    }

    /// Records a freshly resumed sandbox and starts tracking it.
    pub(crate) async fn adopt(
        &self,
        mut record: SandboxRecord,
        resumed: Resumed,
        timeout: chrono::Duration,
    ) -> Result<SandboxInfo> {
        record.id = resumed.id.clone();
        let dir = resumed.dir.clone();
        // What the guest sees as its disk: the overlay's virtual size.
        if let Ok(bytes) = qcow2_virtual_size(&dir.join(DISK_FILE)) {
            record.disk_size_mb = bytes >> 20;
        }
        let mut sandbox = Sandbox {
            dir: dir.clone(),
            record,
            running: None,
            stopping: None,
        };
        set_running(&mut sandbox, running(resumed), timeout);
        if let Err(e) = self.save_record(&sandbox.record).await {
            stop_running(&self.node, &mut sandbox).await;
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let info = sandbox.info();
        self.sandboxes
            .lock()
            .await
            .insert(info.id.clone(), Arc::new(Mutex::new(sandbox)));
        Ok(info)
    }

    /// Every sandbox (running, paused and dead), oldest first, as last
    /// committed: it never waits for a sandbox busy pausing or resuming.
    pub async fn list(&self) -> Vec<SandboxInfo> {
        let all = store::db(&self.store, "listing sandboxes", |s| s.all()).await;
        all.unwrap_or_else(|e| {
            tracing::error!("listing sandboxes: {e}");
            Vec::new()
        })
    }

    /// `(id, access token)` of every sandbox that is not dead, from memory
    /// (no table read): what a signed URL that names no sandbox is checked
    /// against.
    pub fn live_access_tokens(&self) -> Vec<(String, String)> {
        self.store.live_tokens()
    }

    /// Reports every committed row change (and first every row there is)
    /// to `observer`: the cluster directory's way in. Only the first call
    /// takes effect. The one thing not given through the builder: the
    /// cluster's directory is made from the opened manager (it reconciles
    /// against its rows), so it can only be attached afterwards.
    pub fn set_row_observer(&self, observer: Arc<dyn crate::store::RowObserver>) -> Result<()> {
        self.store.set_observer(observer)?;
        Ok(())
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn publish_hook(&self) -> Option<siesta_snapshot::repo::PublishHook> {
        self.publish_hook.clone()
    }

    /// How many sandboxes are in each state (for the metrics' gauges).
    pub async fn count_by_state(&self) -> Result<Vec<(SandboxState, u64)>> {
        store::db(&self.store, "counting sandboxes", |s| {
            [
                SandboxState::Running,
                SandboxState::Paused,
                SandboxState::Dead,
            ]
            .into_iter()
            .map(|state| Ok((state, s.count(state)?)))
            .collect()
        })
        .await
    }

    /// Commits `record` to the state database (off the async threads).
    pub(crate) async fn save_record(&self, record: &SandboxRecord) -> Result<()> {
        let record = record.clone();
        store::db(&self.store, "saving a sandbox's record", move |s| {
            s.put(&record)
        })
        .await
    }

    /// One page of the sandboxes matching `q`, and the token of the next
    /// page (`None` on the last). Read from the store, so a page never
    /// waits for a sandbox busy pausing or resuming. A malformed
    /// `next_token` is [`Error::Invalid`].
    pub async fn list_page(&self, q: &ListQuery) -> Result<(Vec<SandboxInfo>, Option<String>)> {
        let q = q.clone();
        store::db(&self.store, "listing sandboxes", move |s| s.list(&q))
            .await
            .map_err(|e| match e {
                Error::Store(StoreError::BadCursor(_)) => Error::Invalid(e.to_string()),
                e => e,
            })
    }

    pub(crate) async fn get_entry(&self, id: &str) -> Result<Entry> {
        self.sandboxes
            .lock()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| Error::SandboxNotFound { id: id.to_string() })
    }

    /// Locks sandbox `id` for an operation; not found if it was killed
    /// while the caller waited.
    pub(crate) async fn lock(&self, id: &str) -> Result<OwnedMutexGuard<Sandbox>> {
        let sb = self.get_entry(id).await?.lock_owned().await;
        if sb.record.id.is_empty() {
            return Err(Error::SandboxNotFound { id: id.to_string() });
        }
        Ok(sb)
    }

    /// Sandbox `id` as last committed (a pause or resume in progress shows
    /// the state before it; this never waits for one). Read on a blocking
    /// thread: the proxy asks on every request, and the store's connection
    /// may be held through a commit's fsync.
    pub async fn get(&self, id: &str) -> Result<SandboxInfo> {
        let owned = id.to_string();
        store::db(&self.store, "reading a sandbox's row", move |s| {
            s.get(&owned)
        })
        .await?
        .ok_or_else(|| Error::SandboxNotFound { id: id.to_string() })
    }

    /// A client for the agent of running sandbox `id`.
    pub async fn envd(&self, id: &str) -> Result<EnvdClient> {
        let entry = self.get_entry(id).await?;
        let sb = entry.lock().await;
        let running = sb
            .running
            .as_ref()
            .ok_or_else(|| wrong_state(&sb, "running"))?;
        Ok(EnvdClient::new(
            id,
            running.agent_addr,
            Some(sb.record.access_token.clone()),
        ))
    }

    /// Runs `cmd` in sandbox `id` as `user` and waits for it.
    pub async fn exec(
        &self,
        id: &str,
        cmd: &str,
        user: Option<&str>,
        on_output: impl FnMut(bool, &[u8]),
    ) -> Result<ExecOutput> {
        Ok(self.envd(id).await?.exec(cmd, user, on_output).await?)
    }

    /// Sets the deadline of sandbox `id` to `secs` seconds from now (E2B
    /// `set_timeout`). On a paused sandbox this only changes the deadline
    /// it reports: a resume sets a new one.
    pub(crate) async fn set_timeout_op(&self, id: &str, secs: u64) -> Result<SandboxInfo> {
        let timeout = deadline(Some(secs))?;
        let mut sb = self.lock(id).await?;
        if sb.record.state == SandboxState::Dead {
            return Err(wrong_state(&sb, "running or paused"));
        }
        let before = sb.record.end_at;
        sb.record.end_at = Utc::now() + timeout;
        if let Err(e) = self.save_record(&sb.record).await {
            sb.record.end_at = before;
            return Err(e);
        }
        Ok(sb.info())
    }

    /// Replaces what the sandbox may reach (E2B's `update_network`): in its
    /// slot at once when it runs, and in its record, which a resume, a fork
    /// or a snapshot's sandboxes take it from.
    pub(crate) async fn set_egress_op(
        &self,
        id: &str,
        egress: EgressPolicy,
    ) -> Result<SandboxInfo> {
        let mut sb = self.lock(id).await?;
        if sb.record.state == SandboxState::Dead {
            return Err(wrong_state(&sb, "running or paused"));
        }
        let before = std::mem::replace(&mut sb.record.egress, egress);
        if let Err(e) = self.save_record(&sb.record).await {
            sb.record.egress = before;
            return Err(e);
        }
        if let Some(run) = &sb.running {
            if let Err(source) = run.slot.apply_policy(&sb.record.egress).await {
                // The slot's rules are unknown now: keep the record as it
                // was and let the caller retry.
                sb.record.egress = before;
                let _ = self.save_record(&sb.record).await;
                let id = id.to_string();
                return Err(Error::Net { id, source });
            }
        }
        Ok(sb.info())
    }

    /// [`SandboxManager::pause`], saving guest RAM as `how` says; reports
    /// what was saved (`siesta bench pause` compares the two ways).
    pub(crate) async fn pause_with_op(&self, id: &str, how: SaveMemory) -> Result<SaveReport> {
        let mut sb = self.lock(id).await?;
        self.pause_locked(&mut sb, PauseMode::Memory(how))
            .await?
            .ok_or_else(|| Error::Internal {
                what: format!("pausing {id}"),
                detail: "the pause saved no memory".into(),
            })
    }

    /// E2B's filesystem-only pause: the guest's file systems are synced and
    /// only its disk is kept; processes are not. The resume is a cold boot.
    pub(crate) async fn pause_disk_only_op(&self, id: &str) -> Result<()> {
        let mut sb = self.lock(id).await?;
        self.pause_locked(&mut sb, PauseMode::DiskOnly)
            .await
            .map(drop)
    }

    /// Brings a paused sandbox back with its files and processes, with the
    /// default timeout.
    pub(crate) async fn resume_op(&self, id: &str) -> Result<SandboxInfo> {
        let mut sb = self.lock(id).await?;
        if sb.record.state != SandboxState::Paused {
            return Err(wrong_state(&sb, "paused"));
        }
        self.resume_locked(&mut sb, None, false).await?;
        Ok(sb.info())
    }

    /// [`SandboxManager::connect`]; with `reboot` (E2B's `memory: false`), a
    /// paused sandbox comes back from its disk alone, by a cold boot.
    pub(crate) async fn connect_with_op(
        &self,
        id: &str,
        timeout_secs: Option<u64>,
        reboot: bool,
    ) -> Result<(SandboxInfo, bool)> {
        let mut sb = self.lock(id).await?;
        match sb.record.state {
            SandboxState::Running => {
                if let Some(secs) = timeout_secs {
                    let end = Utc::now() + deadline(Some(secs))?;
                    if end > sb.record.end_at {
                        sb.record.end_at = end;
                        self.save_record(&sb.record).await?;
                    }
                }
                Ok((sb.info(), false))
            }
            SandboxState::Paused => {
                self.resume_locked(&mut sb, timeout_secs, reboot).await?;
                Ok((sb.info(), true))
            }
            SandboxState::Dead => Err(wrong_state(&sb, "running or paused")),
        }
    }

    /// Stops the sandbox and deletes everything it had.
    pub(crate) async fn kill_op(&self, id: &str) -> Result<()> {
        let mut sb = self.lock(id).await?;
        self.kill_locked(&mut sb).await
    }

    pub(crate) async fn kill_locked(&self, sb: &mut Sandbox) -> Result<()> {
        let id = sb.record.id.clone();
        stop_running(&self.node, sb).await;
        let row = id.clone();
        let deleted = store::db(&self.store, "deleting a sandbox's record", move |s| {
            s.delete(&row)
        });
        if let Err(e) = deleted.await {
            sb.record.state = SandboxState::Dead;
            sb.record.dead_reason = Some(format!("kill failed to delete its row: {e}"));
            return Err(e);
        }
        self.sandboxes.lock().await.remove(&id);
        // Only now, with the row gone: whoever streamed from it and asks
        // after it learns it is gone instead of finding it "running".
        self.node.announce_stopped(&id);
        // Operations queued on this sandbox's lock see it gone.
        sb.record.id.clear();
        self.delete_pause(&id).await;
        match std::fs::remove_dir_all(&sb.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).ctx("removing sandbox directory", &sb.dir)
            }
            _ => Ok(()),
        }
    }

    /// Stops the VM of a sandbox that cannot run on and records why; its
    /// disk stays until it is killed.
    pub(crate) async fn mark_dead(&self, sb: &mut Sandbox, reason: String) {
        tracing::warn!(sandbox = %sb.record.id, "sandbox dead: {reason}");
        stop_running(&self.node, sb).await;
        sb.record.state = SandboxState::Dead;
        sb.record.dead_reason = Some(reason);
        sb.record.agent_addr = None;
        sb.record.vmm_pid = None;
        if let Err(e) = self.save_record(&sb.record).await {
            tracing::error!(sandbox = %sb.record.id, "recording death: {e}");
        }
        self.node.announce_stopped(&sb.record.id);
    }

    /// Server stop: pauses every running sandbox (an ephemeral manager kills
    /// them instead) and stops the pooled VMMs. A sandbox that cannot be
    /// paused is stopped and reported dead, never left half-running.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.reaper.stop().await;
        // Operations already under way finish first (a create that started
        // would otherwise add a sandbox this stop never sees).
        if !self.wait_operations(SHUTDOWN_OPERATIONS_WAIT).await {
            tracing::warn!(
                "operations still running {SHUTDOWN_OPERATIONS_WAIT:?} into the stop: going on without them"
            );
        }
        let entries: Vec<Entry> = self.sandboxes.lock().await.values().cloned().collect();
        let stops = entries.into_iter().map(|entry| async move {
            let mut sb = entry.lock_owned().await;
            finish_stopping(&mut sb).await;
            if self.persistent && sb.running.is_some() {
                // Memory kept whatever the lifecycle says: a restart must
                // not cost a sandbox its processes.
                let keep = PauseMode::Memory(SaveMemory::Changed);
                if let Err(e) = self.pause_locked(&mut sb, keep).await {
                    let reason = format!("could not be paused at server stop: {e}");
                    self.mark_dead(&mut sb, reason).await;
                }
            } else if !self.persistent && !sb.record.id.is_empty() {
                if let Err(e) = self.kill_locked(&mut sb).await {
                    tracing::warn!(sandbox = %sb.record.id, "kill at shutdown: {e}");
                }
            }
        });
        futures::future::join_all(stops).await;
        self.pool.drain().await;
        if let Some(lazy) = self.remote().and_then(|r| r.lazy()) {
            lazy.detach();
        }
    }

    /// Test hook: forgets every running VM and slot without stopping them,
    /// as a `kill -9` of the server would leave them. Drop the manager next.
    #[cfg(feature = "test-hooks")]
    pub async fn abandon_for_tests(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.reaper.stop().await;
        for entry in self.sandboxes.lock().await.values() {
            let mut sb = entry.lock().await;
            // Pauses that returned count as done, VMM exit included.
            finish_stopping(&mut sb).await;
            if let Some(r) = sb.running.take() {
                std::mem::forget(r);
            }
        }
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }
}

/// The record of a sandbox about to be resumed from `template` (its id
/// comes with the resumed VM).
pub(crate) fn new_record(
    req: &CreateRequest,
    template: &Template,
    timeout: chrono::Duration,
) -> SandboxRecord {
    let now = Utc::now();
    SandboxRecord {
        id: String::new(),
        template: template.record.name.clone(),
        state: SandboxState::Running,
        created_at: now,
        started_at: now,
        end_at: now + timeout,
        access_token: crate::ids::new_token(),
        traffic_token: req.private_traffic.then(crate::ids::new_token),
        env_vars: template_env(template, &req.env_vars),
        metadata: req.metadata.clone(),
        egress: req.egress.clone().unwrap_or_default(),
        cpu_count: template.record.vcpus,
        memory_mb: template.record.memory_mib,
        disk_size_mb: template.record.disk.size >> 20,
        lifecycle: req.lifecycle,
        agent_addr: None,
        vmm_pid: None,
        timings: None,
        dead_reason: None,
        guest_defaults: template.record.defaults.guest.clone(),
        volume_mounts: req.volume_mounts.clone(),
        paused_disk_only: false,
    }
}

/// The template's ENV, overridden by what the create request sets.
fn template_env(template: &Template, request: &HashMap<String, String>) -> HashMap<String, String> {
    let mut env: HashMap<String, String> =
        template.record.defaults.env.clone().into_iter().collect();
    env.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

impl SandboxManager {
    /// What resuming the sandbox of `record` needs: its `/init`, token,
    /// egress policy and volume mounts.
    pub(crate) fn resume_params(&self, record: &SandboxRecord) -> ResumeParams {
        let mut init = InitParams::new(
            Some(record.access_token.clone()),
            record.env_vars.clone(),
            &record.guest_defaults,
        );
        init.siesta_mounts = crate::volumes::guest_mounts(&record.volume_mounts);
        ResumeParams {
            init,
            // A template's guest holds no token (any is accepted); a paused
            // sandbox's holds its own.
            guest_token: Some(record.access_token.clone()),
            egress: record.egress.clone(),
            mounts: record.volume_mounts.clone(),
            volumes: self.volumes.clone(),
        }
    }
}

pub(crate) fn wrong_state(sb: &Sandbox, expected: &'static str) -> Error {
    Error::WrongState {
        id: sb.record.id.clone(),
        state: sb.record.state.to_string(),
        expected,
    }
}
