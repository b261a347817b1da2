//! Errors of the sandbox layer. Each says what failed, on which template or
//! sandbox, and where it helps, what to do about it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("template {name:?} not found (build it with `siesta template build {name}`)")]
    TemplateNotFound { name: String },

    #[error("sandbox {id:?} not found")]
    SandboxNotFound { id: String },

    #[error("sandbox {id:?} is {state}, expected {expected}")]
    WrongState {
        id: String,
        state: String,
        expected: &'static str,
    },

    #[error("invalid request: {0}")]
    Invalid(String),

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

    #[error("guest agent of {id} did not become ready within {secs} s: {detail}")]
    GuestNotReady {
        id: String,
        secs: u64,
        detail: String,
    },

    #[error("guest agent of {id}: {detail}")]
    Agent { id: String, detail: String },

    #[error("VMM for {id}: {source}")]
    Vmm {
        id: String,
        // Boxed: VMM errors carry logs and would make every Result large.
        #[source]
        source: Box<siesta_vmm::VmmError>,
    },

    #[error("network for {id}: {source}")]
    Net {
        id: String,
        #[source]
        source: siesta_net::NetError,
    },

    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },

    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn vmm(id: impl Into<String>, source: siesta_vmm::VmmError) -> Self {
        Error::Vmm {
            id: id.into(),
            source: Box::new(source),
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
