//! The build VM's disk as a chain of step-cache layers (see
//! `step_cache.rs`): the base disk, the layers of the steps a build reuses,
//! and on top an overlay that the VM writes into. After each step that
//! overlay is frozen and a new one takes its place; at the end the chain is
//! flattened into the template's raw disk.
//!
//! The cache gets a *copy* of each frozen overlay, made the moment it is
//! frozen, never the file itself: the VM's QEMU still holds that file
//! writable until it exits, so a QEMU taken over in a later step could
//! otherwise rewrite an earlier layer that other builds reuse, or change
//! its header between another build's check and open. Cache files are
//! only ever opened read-only by a VMM (below its overlay). The frozen
//! overlays themselves go when the build does.

use std::path::{Path, PathBuf};

use siesta_vmm::{BackingFile, DiskFormat, DiskSpec, VmInstance};

use crate::base::Base;
use crate::derive::{BuildLog, BuildPhase, LogLevel};
use crate::error::{Error, Result};
use crate::step_cache::{Layer, StepCache};
use crate::steps::{step_key, StepContext, StepsBuild};
use siesta_host::disk::{copy_sparse, create_overlay_on, flatten};
use siesta_host::Host;

/// The disk of one build VM.
pub(crate) struct LayeredDisk {
    cache: StepCache,
    /// The last layer as the cache records it: what the steps so far left.
    top: Layer,
    /// The overlay the VM writes into.
    writing: PathBuf,
    /// What the VM runs on below `writing`, nearest first: the overlays it
    /// froze (the same bytes as the cache's copies), then the cache layers
    /// it started from.
    below: Vec<BackingFile>,
    /// The overlays the VM froze, removed with the build.
    frozen: Vec<PathBuf>,
}

impl LayeredDisk {
    /// Finds (or writes) the base disk and the longest run of cached steps
    /// on it, and puts a fresh overlay on top. Returns the disk and how many
    /// steps it already holds.
    pub async fn prepare(
        node: &Host,
        build: &StepsBuild,
        base: &Base,
        work: &Path,
        log: &BuildLog,
    ) -> Result<(Self, usize)> {
        let cache = StepCache::open(node.config.layout().step_cache())?;
        let base_key = build.base_key(&base.id());
        let mut top = match cache.get(&base_key).filter(|_| build.may_reuse(0)) {
            Some(layer) => {
                log(LogLevel::Info, &BuildPhase::Base, "base disk: cached");
                layer
            }
            None => write_base(node, &cache, &base_key, build, base, work, log).await?,
        };
        let mut reused = 0;
        for (i, step) in build.steps.iter().enumerate() {
            // A longer chain than a VMM may be given runs its steps again.
            if !build.may_reuse(i + 1) || top.chain().len() >= siesta_vmm::MAX_BACKING_DEPTH {
                break;
            }
            match cache.get(&step_key(&top.key, step)) {
                Some(layer) => top = layer,
                None => break,
            }
            reused = i + 1;
        }
        let writing = cache.new_image(&top.key, DiskFormat::Qcow2);
        create_overlay_on(&cache.path(&top.disk), top.format, &writing).await?;
        let below = top
            .chain()
            .into_iter()
            .map(|i| BackingFile {
                path: cache.path(&i.file),
                format: i.format,
            })
            .collect();
        Ok((
            Self {
                cache,
                top,
                writing,
                below,
                frozen: Vec::new(),
            },
            reused,
        ))
    }

    /// The disk the VM is to be started with: the overlay it writes over
    /// the chain of layers the cache recorded.
    pub fn vm_disk(&self) -> DiskSpec {
        DiskSpec {
            path: self.writing.clone(),
            format: DiskFormat::Qcow2,
            read_only: false,
            backing: self.below.clone(),
        }
    }

    /// Where the next step starts: the context the last layer recorded.
    pub fn context(&self) -> StepContext {
        self.top.context.clone()
    }

    /// Records what `step` left (the guest has flushed its caches): the
    /// overlay written so far is frozen, a copy of it becomes the step's
    /// layer, and the VM goes on writing into a new one. A step that does
    /// not write the disk shares the last layer's image.
    pub async fn commit(
        &mut self,
        vm: &mut dyn VmInstance,
        step: &crate::steps::Step,
        ctx: &StepContext,
    ) -> Result<()> {
        let key = step_key(&self.top.key, step);
        if !step.writes_disk() {
            let disk = self.cache.path(&self.top.disk);
            let below = self.top.below.clone();
            self.top = self.cache.put(&key, &disk, self.top.format, below, ctx)?;
            return Ok(());
        }
        let next = self.cache.new_image(&key, DiskFormat::Qcow2);
        vm.checkpoint_disk(&next)
            .await
            .map_err(|source| Error::vmm(vm.id().to_string(), source))?;
        let frozen = std::mem::replace(&mut self.writing, next);
        self.below.insert(
            0,
            BackingFile {
                path: frozen.clone(),
                format: DiskFormat::Qcow2,
            },
        );
        self.frozen.push(frozen.clone());
        let copy = self.cache.new_image(&key, DiskFormat::Qcow2);
        if let Err(e) = copy_sparse(&frozen, &copy).await {
            let _ = std::fs::remove_file(&copy);
            return Err(e.into());
        }
        let below = self.top.chain();
        self.top = self.cache.put(&key, &copy, DiskFormat::Qcow2, below, ctx)?;
        Ok(())
    }

    /// Writes the whole chain as one raw image at `raw` (the VM is gone)
    /// and removes the last overlay, which belongs to no step.
    pub async fn flatten_into(self, raw: &Path) -> Result<()> {
        let done = flatten(&self.vm_disk(), raw).await;
        self.discard();
        Ok(done?)
    }

    /// Removes the overlay being written and the ones the VM froze (after
    /// a failed build, or once flattened); the cache keeps its copies.
    pub fn discard(self) {
        for file in self.frozen.iter().chain([&self.writing]) {
            let _ = std::fs::remove_file(file);
        }
    }

    /// Keeps the cache within the node's bound.
    pub async fn prune(node: &Host) {
        let dir = node.config.layout().step_cache();
        let max = node.config.step_cache_mib << 20;
        let pruned = tokio::task::spawn_blocking(move || StepCache::open(dir)?.prune(max)).await;
        match pruned {
            Ok(Ok(freed)) if freed > 0 => tracing::info!(freed, "step cache pruned"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "pruning the step cache failed"),
            Err(e) => tracing::warn!(error = %e, "pruning the step cache stopped"),
        }
    }
}

/// Writes the base disk into the cache as the layer `key`.
async fn write_base(
    node: &Host,
    cache: &StepCache,
    key: &str,
    build: &StepsBuild,
    base: &Base,
    work: &Path,
    log: &BuildLog,
) -> Result<Layer> {
    let disk = cache.new_image(key, DiskFormat::Raw);
    let written = base.write_disk(node, build, work, &disk, log).await;
    let layer = written.and_then(|defaults| {
        let ctx = StepContext::starting(defaults.env.clone(), &defaults.guest);
        cache.put(key, &disk, DiskFormat::Raw, vec![], &ctx)
    });
    if layer.is_err() {
        let _ = std::fs::remove_file(&disk);
    }
    layer
}
