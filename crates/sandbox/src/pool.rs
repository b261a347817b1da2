//! The warm VMM pool: per template, VMM processes spawned ahead of time and
//! waiting for an incoming snapshot, each already in its own network slot
//! and holding a fresh copy-on-write disk. Taking one is the resume path's
//! `vmm_pool_acquire` stage; spawning happens off the critical path.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use siesta_net::Slot;
use siesta_vmm::VmInstance;
use tokio::sync::Mutex;

use crate::error::{Error, IoContext, Result};
use crate::node::Node;
use siesta_host::disk::create_overlay;
use siesta_template::{incoming_spec, Template};

/// A VMM process waiting in `-incoming` for a template's snapshot.
///
/// It is created as a future sandbox: the id is chosen and the disk overlay
/// made in that sandbox's directory up front, because QEMU reopens its disk
/// by path when the restored VM starts, so the file cannot move afterwards.
pub struct PooledVm {
    pub id: String,
    pub dir: PathBuf,
    pub vm: Box<dyn VmInstance>,
    pub slot: Slot,
    /// The disk overlay the VMM has open (`<dir>/disk.qcow2`).
    pub overlay: PathBuf,
    pub run_dir: PathBuf,
    /// Which build of the template it maps ([`build_key`]): a template
    /// rebuilt under the same name must not resume into a VMM that maps
    /// the previous build's memory.
    pub build: String,
}

/// Identifies one build of a template: its snapshot id (or, for a legacy
/// directory template, its creation time).
fn build_key(template: &Template) -> String {
    match &template.snapshot {
        Some(snap) => snap.id.clone(),
        None => template.record.created_at.to_rfc3339(),
    }
}

/// How a pool prepares the VMMs it hands out: each is work taken off the
/// resume path (`siesta bench resume --compare pool|prealloc|policy-skip`
/// measures what each saves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// VMMs kept waiting per template (slot, overlay, process, device
    /// configuration); 0 spawns each on demand, on the resume path.
    pub size: usize,
    /// Populate guest memory when a VMM is spawned (see
    /// [`siesta_vmm::MemoryBacking::prealloc`]).
    pub prealloc_memory: bool,
    /// Keep a slot's egress policy across tenants and skip re-applying it
    /// when unchanged.
    pub policy_skip: bool,
    /// Spawn the replacement of a VMM taken from the pool only when the
    /// resume that took it is done (see [`Refill`]), not alongside it.
    pub refill_after_ready: bool,
    /// With `refill_after_ready`, also wait until no other resume is in
    /// flight (at most [`REFILL_QUIET_WAIT`]).
    pub refill_when_quiet: bool,
}

impl PoolOptions {
    /// The options of `host`: its configuration's size and memory
    /// population, its tuning's policy skip and refill timing.
    pub fn of_host(host: &siesta_host::Host) -> Self {
        Self {
            size: host.config.pool_size,
            prealloc_memory: host.config.prealloc_memory,
            policy_skip: host.tuning.policy_skip,
            refill_after_ready: host.tuning.refill_after_ready,
            refill_when_quiet: host.tuning.refill_when_quiet,
        }
    }
}

/// The refill owed to a template's pool after a VMM was taken from it: a
/// resume holds it until its guest is ready (or the resume failed), and
/// dropping it tops the pool up in the background, by default once no
/// resume is in flight ([`PoolOptions::refill_when_quiet`]).
/// Spawning the replacement alongside a resume would take CPU from it: on
/// this project's 2-core TCG hosts a QEMU start is ~80 ms of CPU
/// (`siesta bench resume --compare refill`), and the children of a fork
/// resume together (`siesta bench fork --compare refill`). With
/// [`PoolOptions::refill_after_ready`] off the refill starts at once.
#[must_use = "the pool is refilled when this is dropped"]
pub struct Refill {
    owed: Option<(Arc<VmmPool>, Template)>,
}

impl Refill {
    fn new(pool: &Arc<VmmPool>, template: &Template) -> Self {
        if !pool.options.refill_after_ready {
            pool.refill(template.clone());
            return Self { owed: None };
        }
        Self {
            owed: Some((Arc::clone(pool), template.clone())),
        }
    }
}

/// The longest a refill waits for the resumes in flight to end: under
/// steady load there is always one, and a pool never refilled would have
/// every resume spawn its VMM on its own path.
pub const REFILL_QUIET_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A resume in flight on a pool's node, counted while this lives (see
/// [`VmmPool::resuming`]).
pub struct Resuming {
    count: tokio::sync::watch::Sender<usize>,
}

impl Drop for Resuming {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Drop for Refill {
    fn drop(&mut self) {
        // Outside a runtime (a panic unwinding past it) nothing can be
        // spawned; the next acquire refills instead.
        if let Some((pool, template)) = self.owed.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                pool.refill(template);
            }
        }
    }
}

pub struct VmmPool {
    node: Arc<Node>,
    options: PoolOptions,
    ready: Mutex<HashMap<String, Vec<PooledVm>>>,
    /// Set by `drain`: refills still running stop their VMMs instead of
    /// adding them.
    closed: std::sync::atomic::AtomicBool,
    /// Refill tasks, awaited by `drain` so none outlives the pool.
    refills: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Resumes in flight, which refills wait out.
    resuming: tokio::sync::watch::Sender<usize>,
}

impl VmmPool {
    /// A pool configured by the node's configuration.
    pub fn new(node: Arc<Node>) -> Arc<Self> {
        let options = PoolOptions::of_host(&node);
        Self::with_options(node, options)
    }

    pub fn with_options(node: Arc<Node>, options: PoolOptions) -> Arc<Self> {
        Arc::new(Self {
            node,
            options,
            ready: Mutex::new(HashMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
            refills: std::sync::Mutex::new(Vec::new()),
            resuming: tokio::sync::watch::channel(0).0,
        })
    }

    pub fn options(&self) -> PoolOptions {
        self.options
    }

    /// Takes a waiting VMM for `template`, or spawns one when none waits
    /// (reported as a miss). The pool is topped up in the background when
    /// the returned [`Refill`] is dropped.
    pub async fn acquire(
        self: &Arc<Self>,
        template: &Template,
    ) -> Result<(PooledVm, bool, Refill)> {
        // A create resumes the template's current build: VMMs of earlier
        // builds will never be asked for again.
        for entry in self.take_stale(template).await {
            self.discard(entry).await;
        }
        if let Some((entry, refill)) = self.take_waiting(template).await {
            return Ok((entry, true, refill));
        }
        let entry = self.spawn(template).await?;
        if !self.options.policy_skip {
            entry.slot.forget_policy().await;
        }
        Ok((entry, false, Refill::new(self, template)))
    }

    /// Takes a VMM already waiting for `template`'s build, if one is; never
    /// spawns, and leaves the VMMs of other builds alone (a paused sandbox
    /// may run on a build its template's name no longer points to). A
    /// paused sandbox of the template resumes into it after handing it its
    /// own disk ([`siesta_vmm::VmInstance::replace_disk`]). The pool is
    /// topped up when the returned [`Refill`] is dropped.
    pub async fn take_waiting(self: &Arc<Self>, template: &Template) -> Option<(PooledVm, Refill)> {
        let build = build_key(template);
        let entry = self
            .take_live_where(&template.record.name, |e| e.build == build)
            .await?;
        if !self.options.policy_skip {
            entry.slot.forget_policy().await;
        }
        Some((entry, Refill::new(self, template)))
    }

    /// A waiting VMM of template `name` that `wanted` accepts and that is
    /// still alive: one that died while it waited (killed from outside,
    /// out of memory) is discarded, never handed to a resume that would
    /// then blame the snapshot.
    async fn take_live_where(
        &self,
        name: &str,
        wanted: impl Fn(&PooledVm) -> bool,
    ) -> Option<PooledVm> {
        loop {
            let mut entry = {
                let mut ready = self.ready.lock().await;
                let waiting = ready.get_mut(name)?;
                let i = waiting.iter().rposition(&wanted)?;
                waiting.remove(i)
            };
            match entry.vm.try_exit_status() {
                None => return Some(entry),
                Some(status) => {
                    tracing::warn!(template = name, vm = %entry.id, %status,
                        "a pooled VMM had exited while it waited; discarded");
                    self.discard(entry).await;
                }
            }
        }
    }

    /// Removes the VMMs waiting for an earlier build of `template`.
    async fn take_stale(&self, template: &Template) -> Vec<PooledVm> {
        let current = build_key(template);
        let mut ready = self.ready.lock().await;
        let Some(waiting) = ready.get_mut(&template.record.name) else {
            return Vec::new();
        };
        let (keep, stale) = std::mem::take(waiting)
            .into_iter()
            .partition(|e| e.build == current);
        *waiting = keep;
        stale
    }

    /// Counts a resume as in flight until the returned guard is dropped:
    /// refills after ready wait until none is.
    pub fn resuming(&self) -> Resuming {
        self.resuming.send_modify(|n| *n += 1);
        Resuming {
            count: self.resuming.clone(),
        }
    }

    /// Until no resume is in flight, the pool is drained, or
    /// [`REFILL_QUIET_WAIT`] passed.
    async fn quiet(&self) {
        let mut count = self.resuming.subscribe();
        let closed = || self.closed.load(std::sync::atomic::Ordering::SeqCst);
        let _ =
            tokio::time::timeout(REFILL_QUIET_WAIT, count.wait_for(|n| *n == 0 || closed())).await;
    }

    /// Tops the pool for `template` up to its size, in the background.
    pub fn refill(self: &Arc<Self>, template: Template) {
        if self.options.size == 0 || self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let pool = Arc::clone(self);
        let task = tokio::spawn(async move {
            loop {
                if pool.options.refill_after_ready && pool.options.refill_when_quiet {
                    pool.quiet().await;
                }
                if pool.closed.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let have = pool
                    .ready
                    .lock()
                    .await
                    .get(&template.record.name)
                    .map_or(0, Vec::len);
                if have >= pool.options.size {
                    return;
                }
                match pool.spawn(&template).await {
                    Ok(entry) => {
                        let mut ready = pool.ready.lock().await;
                        if pool.closed.load(std::sync::atomic::Ordering::SeqCst) {
                            drop(ready);
                            pool.discard(entry).await;
                            return;
                        }
                        ready
                            .entry(template.record.name.clone())
                            .or_default()
                            .push(entry);
                    }
                    Err(e) => {
                        tracing::warn!(template = %template.record.name, "pool refill: {e}");
                        return;
                    }
                }
            }
        });
        if let Ok(mut tasks) = self.refills.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
    }

    /// Spawns one VMM for `template`: slot, overlay, process in `-incoming`.
    async fn spawn(&self, template: &Template) -> Result<PooledVm> {
        let id = crate::ids::new_sandbox_id();
        let dir = self.node.config.layout().sandbox_dir(&id);
        let run_dir = dir.join("run");
        std::fs::create_dir_all(&run_dir).ctx("creating sandbox directory", &run_dir)?;
        let overlay = dir.join(crate::sandbox::DISK_FILE);
        if let Err(e) = create_overlay(&template.disk_path(), &overlay).await {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
        let slot = match self.node.acquire_slot(&id).await {
            Ok(slot) => slot,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        let mut spec = incoming_spec(
            &self.node,
            template,
            &id,
            run_dir.clone(),
            overlay.clone(),
            &slot,
        );
        spec.memory.prealloc = self.options.prealloc_memory;
        match self.node.vmm.spawn(&spec).await {
            Ok(vm) => Ok(PooledVm {
                id,
                dir,
                vm,
                slot,
                overlay,
                run_dir,
                build: build_key(template),
            }),
            Err(source) => {
                self.node.release_slot(slot).await;
                let _ = std::fs::remove_dir_all(&dir);
                Err(Error::vmm(id, source))
            }
        }
    }

    /// How many VMMs wait for `template` now (each holds a network slot a
    /// resume of that template takes over).
    pub async fn waiting(&self, template: &str) -> usize {
        self.ready.lock().await.get(template).map_or(0, Vec::len)
    }

    /// Waits until at least one VMM waits for `template` (benchmarks use it
    /// so that every sample is a pool hit, as in the seed's warm-pool runs).
    pub async fn wait_ready(&self, template: &str, timeout: std::time::Duration) -> Result<()> {
        self.wait_waiting(template, 1, timeout).await
    }

    /// Waits until as many VMMs wait for `template` as the pool keeps.
    pub async fn wait_full(&self, template: &str, timeout: std::time::Duration) -> Result<()> {
        self.wait_waiting(template, self.options.size.max(1), timeout)
            .await
    }

    async fn wait_waiting(
        &self,
        template: &str,
        at_least: usize,
        timeout: std::time::Duration,
    ) -> Result<()> {
        let started = std::time::Instant::now();
        loop {
            if self
                .ready
                .lock()
                .await
                .get(template)
                .is_some_and(|v| v.len() >= at_least)
            {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(Error::Invalid(format!(
                    "not {at_least} pre-spawned VMM(s) for template {template:?} after {} s (see the log for refill errors)",
                    timeout.as_secs()
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Stops every waiting VMM and frees its slot and files; the pool
    /// takes no new VMMs afterwards.
    pub async fn drain(&self) {
        let all: Vec<PooledVm> = {
            let mut ready = self.ready.lock().await;
            self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
            ready.drain().flat_map(|(_, v)| v).collect()
        };
        // Wakes refills waiting for quiet, to see the pool closed.
        self.resuming.send_modify(|_| {});
        let tasks: Vec<_> = self
            .refills
            .lock()
            .map(|mut t| t.drain(..).collect())
            .unwrap_or_default();
        for task in tasks {
            let _ = task.await;
        }
        for entry in all {
            self.discard(entry).await;
        }
    }

    /// Stops the VMMs waiting for template snapshot `id` (deleted locally:
    /// they map its deleted files); a later create refills the pool.
    pub async fn discard_snapshot(&self, id: &str) {
        let mut gone = Vec::new();
        for waiting in self.ready.lock().await.values_mut() {
            let (stale, keep) = std::mem::take(waiting)
                .into_iter()
                .partition(|e| e.build == id);
            *waiting = keep;
            gone.extend::<Vec<PooledVm>>(stale);
        }
        for entry in gone {
            self.discard(entry).await;
        }
    }

    pub(crate) async fn discard(&self, mut entry: PooledVm) {
        let _ = entry.vm.shutdown().await;
        self.node.release_slot(entry.slot).await;
        let _ = std::fs::remove_dir_all(&entry.dir);
    }
}
