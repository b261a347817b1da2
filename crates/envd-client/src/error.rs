//! Errors of the agent client. Each names the sandbox whose agent failed;
//! `siesta-sandbox` turns them into its own error without losing the kind.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EnvdError {
    /// The agent answered wrongly, not at all, or with an error.
    #[error("guest agent of {id}: {detail}")]
    Agent { id: String, detail: String },

    /// The agent did not answer `/health` in time.
    #[error("guest agent of {id} did not become ready within {secs} s: {detail}")]
    GuestNotReady {
        id: String,
        secs: u64,
        detail: String,
    },

    /// A host file the client reads (an upload's source) failed.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = EnvdError> = std::result::Result<T, E>;
