//! Durable file operations: every write that publishes something is synced
//! before it is renamed into place, and the directory after.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::RepoError;

pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RepoError {
    let path = path.to_path_buf();
    move |source| RepoError::Io { what, path, source }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), RepoError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing directory", dir))
}

pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), RepoError> {
    let mut f = std::fs::File::create(path).map_err(io("creating", path))?;
    f.write_all(bytes).map_err(io("writing", path))?;
    f.sync_all().map_err(io("syncing", path))
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, synced,
/// renamed over it, and the directory synced.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), RepoError> {
    let tmp = tmp_beside(path);
    write_synced(&tmp, bytes)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("renaming into place", path)(e));
    }
    sync_dir(parent(path))
}

/// `<dir>/.<name>.tmp.<pid>.<random>`: hidden, so no reader takes it for a
/// real entry, and unique, so two writers never share one.
pub(crate) fn tmp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent(path).join(format!(
        ".{name}.tmp.{}.{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ))
}

pub(crate) fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Names that become file names: a safe alphabet, so nothing escapes the
/// repository.
pub(crate) fn valid_name(name: &str, allow_colon: bool) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') || (allow_colon && c == ':')
        })
}

/// Whether process `pid` exists on this host.
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
