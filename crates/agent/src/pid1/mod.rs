//! Running as the guest's init (PID 1).
//!
//! The guest kernel starts the agent directly (or an initramfs execs it), so
//! the agent does what an init must: mount the API filesystems, name the
//! host, configure the network from the kernel command line, reap orphans
//! ([`crate::reaper`]) and power the VM off cleanly on SIGTERM/SIGINT. It
//! never exits: PID 1 exiting panics the kernel.

pub mod cmdline;
pub mod net;

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::{mount, MsFlags};

use cmdline::BootConfig;

/// How long processes get between SIGTERM and SIGKILL at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Whether the agent should act as init: asked to (`--init`) or it is PID 1.
pub fn should_run(flag: bool) -> bool {
    flag || std::process::id() == 1
}

/// Boots the guest, then runs `serve` (the agent's server) on a fresh tokio
/// runtime with the reaper and the shutdown handler installed. `main` passes
/// a closure that binds the listener and serves; it is a closure so this
/// module does not depend on how the server is assembled.
pub fn run<F, Fut>(serve: F) -> !
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let cfg = boot();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            power_off();
        }
    };
    rt.block_on(async move {
        if let Err(e) = crate::reaper::start() {
            tracing::error!("cannot install the SIGCHLD reaper: {e}");
        }
        tokio::spawn(shutdown_on_signal());
        tracing::info!(hostname = %cfg.hostname, "init done; serving");
        if let Err(e) = serve().await {
            tracing::error!("agent server stopped: {e:#}");
        }
        // The server ended; stay alive for the reaper and the shutdown
        // signal, as init must.
        std::future::pending::<()>().await;
    });
    power_off()
}

/// Mounts, hostname and network. Every step logs and goes on when it fails:
/// a half-configured guest is still reachable on its console.
pub fn boot() -> BootConfig {
    mount_api_filesystems();
    prepare_tmp();
    let cfg = cmdline::parse(&std::fs::read_to_string("/proc/cmdline").unwrap_or_default());
    if let Err(e) = nix::unistd::sethostname(&cfg.hostname) {
        tracing::warn!("cannot set hostname {}: {e}", cfg.hostname);
    }
    configure_network(&cfg);
    cfg
}

fn mount_api_filesystems() {
    // (source, target, fstype, flags, data)
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let table: &[(&str, &str, &str, MsFlags, Option<&str>)] = &[
        (
            "proc",
            "/proc",
            "proc",
            nosuid_nodev | MsFlags::MS_NOEXEC,
            None,
        ),
        (
            "sysfs",
            "/sys",
            "sysfs",
            nosuid_nodev | MsFlags::MS_NOEXEC,
            None,
        ),
        (
            "devtmpfs",
            "/dev",
            "devtmpfs",
            MsFlags::MS_NOSUID,
            Some("mode=0755"),
        ),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("gid=5,mode=0620,ptmxmode=0666"),
        ),
        ("shm", "/dev/shm", "tmpfs", nosuid_nodev, Some("mode=1777")),
        ("run", "/run", "tmpfs", nosuid_nodev, Some("mode=0755")),
    ];
    for (source, target, fstype, flags, data) in table {
        // Read the mount table afresh: /proc itself is the first mount.
        if is_mounted(target) {
            continue;
        }
        if let Err(e) = std::fs::create_dir_all(target) {
            tracing::warn!("cannot create {target}: {e}");
            continue;
        }
        match mount(Some(*source), *target, Some(*fstype), *flags, *data) {
            Ok(()) => {}
            // Mounted by an initramfs before /proc showed it.
            Err(nix::errno::Errno::EBUSY) => {}
            Err(e) => tracing::warn!("cannot mount {fstype} on {target}: {e}"),
        }
    }
    // Programs open /dev/ptmx; with a private devpts it must point there.
    if !Path::new("/dev/ptmx").exists() {
        let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    }
}

/// `/tmp` is a directory of the root disk, as in E2B's guests, not a tmpfs:
/// what a template's build step leaves there is part of the disk the step
/// cache keeps, so a cached rebuild gives the same template as a fresh one,
/// and it outlives a disk-only pause. An image may lack it or have it
/// without the sticky, world-writable mode every user needs.
fn prepare_tmp() {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::create_dir_all("/tmp") {
        tracing::warn!("cannot create /tmp: {e}");
        return;
    }
    if let Err(e) = std::fs::set_permissions("/tmp", std::fs::Permissions::from_mode(0o1777)) {
        tracing::warn!("cannot make /tmp sticky and world-writable: {e}");
    }
}

fn is_mounted(target: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(target))
        })
        .unwrap_or(false)
}

fn configure_network(cfg: &BootConfig) {
    if let Err(e) = net::link_up(c"lo") {
        tracing::warn!("cannot bring lo up: {e}");
    }
    let Some((addr, prefix)) = cfg.ip else {
        tracing::info!("no siesta.ip on the kernel command line; eth0 left unconfigured");
        return;
    };
    let step = || -> std::io::Result<()> {
        net::set_address(c"eth0", addr, cmdline::netmask(prefix))?;
        net::link_up(c"eth0")?;
        if let Some(gw) = cfg.gateway {
            net::add_default_route(gw)?;
        }
        Ok(())
    };
    if let Err(e) = step() {
        tracing::warn!("cannot configure eth0 as {addr}/{prefix}: {e}");
    }
    if !cfg.dns.is_empty() {
        if let Err(e) = std::fs::write("/etc/resolv.conf", cmdline::resolv_conf(&cfg.dns)) {
            tracing::warn!("cannot write /etc/resolv.conf: {e}");
        }
    }
}

async fn shutdown_on_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install shutdown signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
    // Blocking on purpose: nothing else should run now.
    let _ = tokio::task::spawn_blocking(|| {
        terminate_all();
        power_off()
    })
    .await;
}

/// SIGTERM to every process, up to [`SHUTDOWN_GRACE`] for them to go, then
/// SIGKILL. `kill(-1, ...)` from PID 1 reaches every process but itself.
fn terminate_all() {
    // SAFETY: plain syscalls.
    unsafe { libc::kill(-1, libc::SIGTERM) };
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    while Instant::now() < deadline {
        // kill(-1, 0) fails with ESRCH once no process is left to signal.
        // SAFETY: signal 0 only checks.
        if unsafe { libc::kill(-1, 0) } != 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    unsafe { libc::kill(-1, libc::SIGKILL) };
}

/// Flushes the disks and powers the VM off. Never returns.
pub fn power_off() -> ! {
    nix::unistd::sync();
    // reboot() only returns on failure (Result<Infallible, _>).
    let err = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF).err();
    tracing::error!("power off failed: {err:?}");
    // Not PID 1 (or not allowed): exiting is the best we can do.
    std::process::exit(0)
}
