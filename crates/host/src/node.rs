//! The host a node runs on: the VMM backend, the network slot pool, the
//! configuration and the memory of which blobs were checked, built once at
//! start-up and passed explicitly to everything that needs them. Template
//! builds need only this; `siesta-sandbox`'s `Node` adds what running
//! sandboxes need (memory prefetch, stop announcements).

use std::net::SocketAddr;
use std::sync::Arc;

use siesta_net::{NetConfig, Slot, SlotPool};
use siesta_vmm::qemu::QemuVmm;
use siesta_vmm::{AccelChoice, NetSpec, Vmm};

use crate::blob_checks::BlobChecks;
use crate::config::{AccelSetting, NodeConfig};
use crate::error::{HostError as Error, Result};
use crate::tuning::Tuning;
use siesta_envd_client::EnvdClient;

/// Kernel command line of every guest: the console, and the guest network
/// that is the same in every slot (see `siesta_net::layout`).
const CMDLINE_BASE: &str = "console=ttyS0 quiet panic=-1 reboot=t";
/// See [`Host::template_kernel_cmdline`].
const FREED_PAGES_ZEROED: &str = "init_on_free=1";

pub struct Host {
    pub config: NodeConfig,
    pub vmm: Arc<dyn Vmm>,
    pub net: SlotPool,
    /// Which template blobs were checked against their digests.
    pub blob_checks: Arc<BlobChecks>,
    /// The optimisations it runs with (all, but in a benchmark's arms).
    pub tuning: Tuning,
    /// The parent of this instance's VMM cgroups, removed at shutdown.
    cgroups: Option<siesta_vmm::Cgroups>,
}

/// The cgroups every VMM of this instance runs in (`siesta-<tag>/<vm>`),
/// after removing the empty ones a killed server left. A host without a
/// usable hierarchy runs its VMMs without memory, pids and CPU limits,
/// which the log (and `siesta doctor`) says.
fn vmm_cgroups(tag: &str) -> Option<siesta_vmm::Cgroups> {
    match siesta_vmm::Cgroups::detect(&format!("siesta-{tag}")) {
        Ok(Some(cgroups)) => {
            let removed = cgroups.remove_leftovers();
            tracing::info!(
                version = cgroups.version(),
                removed,
                "each VMM runs in a cgroup of its own"
            );
            Some(cgroups)
        }
        Ok(None) => {
            tracing::warn!(
                "no writable cgroup hierarchy: VMMs run without memory, pids and CPU limits"
            );
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "cgroups unusable: VMMs run without memory, pids and CPU limits");
            None
        }
    }
}

/// Where each VMM's unprivileged user comes from, if VMMs get one: only a
/// server running as root can hand a process another user.
fn vmm_users(config: &NodeConfig) -> Result<Option<Arc<siesta_vmm::VmmUsers>>> {
    if !config.vmm_users {
        tracing::warn!("VMMs run as the server's user (vmm_users = false)");
        return Ok(None);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        tracing::warn!("not root: VMMs run as the server's user");
        return Ok(None);
    }
    let count = siesta_vmm::vmm_users::DEFAULT_UID_COUNT;
    let users = siesta_vmm::VmmUsers::new(config.vmm_uid_base, count).ok_or_else(|| {
        Error::Invalid(format!(
            "vmm_uid_base {}: the {count} uids from there on must lie between 1 and {}",
            config.vmm_uid_base,
            u32::MAX - 1
        ))
    })?;
    let clashes = users.host_ids_in_range();
    if !clashes.is_empty() {
        return Err(Error::Invalid(format!(
            "VMM users would share ids with {}: set vmm_uid_base (SIESTA_VMM_UID_BASE) to a \
             range of {count} ids no user or group of this host has",
            clashes.join(", ")
        )));
    }
    tracing::info!(
        first_uid = config.vmm_uid_base,
        "each VMM runs as a user of its own"
    );
    Ok(Some(users))
}

/// Switches on the host's zero-page merging (see
/// `siesta_vmm::memory_return`). A host that cannot (no KSM, no write access
/// to sysfs) still runs sandboxes; it keeps freed guest memory until a pause,
/// and the warning says so.
fn start_memory_return(config: &NodeConfig) {
    let rate = siesta_vmm::memory_return::ScanRate {
        pages_to_scan: config.ksm_pages_to_scan,
    };
    match siesta_vmm::memory_return::Ksm::host().enable(rate) {
        Ok(()) => tracing::debug!("memory return on (KSM with zero pages)"),
        Err(e) => tracing::warn!(
            "{e}; idle sandboxes keep the memory their guests freed until they are paused"
        ),
    }
}

impl Host {
    /// Starts the node: picks the accelerator, cleans network leftovers of a
    /// crashed run of the same tag and warms the slot pool.
    pub async fn start(config: NodeConfig) -> Result<Self> {
        Self::start_tuned(config, Tuning::default()).await
    }

    /// [`Host::start`] with some optimisations off, for a benchmark to
    /// compare (see [`Tuning`]).
    pub async fn start_tuned(config: NodeConfig, tuning: Tuning) -> Result<Self> {
        let accel = match config.accel {
            AccelSetting::Auto => AccelChoice::Auto,
            AccelSetting::Kvm => AccelChoice::Kvm,
            AccelSetting::Tcg => AccelChoice::Tcg,
        };
        let mut vmm = QemuVmm::new(config.qemu.clone(), accel)
            .map_err(|source| Error::vmm("node", source))?;
        if tuning.incoming_kernel_stub {
            vmm = vmm.with_incoming_kernel_stubs(config.layout().kernel_stubs());
        }
        let cgroups = vmm_cgroups(&config.net_tag);
        if let Some(cgroups) = &cgroups {
            vmm = vmm.with_cgroups(cgroups.clone());
        }
        if let Some(users) = vmm_users(&config)? {
            vmm = vmm.with_vmm_users(users);
        }
        let net = SlotPool::new(NetConfig {
            tag: config.net_tag.clone(),
            subnet: config.net_subnet,
            capacity: config.max_slots,
            warm: config.warm_slots,
            egress_dns: config.egress_dns,
            boundary: config.guest_boundary.clone(),
            ..NetConfig::default()
        })
        .map_err(|source| Error::Net {
            id: "node".into(),
            source,
        })?;
        net.start().await.map_err(|source| Error::Net {
            id: "node".into(),
            source,
        })?;
        if config.memory_return {
            start_memory_return(&config);
        }
        let info = vmm.info();
        tracing::info!(
            vmm = %info.kind, version = %info.version, accelerator = %info.accel,
            "node started"
        );
        let blob_checks = Arc::new(BlobChecks::new(config.layout().verified_blobs()));
        Ok(Self {
            config,
            vmm: Arc::new(vmm),
            net,
            blob_checks,
            tuning,
            cgroups,
        })
    }

    /// Releases every network slot this node created, and the cgroups of
    /// its VMMs that have exited (with their parent, once empty).
    pub async fn shutdown(&self) {
        if let Err(e) = self.net.shutdown().await {
            tracing::warn!("network teardown: {e}");
        }
        if let Some(cgroups) = &self.cgroups {
            cgroups.remove_parent();
        }
    }

    pub fn kernel_cmdline(&self) -> String {
        use siesta_net::layout::{GATEWAY_ADDR, GUEST_ADDR, GUEST_PREFIX};
        let mut line = format!(
            "{CMDLINE_BASE} siesta.ip={GUEST_ADDR}/{GUEST_PREFIX} siesta.gw={GATEWAY_ADDR}"
        );
        if !self.config.kernel_args.is_empty() {
            line.push(' ');
            line.push_str(&self.config.kernel_args);
        }
        line
    }

    /// The kernel command line a template boots with: a sandbox's, plus
    /// `init_on_free=1`, so that the guest kernel zeroes every page it
    /// frees. A pause stores only pages that differ from the template, and
    /// a freed page then holds zeros (a 9-byte record in the state file)
    /// instead of whatever the guest last wrote there: memory a sandbox
    /// freed is not carried by its paused snapshot (`siesta bench pause
    /// --free`, docs/benchmarks.md). The price is paid at boot, where the
    /// kernel zeroes all of RAM as it frees it (4-5 s more under TCG): a
    /// template build pays it once, while a sandbox's own cold boot
    /// (`resume::cold_boot`, whose RAM is saved whole) goes without.
    pub fn template_kernel_cmdline(&self) -> String {
        format!("{} {FREED_PAGES_ZEROED}", self.kernel_cmdline())
    }

    pub async fn acquire_slot(&self, id: &str) -> Result<Slot> {
        self.net.acquire().await.map_err(|source| Error::Net {
            id: id.to_string(),
            source,
        })
    }

    pub async fn release_slot(&self, slot: Slot) {
        let index = slot.index;
        if let Err(e) = self.net.release(slot).await {
            tracing::warn!(slot = index, "releasing network slot: {e}");
        }
    }

    pub fn net_spec(&self, slot: &Slot) -> NetSpec {
        NetSpec {
            netns: Some(slot.netns_path.clone()),
            tap: slot.tap_name.clone(),
            mac: siesta_net::layout::GUEST_MAC.to_string(),
        }
    }

    pub fn agent_addr(slot: &Slot) -> SocketAddr {
        SocketAddr::new(slot.slot_addr.into(), siesta_envd_proto::ENVD_PORT)
    }

    pub fn envd_client(&self, id: &str, slot: &Slot, token: Option<String>) -> EnvdClient {
        EnvdClient::new(id, Self::agent_addr(slot), token)
    }
}
