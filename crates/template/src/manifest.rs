//! Recording a template's startup manifest: restore it once, sample the
//! VMM's pagemap over the guest-memory mapping from the load until the agent
//! is ready as a resume makes it (`/health` answered, then `/init` done,
//! since both run before a sandbox is handed out), and attach the result to
//! the template's snapshot record under its lock.
//!
//! It runs after publication, so the template is usable before (without
//! prefetch). If the template is deleted or rebuilt meanwhile, attachment
//! is refused by the repository and the recording is dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use siesta_snapshot::pagemap::PagemapRecorder;
use siesta_snapshot::Repository;

use crate::error::{Error, IoContext, Result};
use crate::launch::incoming_spec;
use crate::Template;
use siesta_envd_client::InitParams;
use siesta_host::disk::create_overlay;
use siesta_host::Host;

/// Recordings run in `$SIESTA_HOME/run/<RECORDING_PREFIX><hex>/`.
pub const RECORDING_PREFIX: &str = "manifest-";

/// How often the pagemap is sampled while the guest starts. Each sample
/// reads 8 bytes per guest page (1 MiB for 512 MiB) in about a millisecond.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// What a recording found.
#[derive(Debug, Clone)]
pub struct RecordedManifest {
    pub snapshot: String,
    pub bytes: u64,
    pub ranges: usize,
    pub runs: usize,
    pub samples: u32,
    /// From the load request to the agent initialised.
    pub ready_ms: f64,
}

/// Records and attaches `template`'s startup manifest (see the module
/// documentation). Leaves no VM, slot or file behind, also on failure.
pub async fn record_startup_manifest(node: &Host, template: &Template) -> Result<RecordedManifest> {
    let snap = template.snapshot.clone().ok_or_else(|| {
        Error::Invalid(format!(
            "template {:?} is not in the snapshot repository (rebuild it)",
            template.record.name
        ))
    })?;
    let id = format!("{RECORDING_PREFIX}{:08x}", rand::random::<u32>());
    let work = node.config.layout().home().join("run").join(&id);
    std::fs::create_dir_all(work.join("run")).ctx("creating recording directory", &work)?;
    // Its VM outlives a server killed mid-recording: the next server's
    // recovery kills it once this process is gone.
    crate::work_dir::claim(&work)?;
    let result = async {
        let overlay = work.join("disk.qcow2");
        create_overlay(&template.disk_path(), &overlay).await?;
        let slot = node.acquire_slot(&id).await?;
        let spec = incoming_spec(node, template, &id, work.join("run"), overlay, &slot);
        let recorded = match node.vmm.spawn(&spec).await {
            Ok(mut vm) => {
                let r = sample_until_ready(
                    node,
                    template,
                    &id,
                    &slot,
                    vm.as_mut(),
                    snap.guest_memory_size,
                )
                .await;
                let _ = vm.shutdown().await;
                r
            }
            Err(source) => Err(Error::vmm(id.clone(), source)),
        };
        node.release_slot(slot).await;
        recorded
    }
    .await;
    let _ = std::fs::remove_dir_all(&work);
    let (recorder, ready_ms) = result?;
    let manifest = recorder.finish();
    let summary = RecordedManifest {
        snapshot: snap.id.clone(),
        bytes: manifest.total_bytes(),
        ranges: manifest.ranges.len(),
        runs: manifest.runs.len(),
        samples: recorder.samples(),
        ready_ms,
    };
    let repo_root = node.config.layout().repo();
    tokio::task::spawn_blocking(move || {
        Repository::open(repo_root)?.attach_manifest(&snap.id, snap.generation, &manifest)
    })
    .await
    .map_err(|e| crate::error::internal("attaching a template's manifest", e))??;
    tracing::info!(
        template = %template.record.name, snapshot = %summary.snapshot,
        mib = summary.bytes >> 20, ranges = summary.ranges, samples = summary.samples,
        "startup manifest recorded"
    );
    Ok(summary)
}

/// Records in the background; the handle's result says how it went.
/// `node` is anything that holds the host (`siesta-sandbox`'s `Node`).
pub fn spawn_manifest_recording<N>(
    node: Arc<N>,
    template: Template,
) -> tokio::task::JoinHandle<Result<RecordedManifest>>
where
    N: std::ops::Deref<Target = Host> + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let r = record_startup_manifest(&node, &template).await;
        if let Err(e) = &r {
            tracing::warn!(template = %template.record.name, "startup manifest not recorded: {e}");
        }
        r
    })
}

async fn sample_until_ready(
    node: &Host,
    template: &Template,
    id: &str,
    slot: &siesta_net::Slot,
    vm: &mut dyn siesta_vmm::VmInstance,
    guest_memory_size: u64,
) -> Result<(PagemapRecorder, f64)> {
    let pagemap_err = |e: siesta_snapshot::pagemap::PagemapError| Error::Command {
        what: format!("recording the startup manifest of {}", template.record.name),
        detail: e.to_string(),
    };
    let mut recorder =
        PagemapRecorder::new(vm.pid(), &template.memory, guest_memory_size).map_err(pagemap_err)?;
    let started = Instant::now();
    vm.restore(&template.state_path())
        .await
        .map_err(|source| Error::vmm(id.to_string(), source))?;
    recorder.sample().map_err(pagemap_err)?;
    vm.resume()
        .await
        .map_err(|source| Error::vmm(id.to_string(), source))?;
    let client = node.envd_client(id, slot, None);
    let timeout = node.config.resume_ready_timeout;
    sample_while(&mut recorder, &pagemap_err, client.wait_healthy(timeout)).await??;
    let init = InitParams::new(None, Default::default(), &Default::default());
    sample_while(&mut recorder, &pagemap_err, client.init(&init)).await??;
    let ready_ms = started.elapsed().as_secs_f64() * 1e3;
    recorder.sample().map_err(pagemap_err)?;
    Ok((recorder, ready_ms))
}

/// Runs `work` to completion, sampling the pagemap every [`SAMPLE_EVERY`]
/// meanwhile; a sampling error (mapped by `err`) ends it early.
async fn sample_while<T>(
    recorder: &mut PagemapRecorder,
    err: &(dyn Fn(siesta_snapshot::pagemap::PagemapError) -> Error + Sync),
    work: impl std::future::Future<Output = T>,
) -> Result<T> {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            r = &mut work => return Ok(r),
            _ = tick.tick() => {
                recorder.sample().map_err(err)?;
            }
        }
    }
}
