//! Errors of the object-store tier. `siesta-sandbox` turns each into its
//! own error of the same kind: a store that cannot give what a create
//! named is a 502, a damaged local file says which.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
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

    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A fault of siesta itself (a task that panicked or a channel gone).
    #[error("internal error while {what}: {detail}")]
    Internal { what: String, detail: String },

    #[error(transparent)]
    Repo(#[from] siesta_snapshot::RepoError),

    #[error(transparent)]
    Template(#[from] siesta_template::Error),

    #[error(transparent)]
    Host(#[from] siesta_host::HostError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
