//! The QEMU backend: one `qemu-system-x86_64` process per VM, driven over QMP.
//!
//! Snapshots are QEMU migration streams written to and read from a file
//! descriptor handed over with `getfd` (faster than `exec:cat`: 8-16 ms
//! instead of 26-40 ms to load under TCG). With RAM in a shared backing file,
//! `x-ignore-shared` keeps it out of the stream, so a template's state file
//! is device state only.

pub mod changed_pages;
pub mod cmdline;
pub mod kernel_stub;

mod hashing_writer;
pub mod process;
pub mod qmp;
pub mod ram_frame;
pub mod serial_cap;
pub mod stream;

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;

use crate::{
    Accel, AccelChoice, CgroupLimits, Cgroups, DiskSpec, LaunchMode, LaunchSpec, MemorySave,
    RestoreInfo, SaveInfo, StateWrite, VmInstance, Vmm, VmmError, VmmInfo, VmmUsers,
};
use process::QemuProcess;
use qmp::{QmpClient, QmpError};

/// From spawn to a connectable QMP socket (53 ms measured; generous for a
/// loaded 2-core machine).
const QMP_READY_TIMEOUT: Duration = Duration::from_secs(15);
/// One QMP command; none of ours blocks inside QEMU for long.
const QMP_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// A whole save or load; an InState stream of several GiB on a slow disk
/// takes a while.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);
/// Grace between `quit` and SIGKILL.
const QUIT_GRACE: Duration = Duration::from_secs(2);
/// QEMU's default max-bandwidth (128 MiB/s) throttles a save to a file; the
/// VM is stopped, so nothing competes with it: 100 GiB/s.
const SAVE_MAX_BANDWIDTH: u64 = 100 << 30;
/// With the VM stopped the downtime estimate is meaningless; a high limit
/// keeps QEMU from iterating.
const SAVE_DOWNTIME_LIMIT_MS: u64 = 100_000;

pub(crate) const X_IGNORE_SHARED: &str = "x-ignore-shared";
/// The migration capability that has QEMU send `MIGRATION` events.
const EVENTS: &str = "events";

/// The QEMU backend.
pub struct QemuVmm {
    binary: PathBuf,
    info: VmmInfo,
    /// Where incoming launches get their stand-in kernels; `None` loads
    /// the whole kernel and initrd (see [`kernel_stub`]).
    kernel_stubs: Option<kernel_stub::KernelStubs>,
    /// Where each VMM gets a cgroup of its own with limits; `None`: the
    /// host offers no cgroup hierarchy this process may use.
    cgroups: Option<Cgroups>,
    /// Where each VMM's unprivileged user comes from; `None`: VMMs stay the
    /// server's user (a server not running as root cannot change users).
    users: Option<Arc<VmmUsers>>,
}

impl QemuVmm {
    /// Asks `binary` for its version and the versioned name of `q35`, and
    /// settles the accelerator.
    pub fn new(binary: PathBuf, accel: AccelChoice) -> Result<Self, VmmError> {
        let version = run_for_output(&binary, &["--version"])?
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        if version.is_empty() {
            return Err(VmmError::Binary {
                binary,
                detail: "`--version` printed nothing".into(),
            });
        }
        let machines = run_for_output(&binary, &["-machine", "help"])?;
        let machine = resolve_alias(&machines, "q35").ok_or_else(|| VmmError::Binary {
            binary: binary.clone(),
            detail: "offers no q35 machine type".into(),
        })?;
        let accel = Accel::choose(accel);
        tracing::info!(binary = %binary.display(), %version, %machine, %accel, "QEMU backend");
        Ok(QemuVmm {
            binary,
            info: VmmInfo {
                kind: "qemu".into(),
                version,
                machine,
                accel,
                devices: crate::info::DEVICE_SET,
            },
            kernel_stubs: None,
            cgroups: None,
            users: None,
        })
    }

    /// Incoming launches load a stand-in of the guest kernel, kept in
    /// `dir`, and no initrd (see [`kernel_stub`]).
    /// Runs every VMM in a cgroup of its own under `cgroups`, limited by
    /// [`CgroupLimits::for_vm`] of its size.
    pub fn with_cgroups(mut self, cgroups: Cgroups) -> Self {
        self.cgroups = Some(cgroups);
        self
    }

    /// Runs every VMM as a user of its own from `users` (see
    /// [`crate::vmm_users`]).
    pub fn with_vmm_users(mut self, users: Arc<VmmUsers>) -> Self {
        self.users = Some(users);
        self
    }

    pub fn with_incoming_kernel_stubs(mut self, dir: PathBuf) -> Self {
        self.kernel_stubs = Some(kernel_stub::KernelStubs::new(dir));
        self
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// `spec` as QEMU is started with it: an incoming launch with stubs
    /// configured loads the stand-in. A kernel that cannot be stood in for
    /// is loaded whole (QEMU then reports a missing one in its own words).
    fn launched_spec<'a>(&self, spec: &'a LaunchSpec) -> std::borrow::Cow<'a, LaunchSpec> {
        let Some(stubs) = &self.kernel_stubs else {
            return std::borrow::Cow::Borrowed(spec);
        };
        if spec.mode != LaunchMode::Incoming {
            return std::borrow::Cow::Borrowed(spec);
        }
        match stubs.for_kernel(&spec.kernel) {
            Ok(stub) => std::borrow::Cow::Owned(LaunchSpec {
                kernel: stub,
                initrd: None,
                ..spec.clone()
            }),
            Err(e) => {
                tracing::warn!(vm = %spec.id, "loading the whole guest kernel: {e}");
                std::borrow::Cow::Borrowed(spec)
            }
        }
    }
}

fn run_for_output(binary: &Path, args: &[&str]) -> Result<String, VmmError> {
    let out = Command::new(binary)
        .args(args)
        .output()
        .map_err(|e| VmmError::Binary {
            binary: binary.to_path_buf(),
            detail: format!("cannot run with {args:?}: {e}"),
        })?;
    if !out.status.success() {
        return Err(VmmError::Binary {
            binary: binary.to_path_buf(),
            detail: format!(
                "{args:?} failed ({}): {}",
                process::describe_status(out.status),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// In `-machine help` output, the machine an alias stands for:
/// `q35   Standard PC (Q35 + ICH9, 2009) (alias of pc-q35-7.2)`.
/// A name that is not an alias stands for itself.
fn resolve_alias(help: &str, alias: &str) -> Option<String> {
    let line = help
        .lines()
        .find(|l| l.split_whitespace().next() == Some(alias))?;
    match line.rfind("(alias of ") {
        Some(i) => line[i + "(alias of ".len()..]
            .split(')')
            .next()
            .map(|s| s.trim().to_string()),
        None => Some(alias.to_string()),
    }
}

#[async_trait]
impl Vmm for QemuVmm {
    fn info(&self) -> &VmmInfo {
        &self.info
    }

    async fn spawn(&self, spec: &LaunchSpec) -> Result<Box<dyn VmInstance>, VmmError> {
        spec.validate()?;
        if let Some(disk) = &spec.disk {
            // QEMU opens these by path as root, before it drops to its user.
            disk.check_images()
                .map_err(|detail| VmmError::InvalidSpec {
                    id: spec.id.clone(),
                    detail,
                })?;
        }
        let io = |op, path: &Path, source| VmmError::Io {
            id: spec.id.clone(),
            op,
            path: path.to_path_buf(),
            source,
        };
        if spec.mode == LaunchMode::Incoming && !spec.memory.shared {
            // QEMU would create a missing file and restore over zeroes.
            let want = spec.memory_mib << 20;
            let len = std::fs::metadata(&spec.memory.path)
                .map_err(|e| io("stat memory file", &spec.memory.path, e))?
                .len();
            if len != want {
                return Err(VmmError::InvalidSpec {
                    id: spec.id.clone(),
                    detail: format!(
                        "memory file {} is {len} bytes, expected {want} ({} MiB)",
                        spec.memory.path.display(),
                        spec.memory_mib
                    ),
                });
            }
        }
        std::fs::create_dir_all(&spec.run_dir)
            .map_err(|e| io("create run directory", &spec.run_dir, e))?;
        let sock = spec.control_socket_path();
        match std::fs::remove_file(&sock) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove stale QMP socket", &sock, e)),
        }
        let user = match &self.users {
            Some(users) => Some(users.take().map_err(|detail| VmmError::InvalidSpec {
                id: spec.id.clone(),
                detail,
            })?),
            None => None,
        };
        let argv = cmdline::build_argv(
            &self.launched_spec(spec),
            self.info.accel,
            &self.info.machine,
            user.as_ref().map(|u| u.run_as()).as_ref(),
        );
        tracing::debug!(vm = %spec.id, ?argv, "spawning QEMU");
        let netns = spec.net.as_ref().and_then(|n| n.netns.as_deref());
        let cgroup = match &self.cgroups {
            Some(c) => {
                Some(c.create(&spec.id, &CgroupLimits::for_vm(spec.memory_mib, spec.vcpus))?)
            }
            None => None,
        };
        let mut process = QemuProcess::spawn(
            &spec.id,
            &self.binary,
            &argv,
            netns,
            &spec.vmm_log_path(),
            cgroup,
            user,
        )?;
        let stream = process.connect(&sock, QMP_READY_TIMEOUT).await?;
        let qmp = match QmpClient::handshake(stream, QMP_COMMAND_TIMEOUT).await {
            Ok(q) => q,
            Err(source) => {
                let exited = process
                    .wait_exit(Duration::from_millis(200))
                    .await
                    .is_some();
                let err = if exited {
                    process.exited_error("QMP handshake")
                } else {
                    VmmError::Qmp {
                        id: spec.id.clone(),
                        command: "qmp_capabilities".into(),
                        source,
                    }
                };
                process.kill_and_reap().await;
                return Err(err);
            }
        };
        let mut vm = QemuInstance {
            spec: spec.clone(),
            machine: self.info.machine.clone(),
            process,
            qmp,
            started: false,
            gone: false,
            image_nodes: 1,
            ignore_shared: None,
            _serial_cap: spec
                .serial_log
                .then(|| serial_cap::watch(spec.serial_log_path(), serial_cap::SERIAL_LOG_CAP)),
        };
        if spec.mode == LaunchMode::Incoming {
            // Ahead of the restore, which then skips the command when the
            // state file asks for the same: 0.6-1 ms off a pooled VMM's
            // critical path. (On error `vm` is dropped: its QEMU is killed.)
            vm.set_migration_capabilities(true).await?;
        }
        Ok(Box::new(vm))
    }
}

pub struct QemuInstance {
    spec: LaunchSpec,
    machine: String,
    process: QemuProcess,
    qmp: QmpClient,
    /// `boot` or `restore` has run (each may run once).
    started: bool,
    /// Shut down, or killed after a failed restore.
    gone: bool,
    /// Image nodes created so far (see [`disk`]): the current one is
    /// `disk::image_node_name(image_nodes - 1)`.
    image_nodes: u32,
    /// What `x-ignore-shared` was last set to (with `events` on), if set.
    ignore_shared: Option<bool>,
    /// Keeps the console log bounded while the VM lives.
    _serial_cap: Option<serial_cap::Watch>,
}

/// Runs a QMP call; on failure returns the error from the enclosing
/// function, turned into "QEMU exited" (with its log) if the process is gone.
macro_rules! qmp {
    ($self:ident, $cmd:expr, $call:expr) => {
        match $call.await {
            Ok(v) => v,
            Err(e) => return Err($self.qmp_error($cmd, e).await),
        }
    };
}

mod disk;
mod fdset;
mod save_changed;
mod write_behind;

impl QemuInstance {
    async fn qmp_error(&mut self, command: &str, e: QmpError) -> VmmError {
        if e.is_disconnect() || matches!(e, QmpError::Timeout(_)) {
            // The socket closes while the kernel tears the process down; give
            // it a moment to become reapable so the error can say why.
            if self
                .process
                .wait_exit(Duration::from_millis(500))
                .await
                .is_some()
            {
                return self.process.exited_error(&format!("QMP {command}"));
            }
        }
        VmmError::Qmp {
            id: self.spec.id.clone(),
            command: command.to_string(),
            source: e,
        }
    }

    fn check_usable(&mut self, op: &'static str) -> Result<(), VmmError> {
        if self.gone {
            return Err(self.invalid(op, "the VM was shut down".into()));
        }
        if self.process.try_exit().is_some() {
            return Err(self.process.exited_error(op));
        }
        Ok(())
    }

    fn invalid(&self, op: &'static str, detail: String) -> VmmError {
        VmmError::InvalidOperation {
            id: self.spec.id.clone(),
            op,
            detail,
        }
    }

    fn io(&self, op: &'static str, path: &Path, source: std::io::Error) -> VmmError {
        VmmError::Io {
            id: self.spec.id.clone(),
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// Sets `x-ignore-shared` as asked and `events` on (restores wait for
    /// the `MIGRATION` event).
    async fn set_migration_capabilities(&mut self, ignore_shared: bool) -> Result<(), VmmError> {
        qmp!(
            self,
            "migrate-set-capabilities",
            self.qmp
                .set_capabilities(&[(X_IGNORE_SHARED, ignore_shared), (EVENTS, true)])
        );
        self.ignore_shared = Some(ignore_shared);
        Ok(())
    }

    /// Polls `query-migrate` until the migration completes or fails.
    async fn wait_migration(&mut self, op: &'static str, path: &Path) -> Result<(), VmmError> {
        let start = Instant::now();
        let mut delay = Duration::from_micros(500);
        loop {
            let info = qmp!(self, "query-migrate", self.qmp.query_migrate());
            match info.status.as_deref() {
                Some("completed") => return Ok(()),
                Some(s @ ("failed" | "cancelled")) => {
                    return Err(VmmError::Migration {
                        id: self.spec.id.clone(),
                        op,
                        path: path.to_path_buf(),
                        status: s.to_string(),
                        detail: info
                            .error_desc
                            .unwrap_or_else(|| "QEMU gave no error-desc".into()),
                    })
                }
                _ => {}
            }
            if start.elapsed() > MIGRATION_TIMEOUT {
                return Err(VmmError::Timeout {
                    id: self.spec.id.clone(),
                    what: format!(
                        "{op} of {} (migration status {:?})",
                        path.display(),
                        info.status
                    ),
                    after: MIGRATION_TIMEOUT,
                });
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(10));
        }
    }

    /// Waits for an incoming migration to end, told by QEMU's `MIGRATION`
    /// event rather than found by polling `query-migrate`: at growing
    /// intervals, polling saw a 5-8 ms load up to 7 ms late. A failed one
    /// is then asked why (or QEMU has exited, and its log says).
    async fn wait_incoming(&mut self, state: &Path) -> Result<(), VmmError> {
        let ended = |e: &qmp::QmpEvent| {
            e.event == "MIGRATION"
                && matches!(
                    e.data["status"].as_str(),
                    Some("completed" | "failed" | "cancelled")
                )
        };
        let event = qmp!(
            self,
            "MIGRATION event",
            self.qmp.wait_event(ended, MIGRATION_TIMEOUT)
        );
        if event.data["status"] == "completed" {
            return Ok(());
        }
        self.wait_migration("restore", state).await
    }

    async fn restore_inner(&mut self, state: &Path) -> Result<RestoreInfo, VmmError> {
        let t0 = Instant::now();
        let file = File::open(state).map_err(|e| self.io("open state file", state, e))?;
        let state_bytes = file
            .metadata()
            .map_err(|e| self.io("stat state file", state, e))?
            .len();
        // pread: the descriptor's offset must stay at 0 for QEMU.
        let mut probe = vec![0u8; stream::HEADER_PROBE.min(state_bytes as usize)];
        file.read_exact_at(&mut probe, 0)
            .map_err(|e| self.io("read state file header", state, e))?;
        let header = stream::parse_header(&probe).map_err(|detail| VmmError::StateFile {
            id: self.spec.id.clone(),
            path: state.to_path_buf(),
            detail,
        })?;
        if header.machine != self.machine {
            return Err(VmmError::StateFile {
                id: self.spec.id.clone(),
                path: state.to_path_buf(),
                detail: format!(
                    "saved by machine type {}, this VM is {}",
                    header.machine, self.machine
                ),
            });
        }
        let ignore_shared = header.has_capability(X_IGNORE_SHARED);
        if self.ignore_shared != Some(ignore_shared) {
            self.set_migration_capabilities(ignore_shared).await?;
        }
        qmp!(
            self,
            "getfd",
            self.qmp.getfd("siesta-restore", file.as_fd())
        );
        drop(file); // QEMU holds its own copy now.
        let t_load = Instant::now();
        qmp!(
            self,
            "migrate-incoming",
            self.qmp.migrate_incoming("fd:siesta-restore")
        );
        // Completed means loaded and paused: QEMU runs under -S, so it does
        // not start the vCPUs after an incoming migration (no query-status
        // round trip to confirm it).
        self.wait_incoming(state).await?;
        let load = t_load.elapsed();
        Ok(RestoreInfo {
            load,
            total: t0.elapsed(),
            state_bytes,
            memory: if ignore_shared && !self.spec.memory.shared {
                MemorySave::ChangedPages
            } else if ignore_shared {
                MemorySave::InBackingFile
            } else {
                MemorySave::InState
            },
        })
    }

    async fn save_inner(
        &mut self,
        state: &Path,
        memory: MemorySave,
        file: &File,
    ) -> Result<SaveInfo, VmmError> {
        let t0 = Instant::now();
        let st = qmp!(self, "query-status", self.qmp.query_status());
        if st.running {
            qmp!(self, "stop", self.qmp.stop());
        }
        let ignore_shared = memory == MemorySave::InBackingFile;
        if self.ignore_shared != Some(ignore_shared) {
            self.set_migration_capabilities(ignore_shared).await?;
        }
        qmp!(
            self,
            "migrate-set-parameters",
            self.qmp.set_migrate_parameters(json!({
                "max-bandwidth": SAVE_MAX_BANDWIDTH,
                "downtime-limit": SAVE_DOWNTIME_LIMIT_MS,
            }))
        );
        qmp!(self, "getfd", self.qmp.getfd("siesta-save", file.as_fd()));
        let t_write = Instant::now();
        qmp!(self, "migrate", self.qmp.migrate("fd:siesta-save"));
        self.wait_migration("save", state).await?;
        let write = t_write.elapsed();

        let t_sync = Instant::now();
        file.sync_all()
            .map_err(|e| self.io("fsync state file", state, e))?;
        if ignore_shared {
            // The guest's RAM is the snapshot's other half: make it durable
            // too. fsync on any descriptor flushes the file's dirty pages.
            let mem = &self.spec.memory.path;
            File::open(mem)
                .and_then(|f| f.sync_all())
                .map_err(|e| self.io("fsync memory file", mem, e))?;
        }
        if let Some(dir) = state.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|f| f.sync_all())
                .map_err(|e| self.io("fsync directory of state file", dir, e))?;
        }
        let sync = t_sync.elapsed();
        let state_bytes = file
            .metadata()
            .map_err(|e| self.io("stat state file", state, e))?
            .len();
        Ok(SaveInfo {
            state_bytes,
            write,
            sync,
            total: t0.elapsed(),
            sha256: None,
        })
    }
}

#[async_trait]
impl VmInstance for QemuInstance {
    fn id(&self) -> &str {
        &self.spec.id
    }

    fn pid(&self) -> u32 {
        self.process.pid()
    }

    async fn boot(&mut self) -> Result<(), VmmError> {
        self.check_usable("boot")?;
        if self.spec.mode != LaunchMode::Boot {
            return Err(self.invalid("boot", "spawned in incoming mode; use restore".into()));
        }
        if self.started {
            return Err(self.invalid("boot", "already booted".into()));
        }
        qmp!(self, "cont", self.qmp.cont());
        self.started = true;
        Ok(())
    }

    async fn restore(&mut self, state: &Path) -> Result<RestoreInfo, VmmError> {
        self.check_usable("restore")?;
        if self.spec.mode != LaunchMode::Incoming {
            return Err(self.invalid(
                "restore",
                "spawned in boot mode; spawn with LaunchMode::Incoming".into(),
            ));
        }
        if self.started {
            return Err(self.invalid("restore", "a state was already loaded".into()));
        }
        self.started = true;
        let res = self.restore_inner(state).await;
        match &res {
            Ok(info) => tracing::info!(vm = %self.spec.id, load_ms = info.load.as_secs_f64() * 1e3,
                state_bytes = info.state_bytes, "restored"),
            Err(_) => {
                // A half-loaded VM is of no use, and QEMU 7.2 exits by itself
                // after a failed incoming migration anyway: make sure it is gone.
                self.process.kill_and_reap().await;
                self.gone = true;
            }
        }
        res
    }

    async fn resume(&mut self) -> Result<(), VmmError> {
        self.check_usable("resume")?;
        qmp!(self, "cont", self.qmp.cont());
        Ok(())
    }

    async fn pause(&mut self) -> Result<(), VmmError> {
        self.check_usable("pause")?;
        qmp!(self, "stop", self.qmp.stop());
        Ok(())
    }

    async fn save(&mut self, state: &Path, memory: MemorySave) -> Result<SaveInfo, VmmError> {
        self.check_usable("save")?;
        if memory == MemorySave::ChangedPages {
            return Err(self.invalid(
                "save",
                "changed pages need a base: use save_changed_pages".into(),
            ));
        }
        if memory == MemorySave::InBackingFile && !self.spec.memory.shared {
            return Err(self.invalid(
                "save",
                format!(
                    "RAM is a private mapping of {}: the guest's writes are not in that file; use MemorySave::InState",
                    self.spec.memory.path.display()
                ),
            ));
        }
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(state)
            .map_err(|e| self.io("create state file", state, e))?;
        let res = self.save_inner(state, memory, &file).await;
        match &res {
            Ok(info) => tracing::info!(vm = %self.spec.id, state_bytes = info.state_bytes,
                write_ms = info.write.as_secs_f64() * 1e3, "saved"),
            // A partial state file must not be mistaken for a snapshot.
            Err(_) => drop(std::fs::remove_file(state)),
        }
        res
    }

    async fn save_changed_pages(
        &mut self,
        state: &Path,
        base: &Path,
        write: StateWrite,
    ) -> Result<SaveInfo, VmmError> {
        self.check_usable("save_changed_pages")?;
        let res = self.save_changed_inner(state, base, write).await;
        match &res {
            Ok(info) => tracing::info!(vm = %self.spec.id, state_bytes = info.state_bytes,
                write_ms = info.write.as_secs_f64() * 1e3, "saved changed pages"),
            Err(_) => drop(std::fs::remove_file(state)),
        }
        res
    }

    fn memory_file(&self) -> &Path {
        &self.spec.memory.path
    }

    async fn checkpoint_disk(&mut self, overlay: &Path) -> Result<(), VmmError> {
        self.check_usable("checkpoint_disk")?;
        self.checkpoint_disk_inner(overlay).await
    }

    async fn replace_disk(&mut self, disk: DiskSpec) -> Result<(), VmmError> {
        self.replace_disk_inner(disk).await
    }

    fn rename(&mut self, id: &str, run_dir: &Path) {
        self.spec.id = id.to_string();
        self.spec.run_dir = run_dir.to_path_buf();
    }

    async fn shutdown(&mut self) -> Result<(), VmmError> {
        if self.process.try_exit().is_none() {
            // `quit` is polite (QEMU flushes its disk caches); a wedged QEMU
            // gets SIGKILL after the grace period.
            let _ = tokio::time::timeout(QUIT_GRACE, self.qmp.quit()).await;
            if self.process.wait_exit(QUIT_GRACE).await.is_none() {
                tracing::warn!(vm = %self.spec.id, pid = self.pid(), "QEMU ignored quit: SIGKILL");
            }
            self.process.kill_and_reap().await;
        }
        self.gone = true;
        let _ = std::fs::remove_file(self.spec.control_socket_path());
        Ok(())
    }

    fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.process.try_exit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_machine_aliases() {
        let help = "Supported machines are:\n\
            microvm              microvm (i386)\n\
            pc                   Standard PC (i440FX + PIIX, 1996) (alias of pc-i440fx-7.2)\n\
            q35                  Standard PC (Q35 + ICH9, 2009) (alias of pc-q35-7.2)\n\
            pc-q35-7.2           Standard PC (Q35 + ICH9, 2009)\n";
        assert_eq!(resolve_alias(help, "q35").as_deref(), Some("pc-q35-7.2"));
        assert_eq!(resolve_alias(help, "microvm").as_deref(), Some("microvm"));
        assert_eq!(resolve_alias(help, "virt"), None);
    }
}
