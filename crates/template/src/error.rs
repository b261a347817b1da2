//! Errors of templates and their builds. Each says what failed, on which
//! template, and where it helps, what to do about it. `siesta-sandbox`
//! turns each into its own error of the same kind, so the server's status
//! codes do not depend on which crate failed.

use std::path::PathBuf;

use siesta_snapshot::RepoError;

use crate::BuildPhase;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("template {name:?} not found (build it with `siesta template build {name}`)")]
    TemplateNotFound { name: String },

    #[error("invalid request: {0}")]
    Invalid(String),

    /// A fault of siesta itself (a task that panicked), not of the request.
    #[error("internal error while {what}: {detail}")]
    Internal { what: String, detail: String },

    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("snapshot {path} is corrupt: {detail}; rebuild the template or delete the snapshot")]
    CorruptSnapshot { path: PathBuf, detail: String },

    #[error("template {template:?} was made by another VMM ({detail}); rebuild it on this node with `siesta template build {template} --force`")]
    Incompatible { template: String, detail: String },

    /// The host side of a build: a VMM, a network slot, a disk, a host
    /// program.
    #[error(transparent)]
    Host(#[from] siesta_host::HostError),

    #[error(transparent)]
    Agent(#[from] siesta_envd_client::EnvdError),

    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },

    /// A template build with steps failed; `phase` says where (E2B's
    /// `base`, the step number, or `finalize`).
    #[error("building template {template:?} failed at step {phase}: {detail}")]
    BuildFailed {
        template: String,
        phase: BuildPhase,
        detail: String,
    },

    /// An image source could not be fetched or unpacked.
    #[error(transparent)]
    Image(#[from] siesta_image::ImageError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn vmm(id: impl Into<String>, source: siesta_vmm::VmmError) -> Self {
        Error::Host(siesta_host::HostError::vmm(id, source))
    }
}

impl From<RepoError> for Error {
    fn from(e: RepoError) -> Self {
        match e {
            RepoError::Io { what, path, source } => Error::Io { what, path, source },
            other => Error::Command {
                what: "snapshot repository".into(),
                detail: other.to_string(),
            },
        }
    }
}

/// Attaches the file and the action to an I/O error.
pub(crate) trait IoContext<T> {
    fn ctx(self, what: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, what: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::Io {
            what,
            path: path.into(),
            source,
        })
    }
}

pub(crate) fn internal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal {
        what: what.to_string(),
        detail: e.to_string(),
    }
}
