//! Starting a child as the requested user, with pipes or a pty, in its own
//! session (so a process-group kill reaches everything it started).

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

use super::pty::{self, PtyMaster};
use crate::rpc::RpcError;

/// Everything needed to start one process, resolved by the service.
pub struct SpawnSpec {
    pub cmd: String,
    pub args: Vec<String>,
    /// The complete environment, in order; later entries win.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Pipe stdin (else `/dev/null`); ignored with a pty.
    pub stdin: bool,
    /// `(cols, rows)` of a pty to run the process on.
    pub pty: Option<(u16, u16)>,
}

/// Where input for the process goes.
pub enum Input {
    Pipe(ChildStdin),
    Pty(Arc<PtyMaster>),
}

/// Where the process's output comes from.
pub enum Output {
    Pipes {
        stdout: ChildStdout,
        stderr: ChildStderr,
    },
    Pty(Arc<PtyMaster>),
}

/// How the exit status is collected. When the agent is PID 1 its reaper owns
/// `waitpid`, and tokio must not race it for the status.
pub enum Waiter {
    Tokio(tokio::process::Child),
    Reaper(i32),
}

impl Waiter {
    pub async fn wait(self) -> io::Result<ExitStatus> {
        match self {
            Waiter::Tokio(mut child) => child.wait().await,
            Waiter::Reaper(pid) => Ok(crate::reaper::wait(pid).await),
        }
    }
}

pub struct Spawned {
    pub pid: u32,
    pub waiter: Waiter,
    pub input: Option<Input>,
    pub output: Output,
    pub pty: Option<Arc<PtyMaster>>,
}

pub fn spawn(spec: SpawnSpec) -> Result<Spawned, RpcError> {
    let mut cmd = std::process::Command::new(&spec.cmd);
    cmd.args(&spec.args).env_clear().current_dir(&spec.cwd);
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }

    let pty = match spec.pty {
        Some((cols, rows)) => {
            let pair =
                pty::open(cols, rows).map_err(|e| RpcError::internal(format!("openpty: {e}")))?;
            let dup = |fd: &std::os::fd::OwnedFd| {
                fd.try_clone()
                    .map_err(|e| RpcError::internal(format!("dup pty: {e}")))
            };
            cmd.stdin(Stdio::from(dup(&pair.slave)?))
                .stdout(Stdio::from(dup(&pair.slave)?))
                .stderr(Stdio::from(pair.slave));
            Some(Arc::new(pair.master))
        }
        None => {
            cmd.stdin(if spec.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            None
        }
    };

    // Switch user only when there is something to switch: as root always
    // (also drops the agent's supplementary groups), as anyone else only
    // towards another uid, which then fails with EPERM as it should.
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let switch_user = euid == 0 || euid != spec.uid;
    let (uid, gid, groups) = (spec.uid, spec.gid, spec.groups.clone());
    let controlling_tty = pty.is_some();
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe syscalls on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            // A new session: the process leads its own group (for killpg) and
            // can take the pty as its controlling terminal.
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            if switch_user
                && (libc::setgroups(groups.len(), groups.as_ptr()) < 0
                    || libc::setgid(gid) < 0
                    || libc::setuid(uid) < 0)
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }

    let started = if crate::reaper::is_active() {
        spawn_for_reaper(cmd)
    } else {
        spawn_with_tokio(cmd)
    };
    let (pid, waiter, stdin, pipes) = started.map_err(|e| {
        let mut err = RpcError::from_io(&e, &spec.cmd);
        err.message = format!("cannot start {:?}: {e}", spec.cmd);
        err
    })?;
    let (input, output) = match (&pty, pipes) {
        (Some(master), _) => (
            Some(Input::Pty(master.clone())),
            Output::Pty(master.clone()),
        ),
        (None, Some((stdout, stderr))) => {
            (stdin.map(Input::Pipe), Output::Pipes { stdout, stderr })
        }
        (None, None) => return Err(RpcError::internal("child has no output pipes")),
    };
    Ok(Spawned {
        pid,
        waiter,
        input,
        output,
        pty,
    })
}

type Started = (
    u32,
    Waiter,
    Option<ChildStdin>,
    Option<(ChildStdout, ChildStderr)>,
);

fn spawn_with_tokio(cmd: std::process::Command) -> io::Result<Started> {
    let mut child = tokio::process::Command::from(cmd).spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("child exited before its pid was read"))?;
    let stdin = child.stdin.take();
    let pipes = child.stdout.take().zip(child.stderr.take());
    Ok((pid, Waiter::Tokio(child), stdin, pipes))
}

fn spawn_for_reaper(mut cmd: std::process::Command) -> io::Result<Started> {
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let stdin = child.stdin.take().map(ChildStdin::from_std).transpose()?;
    let pipes = match (child.stdout.take(), child.stderr.take()) {
        (Some(o), Some(e)) => Some((ChildStdout::from_std(o)?, ChildStderr::from_std(e)?)),
        _ => None,
    };
    // Dropping a std Child neither kills nor waits: the reaper collects it.
    drop(child);
    Ok((pid, Waiter::Reaper(pid as i32), stdin, pipes))
}

/// Go's `ProcessState.String()`, which E2B clients see as `end.status`.
pub fn status_string(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    match status.signal() {
        Some(sig) => {
            let mut s = format!("signal: {}", signal_name(sig));
            if status.core_dumped() {
                s.push_str(" (core dumped)");
            }
            s
        }
        None => format!("unknown status {}", status.into_raw()),
    }
}

/// Go's names for Linux signals (`syscall.Signal.String`).
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "hangup",
        libc::SIGINT => "interrupt",
        libc::SIGQUIT => "quit",
        libc::SIGILL => "illegal instruction",
        libc::SIGTRAP => "trace/breakpoint trap",
        libc::SIGABRT => "aborted",
        libc::SIGBUS => "bus error",
        libc::SIGFPE => "floating point exception",
        libc::SIGKILL => "killed",
        libc::SIGUSR1 => "user defined signal 1",
        libc::SIGSEGV => "segmentation fault",
        libc::SIGUSR2 => "user defined signal 2",
        libc::SIGPIPE => "broken pipe",
        libc::SIGALRM => "alarm clock",
        libc::SIGTERM => "terminated",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_like_go() {
        assert_eq!(status_string(&ExitStatus::from_raw(0)), "exit status 0");
        assert_eq!(
            status_string(&ExitStatus::from_raw(1 << 8)),
            "exit status 1"
        );
        assert_eq!(
            status_string(&ExitStatus::from_raw(libc::SIGKILL)),
            "signal: killed"
        );
        assert_eq!(
            status_string(&ExitStatus::from_raw(libc::SIGSEGV | 0x80)),
            "signal: segmentation fault (core dumped)"
        );
    }
}
