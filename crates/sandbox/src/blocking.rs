//! Blocking work kept off the async worker threads.
//!
//! SQLite waits for its fsyncs, the repository fsyncs every file and
//! directory it publishes and sleeps while another writer holds a lock,
//! and hashing reads whole files. On an async worker any of these would
//! stall every request that worker serves (`/health` included) for as long
//! as the disk takes; here they run on tokio's blocking threads instead.

use siesta_snapshot::Repository;

use crate::error::{Error, Result};

/// Runs `f` on a blocking thread. `what` names the work in the error a
/// panic in it becomes.
pub async fn run<T, F>(what: &str, f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal {
            what: what.to_string(),
            detail: e.to_string(),
        })?
}

/// Runs `f` with the snapshot repository on a blocking thread.
pub async fn repo<T, F>(repo: &Repository, what: &str, f: F) -> Result<T>
where
    F: FnOnce(&Repository) -> std::result::Result<T, siesta_snapshot::RepoError> + Send + 'static,
    T: Send + 'static,
{
    let repo = repo.clone();
    run(what, move || Ok(f(&repo)?)).await
}
