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

    /// The object store could not give what a create named (unreachable,
    /// refused, or damaged: nothing was installed).
    #[error("fetching {name:?} from the object store: {detail}")]
    Remote { name: String, detail: String },

    /// Putting a snapshot into (or deleting it from) the object store
    /// failed; the local copy is untouched.
    #[error("{what} snapshot {id} in the object store: {detail}")]
    RemoteWrite {
        what: &'static str,
        id: String,
        detail: String,
    },

    /// The server is stopping: nothing new starts (retry on another node,
    /// or once it is back).
    #[error("the server is shutting down; retry once it is back")]
    ShuttingDown,

    /// A fault of siesta itself (a task that panicked), not of the request.
    #[error("internal error while {what}: {detail}")]
    Internal { what: String, detail: String },

    /// An idempotency key that cannot give back what it made.
    #[error("Idempotency-Key {key:?}: {detail}")]
    KeyConflict { key: String, detail: String },

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

    /// A pause that needs the guest's agent (`requireHealthyGuest`, or a
    /// disk-only pause, which syncs the guest first) found it not
    /// answering; the sandbox runs on.
    #[error("sandbox {id} was not paused: its guest agent does not answer ({detail}); it keeps running, retry later or pause it keeping memory")]
    GuestUnresponsive { id: String, detail: String },

    #[error("VMM for {id}: {source}")]
    Vmm {
        id: String,
        // Boxed: VMM errors carry logs and would make every Result large.
        #[source]
        source: Box<siesta_vmm::VmmError>,
    },

    /// Every network slot of the node is held: it runs as many sandboxes
    /// as `max_slots` allows.
    #[error("this node has room for {room} more sandbox(es) and {wanted} were asked for: it runs at most {max_slots} at once (max_slots); kill or pause some, or raise max_slots in the config file's [node] section")]
    NodeFull {
        wanted: usize,
        room: usize,
        max_slots: usize,
    },

    #[error("network for {id}: {source}")]
    Net {
        id: String,
        #[source]
        source: siesta_net::NetError,
    },

    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },

    /// A host program the node needs is not there (removed after start, or
    /// never installed): the server answers 503, not 500.
    #[error("{command} is missing on this node (it {used_for}): install package {package} (scripts/install-deps.sh), then retry; `siesta doctor` checks the rest")]
    MissingTool {
        command: String,
        package: String,
        used_for: String,
    },

    /// A template build with steps failed; `phase` says where (E2B's
    /// `base`, the step number, or `finalize`).
    #[error("building template {template:?} failed at step {phase}: {detail}")]
    BuildFailed {
        template: String,
        phase: siesta_template::BuildPhase,
        detail: String,
    },

    #[error(transparent)]
    Store(#[from] crate::store::StoreError),

    /// An image source could not be fetched or unpacked.
    #[error(transparent)]
    Image(#[from] siesta_image::ImageError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when the error is the node's, not the request's: a host program
    /// or the VMM binary could not be started. The server answers 503.
    pub fn is_missing_dependency(&self) -> bool {
        let not_found = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        match self {
            Error::MissingTool { .. } => true,
            Error::Vmm { source, .. } => match source.as_ref() {
                siesta_vmm::VmmError::Spawn { source, .. } => not_found(source),
                _ => false,
            },
            Error::Net {
                source: siesta_net::NetError::Spawn { source, .. },
                ..
            } => not_found(source),
            _ => false,
        }
    }

    /// True when the node has no network slot left for another sandbox
    /// (found before starting, or when a slot was taken). The server
    /// answers 429, which the E2B SDKs raise as their rate-limit error.
    pub fn is_node_full(&self) -> bool {
        matches!(
            self,
            Error::NodeFull { .. }
                | Error::Net {
                    source: siesta_net::NetError::Exhausted { .. },
                    ..
                }
        )
    }

    pub(crate) fn vmm(id: impl Into<String>, source: siesta_vmm::VmmError) -> Self {
        Error::Vmm {
            id: id.into(),
            source: Box::new(source),
        }
    }
}

/// Template errors keep their kind: a template that is not there stays
/// [`Error::TemplateNotFound`] (404), a failed build [`Error::BuildFailed`].
impl From<siesta_template::Error> for Error {
    fn from(e: siesta_template::Error) -> Self {
        use siesta_template::Error as T;
        match e {
            T::TemplateNotFound { name } => Error::TemplateNotFound { name },
            T::Invalid(detail) => Error::Invalid(detail),
            T::Internal { what, detail } => Error::Internal { what, detail },
            T::Io { what, path, source } => Error::Io { what, path, source },
            T::CorruptSnapshot { path, detail } => Error::CorruptSnapshot { path, detail },
            T::Incompatible { template, detail } => Error::Incompatible { template, detail },
            T::Host(e) => e.into(),
            T::Agent(e) => e.into(),
            T::Command { what, detail } => Error::Command { what, detail },
            T::BuildFailed {
                template,
                phase,
                detail,
            } => Error::BuildFailed {
                template,
                phase,
                detail,
            },
            T::Image(e) => Error::Image(e),
        }
    }
}

/// The object-store tier's errors keep their kind: a store that cannot
/// give what a create named stays [`Error::Remote`] (502).
impl From<siesta_tier::Error> for Error {
    fn from(e: siesta_tier::Error) -> Self {
        use siesta_tier::Error as T;
        match e {
            T::Remote { name, detail } => Error::Remote { name, detail },
            T::RemoteWrite { what, id, detail } => Error::RemoteWrite { what, id, detail },
            T::Io { what, path, source } => Error::Io { what, path, source },
            T::Internal { what, detail } => Error::Internal { what, detail },
            T::Repo(e) => e.into(),
            T::Template(e) => e.into(),
            T::Host(e) => e.into(),
        }
    }
}

/// Repository errors: an I/O error names its file; the rest say what the
/// repository refused.
impl From<siesta_snapshot::RepoError> for Error {
    fn from(e: siesta_snapshot::RepoError) -> Self {
        siesta_template::Error::from(e).into()
    }
}

/// The host layer's errors keep their kind: a missing program stays
/// [`Error::MissingTool`] (503), a damaged image [`Error::CorruptSnapshot`].
impl From<siesta_host::HostError> for Error {
    fn from(e: siesta_host::HostError) -> Self {
        use siesta_host::HostError;
        match e {
            HostError::Io { what, path, source } => Error::Io { what, path, source },
            HostError::CorruptImage { path, detail } => Error::CorruptSnapshot { path, detail },
            HostError::Command { what, detail } => Error::Command { what, detail },
            HostError::MissingTool {
                command,
                package,
                used_for,
            } => Error::MissingTool {
                command,
                package,
                used_for,
            },
            HostError::Internal { what, detail } => Error::Internal { what, detail },
            HostError::Invalid(detail) => Error::Invalid(detail),
            HostError::Vmm { id, source } => Error::Vmm { id, source },
            HostError::Net { id, source } => Error::Net { id, source },
        }
    }
}

/// The agent client's errors keep their kind: a guest that never became
/// ready stays [`Error::GuestNotReady`], and so on.
impl From<siesta_envd_client::EnvdError> for Error {
    fn from(e: siesta_envd_client::EnvdError) -> Self {
        use siesta_envd_client::EnvdError;
        match e {
            EnvdError::Agent { id, detail } => Error::Agent { id, detail },
            EnvdError::GuestNotReady { id, secs, detail } => {
                Error::GuestNotReady { id, secs, detail }
            }
            EnvdError::Io { what, path, source } => Error::Io { what, path, source },
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

/// An [`Error::Internal`]: `what` siesta was doing when `e`, a fault of
/// its own (an encoding that cannot fail, a task that died), happened.
pub(crate) fn internal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal {
        what: what.to_string(),
        detail: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use siesta_envd_client::EnvdError;
    use siesta_host::HostError;

    #[test]
    fn host_errors_keep_their_kind() {
        let missing: Error = HostError::missing_tool("qemu-img").into();
        assert!(missing.is_missing_dependency(), "{missing}");
        assert!(missing.to_string().contains("qemu-utils"), "{missing}");
        let corrupt: Error = HostError::CorruptImage {
            path: "/d".into(),
            detail: "bad".into(),
        }
        .into();
        assert!(matches!(corrupt, Error::CorruptSnapshot { .. }));
        let internal: Error = HostError::Internal {
            what: "w".into(),
            detail: "d".into(),
        }
        .into();
        assert!(matches!(internal, Error::Internal { .. }));
    }

    #[test]
    fn agent_errors_keep_their_kind() {
        let late: Error = EnvdError::GuestNotReady {
            id: "s".into(),
            secs: 3,
            detail: "d".into(),
        }
        .into();
        assert!(matches!(late, Error::GuestNotReady { secs: 3, .. }));
        let agent: Error = EnvdError::Agent {
            id: "s".into(),
            detail: "d".into(),
        }
        .into();
        assert!(matches!(agent, Error::Agent { .. }));
    }
}
