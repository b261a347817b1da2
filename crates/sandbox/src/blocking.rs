//! Blocking work kept off the async worker threads: `run` is
//! `siesta_host::blocking::run` (why, there); `repo` gives it the snapshot
//! repository.

use siesta_snapshot::Repository;

use crate::error::Result;

pub use siesta_host::blocking::run;

/// Runs `f` with the snapshot repository on a blocking thread.
pub async fn repo<T, F>(repo: &Repository, what: &str, f: F) -> Result<T>
where
    F: FnOnce(&Repository) -> std::result::Result<T, siesta_snapshot::RepoError> + Send + 'static,
    T: Send + 'static,
{
    let repo = repo.clone();
    run(what, move || Ok(f(&repo)?)).await
}
