//! Node configuration: one value built at start-up and passed down
//! explicitly (no global settings).

use std::path::PathBuf;
use std::time::Duration;

pub mod file;

/// Which accelerator to use; `Auto` picks KVM only where a guest really runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccelSetting {
    Auto,
    Kvm,
    Tcg,
}

impl std::str::FromStr for AccelSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" | "" => Ok(Self::Auto),
            "kvm" => Ok(Self::Kvm),
            "tcg" => Ok(Self::Tcg),
            other => Err(format!(
                "unknown accelerator {other:?}: use auto, kvm or tcg"
            )),
        }
    }
}

/// Everything the sandbox layer needs to know about this node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Data directory: assets, templates, sandboxes (`SIESTA_HOME`).
    pub home: PathBuf,
    /// The QEMU binary.
    pub qemu: PathBuf,
    pub accel: AccelSetting,
    /// Guest size of new templates.
    pub vcpus: u32,
    pub memory_mib: u32,
    /// Pre-spawned VMM processes kept per template.
    pub pool_size: usize,
    /// Network slots created ahead of time.
    pub warm_slots: usize,
    /// Most sandboxes (network slots) at once.
    pub max_slots: usize,
    /// Tag of this instance's network namespaces (`siesta-<tag>-<n>`); tests
    /// use their own so they never touch a running server's slots.
    pub net_tag: String,
    /// The /16 (or other) the slots' addresses come from; two instances on
    /// one host need different ones (`SIESTA_NET_SUBNET`, default
    /// 10.250.0.0/16).
    pub net_subnet: siesta_net::Subnet,
    /// Extra kernel command-line arguments for templates built on this node
    /// (debugging; e.g. `siesta.init=/bin/sh`).
    pub kernel_args: String,
    /// How long a guest may take to answer `/health` after a resume.
    pub resume_ready_timeout: Duration,
    /// How long a cold boot may take to answer `/health`.
    pub boot_ready_timeout: Duration,
    /// Record a startup manifest after a template is published
    /// (`SIESTA_RECORD_MANIFEST=0|1`).
    pub record_manifest: bool,
    /// Prefetch a snapshot's startup manifest while it resumes
    /// (`SIESTA_PREFETCH=0|1`). See `docs/benchmarks.md` for why it is on.
    pub prefetch: bool,
    /// Widen the prefetched ranges to aligned blocks of this many KiB
    /// (`SIESTA_PREFETCH_PAD_KIB`, default 64; 0 reads exactly the recorded
    /// pages). See `docs/benchmarks.md` for the measurement behind it.
    pub prefetch_pad_kib: u64,
    /// Populate a pooled VMM's guest memory when it is spawned
    /// (`SIESTA_PREALLOC=0|1`, default off: it makes resumes faster but
    /// costs each VM a private copy of the template memory instead of a
    /// shared page cache; see `docs/benchmarks.md`).
    pub prealloc_memory: bool,
    /// Give the host back the memory idle guests free, by switching on the
    /// kernel's same-page merging with zero pages (`SIESTA_MEMORY_RETURN=0|1`,
    /// default on; `siesta_vmm::memory_return`). Host-wide, left on at exit.
    pub memory_return: bool,
    /// Run every VMM as an unprivileged user of its own
    /// (`SIESTA_VMM_USERS=0|1`, default on; only a server running as root
    /// can). See `siesta_vmm::vmm_users`.
    pub vmm_users: bool,
    /// The first uid VMM users are drawn from (`SIESTA_VMM_UID_BASE`,
    /// default 1900000000); 65536 uids from there on must belong to no one.
    pub vmm_uid_base: u32,
    /// KSM's `pages_to_scan` to set with it (`SIESTA_KSM_PAGES_TO_SCAN`;
    /// unset keeps the host's, 100 pages every 20 ms on a stock kernel).
    pub ksm_pages_to_scan: Option<u32>,
    /// Registries (`host` or `host:port`) that image builds reach over plain
    /// HTTP (`SIESTA_INSECURE_REGISTRIES`, comma-separated); loopback ones
    /// always are.
    pub insecure_registries: Vec<String>,
    /// Private networks (loopback, RFC 1918, CGNAT, ULA, ...) that image
    /// builds asked for through the API may pull from
    /// (`[node] image_registry_private_allow`,
    /// `SIESTA_IMAGE_REGISTRY_PRIVATE_ALLOW`, comma-separated; default
    /// none). Builds the operator starts on the host reach any registry.
    pub image_registry_private_allow: Vec<siesta_image::IpNet>,
    /// Most MiB of one layer an image build pulls
    /// (`SIESTA_IMAGE_MAX_LAYER_MIB`, default 16384).
    pub image_max_layer_mib: u64,
    /// Most MiB the layers of one image unpack to, together
    /// (`SIESTA_IMAGE_MAX_UNPACKED_MIB`, default 16384).
    pub image_max_unpacked_mib: u64,
    /// Most files, directories and links in the layers of one image
    /// (`SIESTA_IMAGE_MAX_ENTRIES`, default 1000000).
    pub image_max_entries: u64,
    /// Most MiB the template builds' step cache keeps
    /// (`SIESTA_STEP_CACHE_MIB`, default 16384); the least recently used
    /// layers go first.
    pub step_cache_mib: u64,
    /// Most MiB the templates and snapshots fetched from the object store
    /// take locally (`SIESTA_FETCH_CACHE_MIB`, default 20480); the least
    /// recently used ones nothing needs go first (`fetch_cache.rs`).
    pub fetch_cache_mib: u64,
    /// Serve a template fetched from the object store before it is whole
    /// (`SIESTA_LAZY_FETCH=0|1`, default on; `siesta_tier::lazy`).
    pub lazy_fetch: bool,
    /// Where sandbox directories go instead of `$SIESTA_HOME/sandboxes`:
    /// set for a manager that is not the server (`siesta bench` uses
    /// `$SIESTA_HOME/ephemeral/<tag>-<pid>`), which a server starting
    /// meanwhile must not take for its own leftovers.
    pub sandbox_root: Option<PathBuf>,
    /// The name server (`ADDR` or `ADDR:PORT`) the egress proxy resolves
    /// the domains of `allowOut` rules with (`SIESTA_EGRESS_DNS`; unset:
    /// the host's resolver).
    pub egress_dns: Option<std::net::SocketAddr>,
    /// What guests never reach (the node's network, metadata, the host,
    /// every slot), less the private networks the operator opened in
    /// `[node] guest_private_allow` (docs/security.md).
    pub guest_boundary: siesta_net::Boundary,
}

impl NodeConfig {
    /// Makes this the configuration of an instance that runs beside a
    /// server on the same host (a bench, a local template build): network
    /// tag `tag` and, while the subnet is still the default one a server
    /// uses, `subnet`, so that their slots never share addresses (a node
    /// refuses a subnet another instance's slots are in).
    pub fn beside_server(&mut self, tag: &str, subnet: siesta_net::Subnet) {
        self.net_tag = tag.into();
        if self.net_subnet == siesta_net::Subnet::default() {
            self.net_subnet = subnet;
        }
    }

    /// Defaults for a data directory.
    pub fn new(home: impl Into<PathBuf>) -> Self {
        Self {
            home: home.into(),
            qemu: PathBuf::from("qemu-system-x86_64"),
            accel: AccelSetting::Auto,
            vcpus: 1,
            memory_mib: 512,
            pool_size: 1,
            warm_slots: 2,
            max_slots: 256,
            net_tag: "s".to_string(),
            net_subnet: siesta_net::Subnet::default(),
            kernel_args: String::new(),
            resume_ready_timeout: Duration::from_secs(30),
            boot_ready_timeout: Duration::from_secs(180),
            record_manifest: true,
            prefetch: true,
            prefetch_pad_kib: 64,
            prealloc_memory: false,
            memory_return: true,
            vmm_users: true,
            vmm_uid_base: siesta_vmm::vmm_users::DEFAULT_UID_BASE,
            ksm_pages_to_scan: None,
            insecure_registries: Vec::new(),
            image_registry_private_allow: Vec::new(),
            image_max_layer_mib: siesta_image::ImageLimits::DEFAULT.max_layer_bytes >> 20,
            image_max_unpacked_mib: siesta_image::ImageLimits::DEFAULT.max_unpacked_bytes >> 20,
            image_max_entries: siesta_image::ImageLimits::DEFAULT.max_entries,
            step_cache_mib: 16 << 10,
            fetch_cache_mib: 20 << 10,
            lazy_fetch: true,
            sandbox_root: None,
            egress_dns: None,
            guest_boundary: siesta_net::Boundary::default(),
        }
    }

    /// Reads `SIESTA_HOME` (default `/var/lib/siesta`), then the
    /// configuration file (`siesta.toml`, [`file`]), then the
    /// environment (`SIESTA_ACCEL`, `SIESTA_NET_TAG`, `SIESTA_NET_SUBNET`,
    /// ...), each overriding the one before.
    pub fn from_env() -> Result<Self, String> {
        let home = home_from_env();
        let mut config = Self::new(&home);
        // The file first: the environment overrides it.
        file::ConfigFile::load(&home)?.apply(&mut config)?;
        crate::tuning::check_variables(|var| std::env::var_os(var).is_some())?;
        if let Ok(accel) = std::env::var("SIESTA_ACCEL") {
            config.accel = accel.parse()?;
        }
        if let Ok(tag) = std::env::var("SIESTA_NET_TAG") {
            siesta_net::Tag::new(&tag).map_err(|e| format!("SIESTA_NET_TAG: {e}"))?;
            config.net_tag = tag;
        }
        if let Ok(subnet) = std::env::var("SIESTA_NET_SUBNET") {
            config.net_subnet = subnet
                .parse()
                .map_err(|e| format!("SIESTA_NET_SUBNET: {e}"))?;
        }
        if let Some(qemu) = std::env::var_os("SIESTA_QEMU") {
            config.qemu = PathBuf::from(qemu);
        }
        if let Some(on) = env_flag("SIESTA_RECORD_MANIFEST")? {
            config.record_manifest = on;
        }
        if let Some(on) = env_flag("SIESTA_PREFETCH")? {
            config.prefetch = on;
        }
        if let Ok(kib) = std::env::var("SIESTA_PREFETCH_PAD_KIB") {
            config.prefetch_pad_kib = kib
                .parse()
                .map_err(|e| format!("SIESTA_PREFETCH_PAD_KIB={kib:?}: {e}"))?;
        }
        if let Ok(list) = std::env::var("SIESTA_INSECURE_REGISTRIES") {
            config.insecure_registries = list
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(str::to_string)
                .collect();
        }
        if let Ok(list) = std::env::var(siesta_image::ALLOW_ENV) {
            config.image_registry_private_allow = registry_private_allow(list.split(','))
                .map_err(|e| format!("{}: {e}", siesta_image::ALLOW_ENV))?;
        }
        for (name, field) in [
            (
                "SIESTA_IMAGE_MAX_LAYER_MIB",
                &mut config.image_max_layer_mib,
            ),
            (
                "SIESTA_IMAGE_MAX_UNPACKED_MIB",
                &mut config.image_max_unpacked_mib,
            ),
            ("SIESTA_IMAGE_MAX_ENTRIES", &mut config.image_max_entries),
        ] {
            if let Ok(v) = std::env::var(name) {
                *field = v.parse().map_err(|e| format!("{name}={v:?}: {e}"))?;
            }
        }
        if let Ok(mib) = std::env::var("SIESTA_STEP_CACHE_MIB") {
            config.step_cache_mib = mib
                .parse()
                .map_err(|e| format!("SIESTA_STEP_CACHE_MIB={mib:?}: {e}"))?;
        }
        if let Ok(mib) = std::env::var("SIESTA_FETCH_CACHE_MIB") {
            config.fetch_cache_mib = mib
                .parse()
                .map_err(|e| format!("SIESTA_FETCH_CACHE_MIB={mib:?}: {e}"))?;
        }
        if let Some(on) = env_flag("SIESTA_LAZY_FETCH")? {
            config.lazy_fetch = on;
        }
        if let Some(on) = env_flag("SIESTA_PREALLOC")? {
            config.prealloc_memory = on;
        }
        if let Some(on) = env_flag("SIESTA_MEMORY_RETURN")? {
            config.memory_return = on;
        }
        if let Some(on) = env_flag("SIESTA_VMM_USERS")? {
            config.vmm_users = on;
        }
        if let Ok(base) = std::env::var("SIESTA_VMM_UID_BASE") {
            config.vmm_uid_base = base
                .parse()
                .map_err(|e| format!("SIESTA_VMM_UID_BASE={base:?}: {e}"))?;
        }
        if let Ok(pages) = std::env::var("SIESTA_KSM_PAGES_TO_SCAN") {
            config.ksm_pages_to_scan = Some(
                pages
                    .parse()
                    .map_err(|e| format!("SIESTA_KSM_PAGES_TO_SCAN={pages:?}: {e}"))?,
            );
        }
        if let Ok(dns) = std::env::var("SIESTA_EGRESS_DNS") {
            config.egress_dns =
                Some(parse_dns(&dns).map_err(|e| format!("SIESTA_EGRESS_DNS: {e}"))?);
        }
        Ok(config)
    }

    /// The caps image builds pull and unpack within (docs/templates.md);
    /// the 4 MiB cap on manifests and configs is fixed.
    pub fn image_limits(&self) -> siesta_image::ImageLimits {
        siesta_image::ImageLimits {
            max_layer_bytes: self.image_max_layer_mib.saturating_mul(1 << 20),
            max_unpacked_bytes: self.image_max_unpacked_mib.saturating_mul(1 << 20),
            max_entries: self.image_max_entries,
            ..siesta_image::ImageLimits::DEFAULT
        }
    }

    /// Where the pull of an image build asked for through the API may
    /// connect: public addresses, and the networks of
    /// `image_registry_private_allow` (docs/security.md, M7).
    pub fn api_image_reach(&self) -> siesta_image::Reach {
        siesta_image::Reach::Public {
            allow: self.image_registry_private_allow.clone(),
        }
    }

    pub fn layout(&self) -> crate::layout::Layout {
        let layout = crate::layout::Layout::new(&self.home);
        match &self.sandbox_root {
            Some(dir) => layout.with_sandboxes(dir.clone()),
            None => layout,
        }
    }
}

/// The data directory: `SIESTA_HOME`, default `/var/lib/siesta`.
pub fn home_from_env() -> PathBuf {
    std::env::var_os("SIESTA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/siesta"))
}

/// A name server: `ADDR` (port 53) or `ADDR:PORT`.
pub fn parse_dns(s: &str) -> Result<std::net::SocketAddr, String> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok(std::net::SocketAddr::new(ip, 53));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not an address or address:port"))
}

/// The networks of `image_registry_private_allow` (CIDRs or single
/// addresses; blanks skipped), checked as `siesta_image::Reach::public`
/// checks them (no link-local space).
pub fn registry_private_allow<'a>(
    nets: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<siesta_image::IpNet>, String> {
    let nets = nets
        .into_iter()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<siesta_image::IpNet>, String>>()?;
    siesta_image::Reach::public(nets.clone())?;
    Ok(nets)
}

/// `0` or `1` from the environment; unset is `None`.
fn env_flag(name: &str) -> Result<Option<bool>, String> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => match v.trim() {
            "1" | "true" | "on" => Ok(Some(true)),
            "0" | "false" | "off" => Ok(Some(false)),
            other => Err(format!("{name}={other:?}: use 0 or 1")),
        },
    }
}
