//! Errors of every backend. Each variant names the VM and the file or command
//! involved, and quotes the VMM's own output when the process died, so that a
//! failure can be understood from the message alone.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("VM {id}: invalid launch spec: {detail}")]
    InvalidSpec { id: String, detail: String },

    #[error("VM {id}: cannot {op}: {detail}")]
    InvalidOperation {
        id: String,
        op: &'static str,
        detail: String,
    },

    #[error("VMM binary {}: {detail}", binary.display())]
    Binary { binary: PathBuf, detail: String },

    #[error("VM {id}: {op} {}: {source}", path.display())]
    Io {
        id: String,
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("VM {id}: starting {} failed{}: {source}", binary.display(),
        netns.as_ref().map(|n| format!(" (in network namespace {})", n.display())).unwrap_or_default())]
    Spawn {
        id: String,
        binary: PathBuf,
        netns: Option<PathBuf>,
        #[source]
        source: std::io::Error,
    },

    #[error("VM {id}: VMM process {pid} exited ({status}) during {during}; its log {}:\n{log_tail}", log.display())]
    Exited {
        id: String,
        pid: u32,
        during: String,
        status: String,
        /// Killed by a signal (something outside stopped it), rather than
        /// an exit of its own (such as QEMU refusing a state file).
        killed: bool,
        log: PathBuf,
        log_tail: String,
    },

    #[error("VM {id}: timed out after {}ms waiting for {what}", after.as_millis())]
    Timeout {
        id: String,
        what: String,
        after: std::time::Duration,
    },

    #[error("VM {id}: QMP command {command}: {source}")]
    Qmp {
        id: String,
        command: String,
        #[source]
        source: crate::qemu::qmp::QmpError,
    },

    #[error("VM {id}: {op} of {} failed in migration state {status}: {detail}", path.display())]
    Migration {
        id: String,
        op: &'static str,
        path: PathBuf,
        status: String,
        detail: String,
    },

    #[error("VM {id}: state file {}: {detail}", path.display())]
    StateFile {
        id: String,
        path: PathBuf,
        detail: String,
    },

    #[error("snapshot is incompatible with this VMM: {}", differences.join("; "))]
    Incompatible { differences: Vec<String> },
}
