//! The individual checks of [`super::run`]. Each returns one [`Check`] and
//! never panics on what it finds.

use std::path::{Path, PathBuf};
use std::process::Command;

use siesta_vmm::memory_return::{Ksm, KSM_SYSFS};
use siesta_vmm::qemu::QemuVmm;
use siesta_vmm::{Accel, AccelChoice, Vmm, VmmInfo};

use super::{Check, PreflightOptions};
use crate::config::{AccelSetting, NodeConfig};
use siesta_host::tools::{find_on_path, HostTool};
use siesta_template::Template;

const INSTALL_HINT: &str = "run scripts/install-deps.sh (or apt-get install";

fn missing_tool(tool: &HostTool, detail: impl Into<String>) -> Check {
    Check::fail(
        tool.command,
        detail,
        format!("it {}; {INSTALL_HINT} {})", tool.used_for, tool.package),
    )
}

/// The first line `binary args` prints, or why it could not run.
fn first_line(binary: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(binary)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} exited with {}: {}",
            binary.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// QEMU: found, runs, offers q35. Also returns what a template made on
/// this node records, to compare templates against.
pub(super) fn qemu(config: &NodeConfig) -> (Check, Option<VmmInfo>) {
    let tool = &super::HOST_TOOLS[0];
    let Some(binary) = find_on_path(&config.qemu) else {
        let detail = format!("{} not found on PATH", config.qemu.display());
        return (missing_tool(tool, detail), None);
    };
    match QemuVmm::new(binary.clone(), accel_choice(config.accel)) {
        Ok(vmm) => {
            let info = vmm.info().clone();
            let detail = format!(
                "{} ({}, machine {})",
                info.version,
                binary.display(),
                info.machine
            );
            (Check::ok("qemu", detail), Some(info))
        }
        Err(e) => (missing_tool(tool, e.to_string()), None),
    }
}

/// Any other host tool: on PATH and answering `--version`.
pub(super) fn tool(tool: &HostTool) -> Check {
    let Some(path) = find_on_path(Path::new(tool.command)) else {
        return missing_tool(tool, "not found on PATH");
    };
    let version_args: &[&str] = match tool.command {
        "ip" => &["-V"],
        _ => &["--version"],
    };
    match first_line(&path, version_args) {
        Ok(version) => Check::ok(tool.command, format!("{version} ({})", path.display())),
        Err(e) => missing_tool(tool, e),
    }
}

/// Network namespaces: creates one by a name of its own and removes it.
pub(super) fn netns() -> Check {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Check::fail(
            "netns",
            "not running as root: network namespaces, veth and tap devices need it",
            "run siesta as root",
        );
    }
    let Some(ip) = find_on_path(Path::new("ip")) else {
        return Check::fail("netns", "cannot try: ip is missing", "install iproute2");
    };
    let name = format!("siesta-doctor-{}", std::process::id());
    if let Err(e) = first_line(&ip, &["netns", "add", &name]) {
        return Check::fail(
            "netns",
            e,
            "the kernel must allow network namespaces (CONFIG_NET_NS) and /run/netns must be writable",
        );
    }
    match first_line(&ip, &["netns", "delete", &name]) {
        Ok(_) => Check::ok("netns", "created and removed a network namespace"),
        Err(e) => Check::warn(
            "netns",
            e,
            format!("remove it with `ip netns delete {name}`"),
        ),
    }
}

fn accel_choice(setting: AccelSetting) -> AccelChoice {
    match setting {
        AccelSetting::Auto => AccelChoice::Auto,
        AccelSetting::Kvm => AccelChoice::Kvm,
        AccelSetting::Tcg => AccelChoice::Tcg,
    }
}

/// Which accelerator guests will run under, and why.
pub(super) fn accelerator(config: &NodeConfig) -> Check {
    let kvm_dev = Path::new("/dev/kvm").exists();
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    match (config.accel, Accel::choose(accel_choice(config.accel))) {
        (AccelSetting::Kvm, _) if !kvm_dev => Check::fail(
            "accelerator",
            "SIESTA_ACCEL=kvm but there is no /dev/kvm",
            "unset SIESTA_ACCEL (auto picks TCG here) or load kvm_intel/kvm_amd",
        ),
        (_, Accel::Kvm) => Check::ok("accelerator", "kvm"),
        (AccelSetting::Tcg, Accel::Tcg) => Check::ok("accelerator", "tcg (SIESTA_ACCEL=tcg)"),
        (_, Accel::Tcg) => {
            let why = match (kvm_dev, pvm) {
                (false, _) => "no /dev/kvm",
                (true, true) => "/dev/kvm is PVM, which runs no stock guest kernel",
                (true, false) => "no kvm_intel or kvm_amd module",
            };
            Check::ok("accelerator", format!("tcg, software emulation ({why})"))
        }
    }
}

/// How strongly guests are held: under TCG, QEMU's emulator alone stands
/// between a guest and the host, and QEMU does not treat TCG as a
/// security boundary. A warning, not a failure: the node works, but an
/// operator must know before running tenants who do not trust each other.
pub(super) fn isolation(config: &NodeConfig) -> Check {
    match Accel::choose(accel_choice(config.accel)) {
        Accel::Kvm => Check::ok(
            "isolation",
            "kvm: guests are held by hardware virtualization, QEMU's seccomp filter and cgroups",
        ),
        Accel::Tcg => Check::warn(
            "isolation",
            "tcg: QEMU's software emulator is the only boundary between guests and this host, \
             and QEMU does not treat TCG as a security boundary",
            "run untrusted tenants on a host with KVM; docs/security.md says what else holds a guest",
        ),
    }
}

/// Whether each VMM can get a cgroup of its own (memory, pids and CPU
/// limits). Probes with a parent group of its own, removed at once.
pub(super) fn vmm_cgroups() -> Check {
    match siesta_vmm::Cgroups::detect("siesta-doctor-probe") {
        Ok(Some(c)) => {
            c.remove_parent();
            Check::ok(
                "vmm-cgroups",
                format!(
                    "cgroup {}: each VMM gets memory, pids and CPU limits",
                    c.version()
                ),
            )
        }
        Ok(None) => Check::warn(
            "vmm-cgroups",
            "no writable cgroup hierarchy with memory, pids and cpu: VMMs would run without limits",
            "run siesta as root on a host with cgroup v2 (or v1 memory, pids and cpu) mounted",
        ),
        Err(e) => Check::warn(
            "vmm-cgroups",
            e.to_string(),
            "check /sys/fs/cgroup is mounted read-write",
        ),
    }
}

/// Whether each VMM will run as an unprivileged user of its own, on ids
/// no user or group of the host has.
pub(super) fn vmm_users(config: &NodeConfig) -> Check {
    if !config.vmm_users {
        return Check::warn(
            "vmm-users",
            "vmm_users = false: VMMs run as the server's user",
            "set vmm_users = true (SIESTA_VMM_USERS=1)",
        );
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Check::warn(
            "vmm-users",
            "not root: VMMs would run as the server's user",
            "run siesta as root, so each VMM drops to a user of its own",
        );
    }
    let count = siesta_vmm::vmm_users::DEFAULT_UID_COUNT;
    let Some(users) = siesta_vmm::VmmUsers::new(config.vmm_uid_base, count) else {
        return Check::fail(
            "vmm-users",
            format!(
                "vmm_uid_base {} leaves no room for {count} ids",
                config.vmm_uid_base
            ),
            "set vmm_uid_base to at most 4294901758",
        );
    };
    let clashes = users.host_ids_in_range();
    if !clashes.is_empty() {
        return Check::fail(
            "vmm-users",
            format!("the VMM ids are taken: {}", clashes.join(", ")),
            "set vmm_uid_base (SIESTA_VMM_UID_BASE) to a free range",
        );
    }
    Check::ok(
        "vmm-users",
        format!(
            "each VMM runs as a user of its own (uids {} to {})",
            config.vmm_uid_base,
            config.vmm_uid_base + (count - 1)
        ),
    )
}

/// Kernel and initramfs that template builds boot.
pub(super) fn assets(config: &NodeConfig) -> Check {
    let layout = config.layout();
    let missing: Vec<PathBuf> = [layout.kernel(), layout.initrd()]
        .into_iter()
        .filter(|p| !p.is_file())
        .collect();
    if missing.is_empty() {
        return Check::ok(
            "guest assets",
            layout.home().join("assets").display().to_string(),
        );
    }
    let names: Vec<String> = missing.iter().map(|p| p.display().to_string()).collect();
    Check::warn(
        "guest assets",
        format!("missing {}: no template can be built", names.join(", ")),
        "run `make assets` (guest/build-assets.sh)",
    )
}

/// The default template: present, made by this VMM, with its manifest.
pub(super) fn template(config: &NodeConfig, name: &str, vmm: Option<&VmmInfo>) -> Check {
    let label = "template";
    let rebuild = format!("run `siesta template build {name} --force`");
    let t = match Template::open(&config.layout(), name) {
        Ok(t) => t,
        Err(siesta_template::Error::TemplateNotFound { .. }) => {
            return Check::warn(
                label,
                format!("{name:?} does not exist: creates without a template name fail"),
                format!("run `siesta template build {name}` (make up does)"),
            )
        }
        Err(e) => return Check::warn(label, format!("{name:?}: {e}"), rebuild),
    };
    if let Some(info) = vmm {
        if let Err(e) = t.check_compatible(info) {
            return Check::warn(label, e.to_string(), rebuild);
        }
    }
    if let Err(e) = t.verify_sizes() {
        return Check::warn(label, e.to_string(), rebuild);
    }
    let has_manifest = t.snapshot.as_ref().is_some_and(|s| s.manifest.is_some());
    if !has_manifest {
        return Check::warn(
            label,
            format!("{name:?} has no startup manifest: its resumes are not prefetched"),
            format!("run `siesta template build {name} --if-missing`, which records it"),
        );
    }
    Check::ok(label, format!("{name:?} with startup manifest"))
}

/// Free space where snapshots and disks are written.
pub(super) fn disk(config: &NodeConfig, opts: &PreflightOptions) -> Check {
    let at = existing_ancestor(&config.home);
    let free = match free_bytes(&at) {
        Ok(b) => b,
        Err(e) => {
            return Check::fail(
                "disk",
                format!("statvfs {}: {e}", at.display()),
                "check the path",
            )
        }
    };
    let detail = format!(
        "{:.1} GiB free at {}",
        free as f64 / (1u64 << 30) as f64,
        at.display()
    );
    let fix = "free space there or point SIESTA_HOME at a larger filesystem";
    if free < opts.min_free_bytes {
        Check::fail("disk", detail, fix)
    } else if free < opts.low_free_bytes {
        Check::warn("disk", detail, fix)
    } else {
        Check::ok("disk", detail)
    }
}

fn existing_ancestor(path: &Path) -> PathBuf {
    let mut at = path.to_path_buf();
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p.to_path_buf(),
            None => return PathBuf::from("/"),
        }
    }
    at
}

fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is plain old data, for which all zeroes is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` is written by statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Memory return (`siesta_vmm::memory_return`): KSM is there and this
/// process may switch it on, or already runs with zero pages.
pub(super) fn memory_return(config: &NodeConfig) -> Check {
    const NAME: &str = "memory-return";
    if !config.memory_return {
        return Check::ok(
            NAME,
            "off (memory_return = false): idle sandboxes keep what their guests free until paused",
        );
    }
    let ksm = Ksm::host();
    match ksm.is_enabled() {
        Ok(true) => Check::ok(NAME, "KSM runs with zero pages"),
        Ok(false) if ksm.writable() => Check::ok(
            NAME,
            "KSM is off; the node switches it on at start (run=1, use_zero_pages=1)",
        ),
        Ok(false) => Check::warn(
            NAME,
            format!("KSM is off and {KSM_SYSFS}/run is not writable here"),
            "run as root, or set memory_return = false",
        ),
        Err(e) => Check::warn(
            NAME,
            e.to_string(),
            "idle sandboxes keep what their guests free until paused; a host kernel with CONFIG_KSM returns it",
        ),
    }
}

/// The node's SQLite database: readable and intact, or creatable.
pub(super) fn database(config: &NodeConfig) -> Check {
    let path = config.home.join(crate::store::DB_FILE);
    if !path.exists() {
        return Check::ok(
            "database",
            format!("{} (created on first start)", path.display()),
        );
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let result = rusqlite::Connection::open_with_flags(&path, flags)
        .and_then(|conn| conn.query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0)));
    match result {
        Ok(s) if s == "ok" => Check::ok("database", path.display().to_string()),
        Ok(problem) => Check::fail(
            "database",
            format!("{}: integrity check says {problem}", path.display()),
            "restore it from a backup or move it aside (sandboxes in it are lost)",
        ),
        Err(e) => Check::fail(
            "database",
            format!("{}: {e}", path.display()),
            "check its permissions and that it is an SQLite database",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_home_is_measured_at_its_nearest_existing_parent() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("a/b/c");
        assert_eq!(existing_ancestor(&home), dir.path());
        let mut config = NodeConfig::new(&home);
        config.home = home;
        let check = disk(&config, &PreflightOptions::default());
        assert!(check.detail.contains("GiB free"), "{check:?}");
    }

    #[test]
    fn a_corrupt_database_fails_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(crate::store::DB_FILE), vec![0x5a; 8192]).unwrap();
        let check = database(&NodeConfig::new(dir.path()));
        assert_eq!(check.status, super::super::Status::Fail, "{check:?}");
        assert!(check.detail.contains("siesta.db"), "{check:?}");
    }

    #[test]
    fn a_missing_template_warns_with_the_build_command() {
        let dir = tempfile::tempdir().unwrap();
        let check = template(&NodeConfig::new(dir.path()), "base", None);
        assert_eq!(check.status, super::super::Status::Warn);
        assert!(check.fix.unwrap().contains("siesta template build base"));
    }

    #[test]
    fn a_missing_qemu_names_its_package() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = NodeConfig::new(dir.path());
        config.qemu = dir.path().join("no-qemu");
        let (check, info) = qemu(&config);
        assert!(info.is_none());
        assert_eq!(check.status, super::super::Status::Fail);
        assert!(check.line().contains("qemu-system-x86"), "{}", check.line());
    }
}
