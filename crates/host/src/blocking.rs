//! Blocking work kept off the async worker threads.
//!
//! SQLite waits for its fsyncs, the repository fsyncs every file and
//! directory it publishes and sleeps while another writer holds a lock,
//! and hashing reads whole files. On an async worker any of these would
//! stall every request that worker serves (`/health` included) for as long
//! as the disk takes; here they run on tokio's blocking threads instead.

use crate::error::HostError;

/// Runs `f` on a blocking thread. `what` names the work in the error a
/// panic in it becomes ([`HostError::Internal`], in the caller's error
/// type).
pub async fn run<T, E, F>(what: &str, f: F) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<HostError> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        E::from(HostError::Internal {
            what: what.to_string(),
            detail: e.to_string(),
        })
    })?
}
