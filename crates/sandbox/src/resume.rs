//! The resume path: how a sandbox comes to life from a snapshot.
//!
//! Every resume runs the same named stages, timed by a [`StageClock`]:
//!
//! | stage              | from a template                         | from a paused sandbox              |
//! |--------------------|-----------------------------------------|------------------------------------|
//! | `vmm_pool_acquire` | take a VMM waiting in `-incoming`       | same (else spawn one over the sandbox disk) |
//! | `rootfs_bind`      | adopt the pooled VMM's fresh overlay    | hand the pooled VMM the sandbox's disk and move its run directory in |
//! | `network_setup`    | apply the slot's egress policy          | same (a spawned VMM: take a slot first) |
//! | `snapshot_load`    | load the template's device state        | load the saved state and its RAM   |
//! | `resume`           | start the vCPUs                         | same                               |
//! | `guest_health`     | wait for the agent's `/health`          | same                               |
//! | `agent_init`       | `POST /init`: clock, entropy, env, token| same                               |
//!
//! A sandbox paused with its disk only (E2B's filesystem-only pause), or
//! resumed with a reboot, comes back by [`cold_boot`] instead: one
//! `cold_boot` stage (spawn, boot the template's kernel over the sandbox's
//! disk, wait for the agent) and then `network_setup`, `guest_health` and
//! `agent_init` as above.
//!
//! Beside them, in the background, `memory_prefetch` reads the template's
//! startup manifest pages of the memory file into the page cache from the
//! start of the resume; it is let go of when the agent is initialised
//! and recorded apart (how long it ran, whether it finished before ready),
//! so it never delays a resume. Both paths map the template's memory file,
//! so both prefetch it.
//!
//! The template's memory file is mapped when the VMM is spawned (by the pool,
//! off the critical path), so memory binding is not a stage of its own here;
//! neither is the disk overlay's creation, which the pool does ahead of time.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use siesta_net::{EgressPolicy, Slot};
use siesta_vmm::{DiskSpec, VmInstance, VmmError};

use crate::error::{Error, IoContext, Result};
use crate::memory_prefetch::finish_at_ready;
use crate::node::Node;
use crate::pool::{PooledVm, VmmPool};
use crate::stages::{Stage, StageClock, StageTimings};
use crate::volumes::{start_exports, Exports, VolumeMount};
use siesta_envd_client::InitParams;
use siesta_template::incoming_spec;
use siesta_template::{boot_spec, boot_until_healthy, Template, VmSize};
use siesta_volume::Volumes;

/// A VM that came out of the resume path, running and initialised.
pub struct Resumed {
    pub id: String,
    /// The sandbox's directory (disk overlay, run directory).
    pub dir: PathBuf,
    pub vm: Box<dyn VmInstance>,
    pub slot: Slot,
    pub exports: Exports,
    pub run_dir: PathBuf,
    pub timings: StageTimings,
    /// The template it runs on (whose memory its VMM maps).
    pub template: Template,
}

/// What the guest is told at `/init`, and how it may reach the outside.
#[derive(Debug, Clone)]
pub struct ResumeParams {
    pub init: InitParams,
    /// The access token the guest holds now, which `/init` must present to
    /// set `init.access_token`: the sandbox's own on a resume, the source's
    /// for a snapshot or fork, none for a fresh template.
    pub guest_token: Option<String>,
    pub egress: EgressPolicy,
    /// Volumes to serve in the slot before the guest runs (the guest is
    /// told to mount them in `init`).
    pub mounts: Vec<VolumeMount>,
    pub volumes: Option<Arc<Volumes>>,
}

/// Resumes a new sandbox from `template`. The sandbox takes the id and
/// directory the pool prepared for its VMM.
pub async fn from_template(
    node: &Arc<Node>,
    pool: &Arc<VmmPool>,
    template: &Template,
    params: &ResumeParams,
) -> Result<Resumed> {
    template.check_compatible(node.vmm.info())?;
    template.verify_sizes()?;
    // Pool refills wait until no resume is in flight.
    let _resuming = pool.resuming();
    let mut clock = StageClock::start();
    let prefetch = node.prefetch.start(&node.config.layout().repo(), template);

    // Held to the end: the pool is topped up once this resume is done.
    let (entry, hit, _refill) = clock
        .time(Stage::VmmPoolAcquire, pool.acquire(template))
        .await?;
    let PooledVm {
        id,
        dir,
        vm,
        slot,
        overlay,
        run_dir: _,
        build: _,
    } = entry;
    tracing::debug!(sandbox = %id, pool_hit = hit, "vmm acquired");
    // A failed resume from a template leaves nothing: its directory goes too.
    let mut guard = Cleanup::new(node, id, vm, slot, dir.clone());
    let bound = clock
        .time(Stage::RootfsBind, async {
            std::fs::metadata(&overlay).ctx("sandbox disk overlay", &overlay)
        })
        .await;
    if let Err(e) = bound {
        return Err(guard.fail(e).await);
    }
    let state = template.state_path();
    let target = Target {
        state: &state,
        dir,
        template,
    };
    finish(node, clock, target, params, guard, prefetch).await
}

/// A saved VM state and the memory blob it was saved over.
pub struct SavedState {
    pub state: PathBuf,
    /// The guest RAM mapping's file: a changed-pages state holds only the
    /// pages that differ from it (see [`crate::memory_save`]).
    pub memory: PathBuf,
}

/// Resumes sandbox `id` whose disk is in `dir` from a saved state: its
/// own paused snapshot (see [`crate::paused`]), or a snapshot or fork of
/// another sandbox of `template`.
///
/// A state saved over the template's memory resumes into a VMM the pool
/// has waiting for the template, handed the sandbox's disk and run
/// directory ([`adopt_pooled`]); with none waiting, or over other memory (a
/// user snapshot's), one is spawned over the sandbox's disk.
pub async fn from_saved(
    node: &Arc<Node>,
    pool: &Arc<VmmPool>,
    template: &Template,
    id: &str,
    dir: &Path,
    saved: SavedState,
    params: &ResumeParams,
) -> Result<Resumed> {
    template.check_compatible(node.vmm.info())?;
    let _resuming = pool.resuming();
    let mut clock = StageClock::start();
    let prefetch = node.prefetch.start(&node.config.layout().repo(), template);
    let waiting = if saved.memory == template.memory_path() {
        clock
            .time(Stage::VmmPoolAcquire, pool.take_waiting(template))
            .await
    } else {
        None
    };
    let sandbox = SavedSandbox {
        id,
        dir,
        saved,
        template_disk: template.disk_path(),
    };
    let (guard, _refill) = match waiting {
        Some((entry, refill)) => (
            adopt_pooled(node, pool, &mut clock, entry, &sandbox).await?,
            Some(refill),
        ),
        None => (
            spawn_for_saved(node, &mut clock, template, &sandbox).await?,
            None,
        ),
    };
    let target = Target {
        state: &sandbox.saved.state,
        dir: dir.to_path_buf(),
        template,
    };
    finish(node, clock, target, params, guard, prefetch).await
}

/// The sandbox a saved state is resumed as.
struct SavedSandbox<'a> {
    id: &'a str,
    /// Its directory: `disk.qcow2` and `run/`.
    dir: &'a Path,
    saved: SavedState,
    /// What its disk is an overlay of.
    template_disk: PathBuf,
}

impl SavedSandbox<'_> {
    fn disk(&self) -> PathBuf {
        self.dir.join(crate::sandbox::DISK_FILE)
    }
    fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }
    /// The disk and the saved state exist.
    fn check_files(&self) -> Result<()> {
        let (disk, state) = (self.disk(), &self.saved.state);
        std::fs::metadata(&disk).ctx("sandbox disk", &disk)?;
        std::fs::metadata(state).ctx("sandbox saved state", state)?;
        Ok(())
    }
}

/// Hands a pooled VMM to the sandbox: its own disk in place of the pool's
/// fresh overlay, and the VMM's run directory (control socket, logs) moved
/// into the sandbox's directory. The `rootfs_bind` stage. On failure the
/// pooled VMM is discarded and the sandbox's files are left as they were.
async fn adopt_pooled<'a>(
    node: &'a Arc<Node>,
    pool: &Arc<VmmPool>,
    clock: &mut StageClock,
    mut entry: PooledVm,
    sandbox: &SavedSandbox<'_>,
) -> Result<Cleanup<'a>> {
    let disk = siesta_vmm::DiskSpec::overlay_of_raw(sandbox.disk(), sandbox.template_disk.clone());
    let run_dir = sandbox.run_dir();
    let bound = clock
        .time(Stage::RootfsBind, async {
            sandbox.check_files()?;
            entry
                .vm
                .replace_disk(disk)
                .await
                .map_err(|source| Error::vmm(sandbox.id.to_string(), source))?;
            // A stale run directory of the sandbox's last VMM, if any.
            match std::fs::remove_dir_all(&run_dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).ctx("removing the old run directory", &run_dir)
                }
                _ => {}
            }
            std::fs::rename(&entry.run_dir, &run_dir)
                .ctx("moving the VMM's run directory", &run_dir)
        })
        .await;
    if let Err(e) = bound {
        pool.discard(entry).await;
        return Err(e);
    }
    entry.vm.rename(sandbox.id, &run_dir);
    // What is left there is the pool's overlay, which the VMM closed.
    let _ = std::fs::remove_dir_all(&entry.dir);
    tracing::debug!(sandbox = sandbox.id, pooled = %entry.id, "paused sandbox resumes into a pooled VMM");
    Ok(Cleanup::new(
        node,
        sandbox.id.to_string(),
        entry.vm,
        entry.slot,
        run_dir,
    ))
}

/// Spawns a VMM over the sandbox's disk, mapping the memory its state was
/// saved over (the `vmm_pool_acquire` stage, as a pool miss).
async fn spawn_for_saved<'a>(
    node: &'a Arc<Node>,
    clock: &mut StageClock,
    template: &Template,
    sandbox: &SavedSandbox<'_>,
) -> Result<Cleanup<'a>> {
    let slot = clock
        .time(Stage::NetworkSetup, node.acquire_slot(sandbox.id))
        .await?;
    let checked = clock
        .time(Stage::RootfsBind, async {
            sandbox.check_files()?;
            let run_dir = sandbox.run_dir();
            std::fs::create_dir_all(&run_dir).ctx("creating run directory", &run_dir)
        })
        .await;
    if let Err(e) = checked {
        node.release_slot(slot).await;
        return Err(e);
    }
    let run_dir = sandbox.run_dir();
    let mut spec = incoming_spec(
        node,
        template,
        sandbox.id,
        run_dir.clone(),
        sandbox.disk(),
        &slot,
    );
    // The blob the state was saved over (see `memory_save`).
    spec.memory.path.clone_from(&sandbox.saved.memory);
    let spawned = clock
        .time(Stage::VmmPoolAcquire, node.vmm.spawn(&spec))
        .await;
    match spawned {
        // A failed resume of a paused sandbox keeps its disk and saved state.
        Ok(vm) => Ok(Cleanup::new(
            node,
            sandbox.id.to_string(),
            vm,
            slot,
            run_dir,
        )),
        Err(source) => {
            node.release_slot(slot).await;
            Err(Error::vmm(sandbox.id.to_string(), source))
        }
    }
}

/// What a resume loads (`state`), where the sandbox lives (`dir`) and the
/// template it runs on.
struct Target<'a> {
    state: &'a Path,
    dir: PathBuf,
    template: &'a Template,
}

/// The stages both paths share: policy, load, resume, health, init.
async fn finish(
    node: &Arc<Node>,
    mut clock: StageClock,
    target: Target<'_>,
    params: &ResumeParams,
    mut guard: Cleanup<'_>,
    prefetch: Option<siesta_snapshot::PrefetchHandle>,
) -> Result<Resumed> {
    let id = guard.id.clone();
    let state = target.state;
    if let Err(e) = prepare_slot(&mut clock, &mut guard, params).await {
        return Err(guard.fail(e).await);
    }
    let loaded = clock
        .time(Stage::SnapshotLoad, guard.vm().restore(state))
        .await;
    if let Err(e) = loaded {
        return Err(guard.fail(load_error(e, state, &id)).await);
    }
    if let Err(e) = clock.time(Stage::Resume, guard.vm().resume()).await {
        return Err(guard.fail(Error::vmm(id.clone(), e)).await);
    }
    let ready = initialise(node, &mut clock, &guard, params).await;
    // Ready (or failed): the prefetch is accounted for and let go of;
    // dropping the last claim cancels what it has not read yet.
    finish_at_ready(&mut clock, prefetch);
    if let Err(e) = ready {
        return Err(guard.fail(e).await);
    }
    Ok(done(guard, clock, target.dir, target.template))
}

/// Boots sandbox `id` afresh from the disk in `dir` (after a
/// filesystem-only pause, or a resume asked to reboot): the template's
/// kernel and initramfs, new RAM, then the same policy, volumes and
/// `/init` as a resume. Its boot is the `cold_boot` stage.
pub async fn cold_boot(
    node: &Arc<Node>,
    template: &Template,
    id: &str,
    dir: &Path,
    params: &ResumeParams,
) -> Result<Resumed> {
    let mut clock = StageClock::start();
    let run_dir = dir.join("run");
    let size = VmSize {
        vcpus: template.record.vcpus,
        memory_mib: template.record.memory_mib,
    };
    let mut spec = boot_spec(
        node,
        id,
        dir,
        size,
        run_dir.join("memory.img"),
        DiskSpec::overlay_of_raw(dir.join(crate::sandbox::DISK_FILE), template.disk_path()),
    );
    // Its own RAM, zero at boot: private, so a later pause saves it.
    spec.memory.shared = false;
    let ((vm, slot), _) = clock
        .time(Stage::ColdBoot, boot_until_healthy(node, spec))
        .await?;
    let mut guard = Cleanup::new(node, id.to_string(), vm, slot, run_dir);
    if let Err(e) = prepare_slot(&mut clock, &mut guard, params).await {
        return Err(guard.fail(e).await);
    }
    // A fresh agent holds no token yet.
    let fresh = ResumeParams {
        guest_token: None,
        ..params.clone()
    };
    if let Err(e) = initialise(node, &mut clock, &guard, &fresh).await {
        return Err(guard.fail(e).await);
    }
    Ok(done(guard, clock, dir.to_path_buf(), template))
}

/// The slot's egress policy, then the volumes' exports (served before the
/// guest runs, so a resumed guest's NFS client reconnects at once).
async fn prepare_slot(
    clock: &mut StageClock,
    guard: &mut Cleanup<'_>,
    params: &ResumeParams,
) -> Result<()> {
    let id = guard.id.clone();
    clock
        .time(
            Stage::NetworkSetup,
            guard.slot().apply_policy(&params.egress),
        )
        .await
        .map_err(|source| Error::Net {
            id: id.clone(),
            source,
        })?;
    guard.exports =
        start_exports(&id, params.volumes.as_ref(), guard.slot(), &params.mounts).await?;
    Ok(())
}

/// Waits for the agent, then `/init` (which also mounts the volumes).
async fn initialise(
    node: &Arc<Node>,
    clock: &mut StageClock,
    guard: &Cleanup<'_>,
    params: &ResumeParams,
) -> Result<()> {
    let client = node.envd_client(&guard.id, guard.slot(), params.guest_token.clone());
    clock
        .time(
            Stage::GuestHealth,
            client.wait_healthy(node.config.resume_ready_timeout),
        )
        .await?;
    clock
        .time(Stage::AgentInit, client.init(&params.init))
        .await?;
    Ok(())
}

/// The resumed VM, handed over by its guard.
fn done(mut guard: Cleanup<'_>, clock: StageClock, dir: PathBuf, template: &Template) -> Resumed {
    let id = guard.id.clone();
    let timings = clock.finish();
    tracing::info!(sandbox = %id, "resumed: {}", timings.summary());
    let exports = std::mem::take(&mut guard.exports);
    let (vm, slot, _) = guard.disarm();
    let run_dir = dir.join("run");
    Resumed {
        id,
        dir,
        vm,
        slot,
        exports,
        run_dir,
        timings,
        template: template.clone(),
    }
}

/// A state file the VMM could not load is named in the error: it is most
/// often corrupt or from another VMM. A VMM killed from outside while it
/// loaded says nothing about the file: that is a VMM error.
fn load_error(e: VmmError, state: &Path, id: &str) -> Error {
    match e {
        VmmError::Exited { killed: true, .. } => Error::vmm(id.to_string(), e),
        VmmError::Migration { .. } | VmmError::StateFile { .. } | VmmError::Exited { .. } => {
            Error::CorruptSnapshot {
                path: state.to_path_buf(),
                detail: e.to_string(),
            }
        }
        source => Error::vmm(id.to_string(), source),
    }
}

/// Owns a half-resumed VM: if the resume fails, the VMM is stopped, the
/// slot returned and `scratch` (a directory only this attempt made) removed,
/// so nothing is left behind. Dropped while still armed (the resume's task
/// cancelled or panicking), it does the same without waiting: the VMM is
/// killed by its own drop, the slot goes back through its lease, the
/// volumes' exports stop as they drop, and the scratch directory goes here.
struct Cleanup<'a> {
    node: &'a Arc<Node>,
    id: String,
    parts: Option<(Box<dyn VmInstance>, Slot, PathBuf)>,
    /// The volumes' NFS servers in the slot, once started.
    exports: Exports,
}

impl<'a> Cleanup<'a> {
    fn new(
        node: &'a Arc<Node>,
        id: String,
        vm: Box<dyn VmInstance>,
        slot: Slot,
        run_dir: PathBuf,
    ) -> Self {
        Self {
            node,
            id,
            parts: Some((vm, slot, run_dir)),
            exports: Exports::default(),
        }
    }
    fn vm(&mut self) -> &mut Box<dyn VmInstance> {
        &mut self.parts.as_mut().expect("armed until disarm or fail").0
    }
    fn slot(&self) -> &Slot {
        &self.parts.as_ref().expect("armed until disarm or fail").1
    }
    fn disarm(&mut self) -> (Box<dyn VmInstance>, Slot, PathBuf) {
        self.parts.take().expect("armed until disarm or fail")
    }
    async fn fail(&mut self, err: Error) -> Error {
        if let Some((mut vm, slot, scratch)) = self.parts.take() {
            let _ = vm.shutdown().await;
            std::mem::take(&mut self.exports).stop().await;
            self.node.release_slot(slot).await;
            let _ = std::fs::remove_dir_all(&scratch);
        }
        err
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Some((vm, slot, scratch)) = self.parts.take() {
            tracing::warn!(sandbox = %self.id, "resume abandoned midway: undoing it");
            drop(vm);
            drop(slot);
            if let Err(e) = std::fs::remove_dir_all(&scratch) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(sandbox = %self.id, "removing {}: {e}", scratch.display());
                }
            }
        }
    }
}
