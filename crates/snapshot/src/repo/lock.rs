//! Locks of the repository.
//!
//! - [`RecordLock`]: one snapshot record's lock, a file `locks/<id>.lock`
//!   created exclusively and holding the owner's pid and a lease. A holder
//!   that crashed (its pid is gone) or overran its lease no longer holds it:
//!   the next taker breaks it. Commit, delete and manifest attachment run
//!   under it.
//! - [`RepoGate`]: `flock` on `locks/repo.gate`. Every writer holds it shared
//!   for the whole operation; `repair` holds it exclusive, so it only ever
//!   sees a quiescent repository and cannot remove a live writer's staging
//!   files or a blob a publisher is about to reference. The kernel releases a
//!   `flock` when its holder dies, so a crash never wedges it.

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::fsutil::{io, now_ms, pid_alive};
use super::RepoError;

/// Default lease of a record lock; commit, delete and attach take
/// milliseconds, so a lease this long only matters for a wedged holder.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOwner {
    pub pid: u32,
    pub acquired_unix_ms: u64,
    pub lease_ms: u64,
    /// Random, so a holder never removes a lock that was broken and retaken.
    pub token: u64,
}

impl LockOwner {
    /// A lock whose owner is dead or whose lease ran out is stale.
    pub fn is_stale(&self) -> bool {
        !pid_alive(self.pid) || now_ms() > self.acquired_unix_ms.saturating_add(self.lease_ms)
    }
}

pub(crate) fn read_owner(path: &Path) -> Option<LockOwner> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

/// A held record lock; dropped, it is released.
#[derive(Debug)]
pub struct RecordLock {
    path: PathBuf,
    owner: LockOwner,
}

impl RecordLock {
    /// Takes the lock of `id`, breaking a stale one, waiting up to `wait`
    /// for a live holder.
    pub(crate) fn acquire(locks: &Path, id: &str, wait: Duration) -> Result<Self, RepoError> {
        let path = locks.join(format!("{id}.lock"));
        let started = Instant::now();
        loop {
            let owner = LockOwner {
                pid: std::process::id(),
                acquired_unix_ms: now_ms(),
                lease_ms: DEFAULT_LEASE.as_millis() as u64,
                token: rand::random(),
            };
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    use std::io::Write;
                    let bytes = serde_json::to_vec(&owner).unwrap_or_default();
                    let written = f.write_all(&bytes).and_then(|_| f.sync_all());
                    if let Err(e) = written {
                        let _ = std::fs::remove_file(&path);
                        return Err(io("writing lock file", &path)(e));
                    }
                    return Ok(Self { path, owner });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io("creating lock file", &path)(e)),
            }
            let current = read_owner(&path);
            // A lock file without a readable owner is a taker that crashed
            // between create and write: as stale as a dead pid.
            let stale = current.as_ref().is_none_or(LockOwner::is_stale);
            if stale {
                break_stale(locks, &path, current.as_ref())?;
                continue;
            }
            if started.elapsed() >= wait {
                return Err(RepoError::Locked {
                    id: id.to_string(),
                    pid: current.map_or(0, |o| o.pid),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn owner(&self) -> &LockOwner {
        &self.owner
    }
}

impl Drop for RecordLock {
    fn drop(&mut self) {
        // Only our own lock: if our lease ran out and someone broke and
        // retook it, the file is theirs now.
        if read_owner(&self.path).as_ref() == Some(&self.owner) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Removes the stale lock at `path`, but only if it still is the one judged
/// stale: breakers serialise on a `flock`, and each re-reads under it, so
/// two breakers never remove a lock one of them just took.
fn break_stale(locks: &Path, path: &Path, judged: Option<&LockOwner>) -> Result<(), RepoError> {
    let breaker = locks.join("breaker.flock");
    let _guard = Flock::open(&breaker, libc::LOCK_EX)?;
    let now = read_owner(path);
    let still_same = match (&now, judged) {
        (Some(n), Some(j)) => n == j,
        (None, None) => path.exists(),
        _ => false,
    };
    if still_same {
        tracing::warn!(lock = %path.display(), owner = ?judged, "breaking stale snapshot lock");
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing stale lock", path)(e)),
        }
    }
    Ok(())
}

/// A `flock` held on an open file; released when dropped (or when the
/// process dies).
#[derive(Debug)]
pub struct Flock {
    _file: std::fs::File,
}

impl Flock {
    fn open(path: &Path, op: libc::c_int) -> Result<Self, RepoError> {
        Self::try_open(path, op)?.ok_or_else(|| RepoError::Busy {
            path: path.to_path_buf(),
        })
    }

    /// `None` when `op` has `LOCK_NB` and someone else holds it.
    fn try_open(path: &Path, op: libc::c_int) -> Result<Option<Self>, RepoError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io("opening lock", path))?;
        loop {
            // SAFETY: flock on a descriptor we own.
            let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
            if rc == 0 {
                return Ok(Some(Self { _file: file }));
            }
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => return Ok(None),
                _ => return Err(io("taking lock", path)(err)),
            }
        }
    }
}

/// The repository gate (see the module documentation).
pub struct RepoGate;

impl RepoGate {
    /// Held by every writer for the length of its operation.
    pub(crate) fn shared(locks: &Path) -> Result<Flock, RepoError> {
        Flock::open(&locks.join("repo.gate"), libc::LOCK_SH)
    }

    /// Held by `repair`; `None` while a writer is active.
    pub(crate) fn try_exclusive(locks: &Path) -> Result<Option<Flock>, RepoError> {
        Flock::try_open(&locks.join("repo.gate"), libc::LOCK_EX | libc::LOCK_NB)
    }

    /// Waits for writers to finish, up to `wait`.
    pub(crate) fn exclusive(locks: &Path, wait: Duration) -> Result<Flock, RepoError> {
        let started = Instant::now();
        loop {
            if let Some(f) = Self::try_exclusive(locks)? {
                return Ok(f);
            }
            if started.elapsed() >= wait {
                return Err(RepoError::Busy {
                    path: locks.join("repo.gate"),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
