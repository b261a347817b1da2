//! `siesta template build`: boot an image, wait for its agent, freeze it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use siesta_vmm::{
    DiskFormat, DiskSpec, LaunchMode, LaunchSpec, MemoryBacking, MemorySave, VmInstance,
};

use crate::error::{Error, IoContext, Result};
use crate::record::{self, TemplateRecord};
use crate::{is_complete, Template};
use siesta_envd_client::EnvdError;
use siesta_host::disk::{copy_sparse, create_overlay};
use siesta_host::layout::validate_name;
use siesta_host::Host;

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub name: String,
    /// Root filesystem image under `assets/` (`rootfs-<image>.img`).
    pub image: String,
    /// Replace an existing template of that name.
    pub force: bool,
}

/// Builds template `opts.name` and returns it. The template appears
/// atomically: it is assembled in a hidden directory, then published into
/// the snapshot repository (see `publish.rs`). Its startup manifest is
/// recorded afterwards ([`crate::record_startup_manifest`]).
/// A build hashed what it published: its first use need not hash again.
pub(crate) fn trust_blobs(node: &Host, t: &Template) {
    node.blob_checks.trust(&t.memory, &t.record.memory.sha256);
    node.blob_checks.trust(&t.disk, &t.record.disk.sha256);
}

pub async fn build_template(node: &Host, opts: &BuildOptions) -> Result<Template> {
    validate_name("template", &opts.name).map_err(Error::Invalid)?;
    let layout = node.config.layout();
    if Template::open(&layout, &opts.name).is_ok() && !opts.force {
        return Err(Error::Invalid(format!(
            "template {:?} already exists (use --force to rebuild it)",
            opts.name
        )));
    }
    let image = check_assets(node, &opts.image)?;
    let work = crate::work_dir::create(&layout.templates(), &opts.name)?;
    let record = match freeze_into(node, opts, &image, &work).await {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&work);
            return Err(e);
        }
    };
    let published = crate::publish::publish_off_thread(&layout, record.clone(), &work).await;
    let _ = std::fs::remove_dir_all(&work);
    let template = published?;
    trust_blobs(node, &template);
    // A rebuilt template replaces one from before the repository too.
    let legacy = layout.template_dir(&opts.name);
    if is_complete(&legacy) {
        let _ = std::fs::remove_dir_all(&legacy);
    }
    tracing::info!(template = %opts.name, cold_boot_ms = record.cold_boot_ms, "template built");
    Ok(template)
}

/// Cold-boots `image` (over a throwaway overlay) until its agent answers and
/// returns the time from spawning the VMM to that answer, in milliseconds.
pub async fn cold_boot(node: &Host, image: &str) -> Result<f64> {
    let image = check_assets(node, image)?;
    let work = node
        .config
        .layout()
        .home()
        .join(format!("run/coldboot-{}", std::process::id()));
    std::fs::create_dir_all(&work).ctx("creating cold-boot directory", &work)?;
    let result = async {
        let disk = work.join("disk.qcow2");
        create_overlay(&image, &disk).await?;
        let spec = boot_spec(
            node,
            "coldboot",
            &work,
            VmSize::of_node(node),
            work.join("memory.img"),
            DiskSpec::overlay_of_raw(disk, image.clone()),
        );
        let (mut vm, ms) = boot_until_healthy(node, spec).await?;
        let _ = vm.0.shutdown().await;
        node.release_slot(vm.1).await;
        Ok(ms)
    }
    .await;
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn check_assets(node: &Host, image: &str) -> Result<PathBuf> {
    validate_name("image", image).map_err(Error::Invalid)?;
    let layout = node.config.layout();
    let image = layout.image(image);
    for (what, path) in [
        ("root filesystem image", &image),
        ("guest kernel", &layout.kernel()),
        ("initramfs", &layout.initrd()),
    ] {
        if !path.exists() {
            return Err(Error::Invalid(format!(
                "{what} {} is missing: run `make assets` (guest/build-assets.sh)",
                path.display()
            )));
        }
    }
    Ok(image)
}

/// The size of a VM: vCPUs and memory in MiB.
#[derive(Debug, Clone, Copy)]
pub struct VmSize {
    pub vcpus: u32,
    pub memory_mib: u32,
}

impl VmSize {
    pub fn of_node(node: &Host) -> Self {
        Self {
            vcpus: node.config.vcpus,
            memory_mib: node.config.memory_mib,
        }
    }
}

pub fn boot_spec(
    node: &Host,
    id: &str,
    dir: &Path,
    size: VmSize,
    memory: PathBuf,
    disk: DiskSpec,
) -> LaunchSpec {
    let layout = node.config.layout();
    LaunchSpec {
        id: id.to_string(),
        run_dir: dir.join("run"),
        vcpus: size.vcpus,
        memory_mib: size.memory_mib.into(),
        kernel: layout.kernel(),
        initrd: Some(layout.initrd()),
        cmdline: node.kernel_cmdline(),
        memory: MemoryBacking {
            path: memory,
            shared: true,
            prealloc: false,
        },
        disk: Some(disk),
        net: None, // filled in by boot_until_healthy with the slot it takes
        mode: LaunchMode::Boot,
        serial_log: true,
    }
}

/// A booted VM and the slot it runs in.
pub type Booted = (Box<dyn VmInstance>, siesta_net::Slot);

/// Takes a slot, spawns and boots `spec` there and waits for the agent.
/// On failure nothing is left running.
pub async fn boot_until_healthy(node: &Host, mut spec: LaunchSpec) -> Result<(Booted, f64)> {
    let id = spec.id.clone();
    let slot = node.acquire_slot(&id).await?;
    spec.net = Some(node.net_spec(&slot));
    std::fs::create_dir_all(&spec.run_dir).ctx("creating run directory", &spec.run_dir)?;
    let started = Instant::now();
    let mut vm = match node.vmm.spawn(&spec).await {
        Ok(vm) => vm,
        Err(source) => {
            node.release_slot(slot).await;
            return Err(Error::vmm(id, source));
        }
    };
    let ready = async {
        vm.boot()
            .await
            .map_err(|source| Error::vmm(id.clone(), source))?;
        node.envd_client(&id, &slot, None)
            .wait_healthy(node.config.boot_ready_timeout)
            .await
            .map_err(|e| with_serial_log(e, &spec).into())
    }
    .await;
    match ready {
        Ok(_) => Ok(((vm, slot), started.elapsed().as_secs_f64() * 1e3)),
        Err(e) => {
            let _ = vm.shutdown().await;
            node.release_slot(slot).await;
            Err(e)
        }
    }
}

async fn freeze_into(
    node: &Host,
    opts: &BuildOptions,
    image: &Path,
    work: &Path,
) -> Result<TemplateRecord> {
    let layout = node.config.layout();
    let disk = work.join(record::DISK_FILE);
    copy_sparse(image, &disk).await?;
    let memory = work.join(record::MEMORY_FILE);
    let state = work.join(record::STATE_FILE);
    let id = format!("build-{}", opts.name);
    let mut spec = boot_spec(
        node,
        &id,
        work,
        VmSize::of_node(node),
        memory.clone(),
        DiskSpec {
            path: disk.clone(),
            format: DiskFormat::Raw,
            read_only: false,
            backing: vec![],
        },
    );
    spec.cmdline = node.template_kernel_cmdline();
    let run_dir = spec.run_dir.clone();
    let guest_assets = record::guest_assets_digest_off_thread(layout.clone()).await?;
    let (booted, cold_boot_ms) = boot_until_healthy(node, spec).await?;
    let client = node.envd_client(&id, &booted.1, None);
    if let Err(e) = init_before_freeze(&client, &Default::default()).await {
        stop_booted(node, booted).await;
        return Err(e);
    }
    freeze(node, &id, booted, &state).await?;
    let _ = std::fs::remove_dir_all(&run_dir);
    let [memory_file, state_file, disk_file] = record::file_records(&memory, &state, &disk).await?;

    let record = TemplateRecord {
        name: opts.name.clone(),
        image: opts.image.clone(),
        created_at: chrono::Utc::now(),
        vcpus: node.config.vcpus,
        memory_mib: node.config.memory_mib,
        vmm: node.vmm.info().clone(),
        kernel: layout.kernel().display().to_string(),
        kernel_cmdline: node.template_kernel_cmdline(),
        memory: memory_file,
        state: state_file,
        disk: disk_file,
        cold_boot_ms,
        defaults: Default::default(),
        parent: None,
        build_key: None,
        source_image: None,
        guest_assets: Some(guest_assets),
    };
    record.store(work)?;
    Ok(record)
}

/// Has the build VM's agent answer one `/init` before the VM is frozen:
/// the template's defaults `guest` (so the frozen agent already has them),
/// the clock, entropy, and no token (a build's token is cleared: `client`
/// presents it). The code every resume's `agent_init` runs
/// has then run once in the frozen guest, and each resume finds it where
/// that run left it instead of faulting it in: half the stage
/// (`siesta bench resume --compare templates`, docs/benchmarks.md). Each
/// sandbox's `/init` sets everything again.
pub(crate) async fn init_before_freeze(
    client: &siesta_envd_client::EnvdClient,
    guest: &siesta_envd_client::GuestDefaults,
) -> Result<()> {
    // An empty token clears the agent's; `None` would leave it as it is.
    let params = siesta_envd_client::InitParams::new(
        Some(String::new()),
        std::collections::HashMap::new(),
        guest,
    );
    Ok(client.init(&params).await?)
}

/// Gives a build VM's agent a token of its own before any step runs, so
/// nothing else on the host (the slot's address answers there) can drive
/// it; returns the client that presents it. [`init_before_freeze`] clears
/// it again, so the template is frozen without one.
pub(crate) async fn claim_build_agent(
    node: &Host,
    id: &str,
    slot: &siesta_net::Slot,
    guest: &siesta_envd_client::GuestDefaults,
) -> Result<siesta_envd_client::EnvdClient> {
    let token = siesta_host::ids::new_token();
    let params = siesta_envd_client::InitParams::new(
        Some(token.clone()),
        std::collections::HashMap::new(),
        guest,
    );
    node.envd_client(id, slot, None).init(&params).await?;
    Ok(node.envd_client(id, slot, Some(token)))
}

/// Stops the booted VM, saves its device state to `state` (RAM stays in
/// the shared backing file) and shuts it down; the slot is released.
pub(crate) async fn freeze(node: &Host, id: &str, booted: Booted, state: &Path) -> Result<()> {
    let (mut vm, slot) = booted;
    let frozen = async {
        vm.pause().await?;
        vm.save(state, MemorySave::InBackingFile).await
    }
    .await;
    stop_booted(node, (vm, slot)).await;
    frozen.map(drop).map_err(|source| Error::vmm(id, source))
}

/// Shuts the booted VM down and releases its slot.
async fn stop_booted(node: &Host, booted: Booted) {
    let (mut vm, slot) = booted;
    let _ = vm.shutdown().await;
    node.release_slot(slot).await;
}

/// Appends the guest's console output to a readiness error: it is usually
/// what says why the guest never answered.
fn with_serial_log(err: EnvdError, spec: &LaunchSpec) -> EnvdError {
    let EnvdError::GuestNotReady { id, secs, detail } = err else {
        return err;
    };
    let log = std::fs::read_to_string(spec.run_dir.join("serial.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(15)..].join("\n");
    EnvdError::GuestNotReady {
        id,
        secs,
        detail: format!("{detail}; last console lines:\n{tail}"),
    }
}
