//! Errors of the volume registry and of file operations inside a volume.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {0:?} not found")]
    NotFound(String),
    #[error("a volume named {0:?} already exists")]
    NameTaken(String),
    #[error("invalid volume name {name:?}: {why}")]
    BadName { name: String, why: &'static str },
    #[error("invalid size limit: {0}")]
    BadLimit(String),
    #[error("invalid path {path:?}: {why}")]
    BadPath { path: String, why: &'static str },
    #[error("path {0} not found")]
    PathNotFound(String),
    #[error("path {0} already exists")]
    Exists(String),
    #[error("path {0} is a directory")]
    IsDirectory(String),
    #[error("path {0} is not a directory")]
    NotDirectory(String),
    #[error("the root of a volume cannot be removed; delete the volume instead")]
    RemoveRoot,
    #[error("volume {volume} is full: {used} bytes used of {limit}; {wanted} more bytes do not fit (remove files, or create the volume with a larger size limit)")]
    Full {
        volume: String,
        used: u64,
        limit: u64,
        wanted: u64,
    },
    #[error("volume {volume}: path {path} leads outside the volume")]
    Escapes { volume: String, path: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("volume database {path}: {what}: {source}")]
    Sql {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}

pub type VolumeResult<T> = std::result::Result<T, VolumeError>;

/// Context for an I/O error on a host path.
pub(crate) fn io(
    what: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> VolumeError {
    let path = path.into();
    move |source| VolumeError::Io { what, path, source }
}
