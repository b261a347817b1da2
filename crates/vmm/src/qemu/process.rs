//! The QEMU process: start (optionally inside a network namespace), wait for
//! its QMP socket, kill and reap. Every signal goes to the PID of the child we
//! started and have not reaped yet, so it can never hit a recycled PID.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::net::UnixStream;

use crate::cgroup::VmCgroup;
use crate::{VmmError, VmmUser};

/// How much of QEMU's log an error quotes.
const LOG_TAIL_BYTES: u64 = 4096;

/// The only environment a VMM gets: QEMU needs none of the server's, and
/// the server's may hold credentials (S3 keys, registry passwords).
const VMM_ENV: [(&str, &str); 1] = [("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")];

pub struct QemuProcess {
    id: String,
    child: Child,
    log: PathBuf,
    exit: Option<ExitStatus>,
    /// The process's own cgroup, removed once it has exited.
    cgroup: Option<VmCgroup>,
    /// The unprivileged user it runs as, given back once it is reaped.
    user: Option<VmmUser>,
}

impl QemuProcess {
    /// Starts `binary argv` with stdout and stderr appended to `log`.
    ///
    /// With `netns`, the child joins that network namespace before exec, so
    /// QEMU opens the tap device that lives there; the parent's namespace is
    /// untouched. The child gets its own process group so a terminal's
    /// Ctrl-C aimed at the server does not kill VMs behind its back, only
    /// [`VMM_ENV`] as its environment, and with `cgroup` joins that group
    /// before exec. `user` is the `-runas` user `argv` names; it is held
    /// until the process is reaped so no other VMM gets it meanwhile.
    pub fn spawn(
        id: &str,
        binary: &Path,
        argv: &[OsString],
        netns: Option<&Path>,
        log: &Path,
        cgroup: Option<VmCgroup>,
        user: Option<VmmUser>,
    ) -> Result<Self, VmmError> {
        let io_err = |op, path: &Path, source| VmmError::Io {
            id: id.to_string(),
            op,
            path: path.to_path_buf(),
            source,
        };
        let out = File::create(log).map_err(|e| io_err("create VMM log", log, e))?;
        let err = out
            .try_clone()
            .map_err(|e| io_err("duplicate VMM log handle", log, e))?;
        let ns = match netns {
            Some(p) => Some(File::open(p).map_err(|e| io_err("open network namespace", p, e))?),
            None => None,
        };
        let mut cmd = Command::new(binary);
        cmd.args(argv)
            .env_clear()
            .envs(VMM_ENV)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        if let Some(ns) = &ns {
            let fd = ns.as_raw_fd();
            // SAFETY: runs in the forked child before exec; setns is a plain
            // syscall (async-signal-safe) on a descriptor inherited from the
            // parent, which keeps `ns` open until spawn returns.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if let Some(group) = &cgroup {
            let fds = group.procs_fds();
            // SAFETY: runs in the forked child before exec and only calls
            // write(2) on descriptors `group` keeps open until spawn returns.
            unsafe {
                cmd.pre_exec(move || crate::cgroup::join_in_child(&fds));
            }
        }
        let child = cmd.spawn().map_err(|source| VmmError::Spawn {
            id: id.to_string(),
            binary: binary.to_path_buf(),
            netns: netns.map(Path::to_path_buf),
            source,
        })?;
        drop(ns);
        tracing::debug!(vm = id, pid = child.id(), "QEMU started");
        Ok(QemuProcess {
            id: id.to_string(),
            child,
            log: log.to_path_buf(),
            exit: None,
            cgroup,
            user,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reaps the process if it has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exit = Some(st);
                // Empty now: its directories can go, its user to another.
                self.cgroup = None;
                self.user = None;
            }
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_exit() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGKILL (unless already reaped), then reap. Waiting is short: the
    /// process cannot ignore SIGKILL, only unmapping its memory takes time.
    pub async fn kill_and_reap(&mut self) -> ExitStatus {
        if let Some(st) = self.try_exit() {
            return st;
        }
        let pid = Pid::from_raw(self.pid() as i32);
        // ESRCH cannot happen for an unreaped child; nothing else to do on error.
        let _ = kill(pid, Signal::SIGKILL);
        loop {
            if let Some(st) = self.wait_exit(Duration::from_secs(5)).await {
                return st;
            }
            tracing::warn!(vm = %self.id, pid = self.pid(), "QEMU still not reaped 5s after SIGKILL");
        }
    }

    /// The last few KiB of QEMU's stdout/stderr.
    pub fn log_tail(&self) -> String {
        match read_tail(&self.log, LOG_TAIL_BYTES) {
            Ok(t) if t.is_empty() => "(empty)".into(),
            Ok(t) => t,
            Err(e) => format!("<cannot read {}: {e}>", self.log.display()),
        }
    }

    /// The error for "QEMU is gone", with its exit status and log tail.
    pub fn exited_error(&self, during: &str) -> VmmError {
        VmmError::Exited {
            id: self.id.clone(),
            pid: self.pid(),
            during: during.to_string(),
            status: self
                .exit
                .map(describe_status)
                .unwrap_or_else(|| "still running".into()),
            killed: self.exit.is_some_and(|st| st.signal().is_some()),
            log: self.log.clone(),
            log_tail: self.log_tail(),
        }
    }

    /// Connects to QEMU's QMP socket once QEMU has created it. Fails early,
    /// with QEMU's own message, if QEMU exits instead (bad option, missing
    /// file, ...), and kills it if the socket never appears.
    pub async fn connect(
        &mut self,
        socket: &Path,
        timeout: Duration,
    ) -> Result<UnixStream, VmmError> {
        let start = Instant::now();
        loop {
            if self.try_exit().is_some() {
                return Err(self.exited_error("startup (before QMP was ready)"));
            }
            match UnixStream::connect(socket).await {
                Ok(s) => return Ok(s),
                // Not created yet, or created but not listening yet.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) => {}
                Err(source) => {
                    self.kill_and_reap().await;
                    return Err(VmmError::Io {
                        id: self.id.clone(),
                        op: "connect to QMP socket",
                        path: socket.to_path_buf(),
                        source,
                    });
                }
            }
            if start.elapsed() >= timeout {
                self.kill_and_reap().await;
                return Err(VmmError::Timeout {
                    id: self.id.clone(),
                    what: format!(
                        "QMP socket {} (QEMU log: {})",
                        socket.display(),
                        self.log_tail()
                    ),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            tracing::warn!(vm = %self.id, pid = self.pid(), "VM dropped while running: killing it");
            let _ = kill(Pid::from_raw(self.pid() as i32), Signal::SIGKILL);
            // Blocking is fine here: after SIGKILL the exit is imminent, and
            // an unreaped child would linger as a zombie.
            let _ = self.child.wait();
        }
    }
}

pub fn describe_status(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!(
            "killed by signal {s} ({})",
            Signal::try_from(s).map(|s| s.as_str()).unwrap_or("unknown")
        ),
        _ => format!("{st}"),
    }
}

fn read_tail(path: &Path, max: u64) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn early_exit_is_reported_with_the_log() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("vmm.log");
        let argv: Vec<OsString> = vec![
            "-c".into(),
            "echo 'qemu: bad option -foo' >&2; exit 3".into(),
        ];
        let mut p =
            QemuProcess::spawn("vm9", Path::new("/bin/sh"), &argv, None, &log, None, None).unwrap();
        let e = p
            .connect(&d.path().join("nope.sock"), Duration::from_secs(5))
            .await
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("vm9") && msg.contains("exit code 3") && msg.contains("bad option -foo"),
            "{msg}"
        );
        assert!(p.try_exit().is_some());
    }

    #[tokio::test]
    async fn socket_timeout_kills_and_reaps() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("vmm.log");
        let argv: Vec<OsString> = vec!["-c".into(), "exec sleep 30".into()];
        let mut p =
            QemuProcess::spawn("vm8", Path::new("/bin/sh"), &argv, None, &log, None, None).unwrap();
        let e = p
            .connect(&d.path().join("nope.sock"), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(e, VmmError::Timeout { .. }), "{e}");
        let st = p.try_exit().expect("reaped");
        assert_eq!(st.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn spawn_failure_names_the_binary_and_netns() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("vmm.log");
        let Err(e) = QemuProcess::spawn(
            "vm7",
            Path::new("/nonexistent/qemu"),
            &[],
            None,
            &log,
            None,
            None,
        ) else {
            panic!("spawned a missing binary")
        };
        assert!(e.to_string().contains("/nonexistent/qemu"), "{e}");
        let Err(e) = QemuProcess::spawn(
            "vm7",
            Path::new("/bin/true"),
            &[],
            Some(&d.path().join("ns")),
            &log,
            None,
            None,
        ) else {
            panic!("missing netns accepted")
        };
        assert!(e.to_string().contains("network namespace"), "{e}");
    }
}
