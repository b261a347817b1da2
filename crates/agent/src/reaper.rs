//! Reaping children when the agent is PID 1.
//!
//! As PID 1 the agent inherits every orphan in the guest and must reap them,
//! or zombies pile up. The only way to reap unknown pids is `waitpid(-1)`,
//! which would also steal the exit status of processes the process service
//! is waiting for. So, while the reaper runs, **it is the only caller of
//! `waitpid`**, and it hands each status to whoever asked for that pid:
//!
//! ```ignore
//! // In the process service, after spawning `child`:
//! let status = if reaper::is_active() {
//!     reaper::wait(pid).await          // never call child.wait() here
//! } else {
//!     child.wait().await?               // not PID 1: tokio reaps as usual
//! };
//! ```
//!
//! A child may exit before its spawner calls [`wait`]; its status is kept
//! (the newest [`UNCLAIMED_LIMIT`] of them) so the later `wait` still gets
//! it. Orphans nobody waits for age out of that buffer.

use std::collections::{HashMap, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Mutex, OnceLock};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

/// Statuses of exited children nobody has asked for yet.
pub const UNCLAIMED_LIMIT: usize = 4096;

#[derive(Default)]
struct Table {
    waiting: HashMap<i32, Vec<oneshot::Sender<ExitStatus>>>,
    unclaimed: HashMap<i32, ExitStatus>,
    order: VecDeque<i32>,
}

static REAPER: OnceLock<Mutex<Table>> = OnceLock::new();

fn table() -> std::sync::MutexGuard<'static, Table> {
    REAPER
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether [`start`] has run: then `waitpid` belongs to the reaper.
pub fn is_active() -> bool {
    ACTIVE.get().is_some()
}

static ACTIVE: OnceLock<()> = OnceLock::new();

/// Starts reaping on every SIGCHLD. Call once, inside the tokio runtime,
/// before any child is spawned.
pub fn start() -> std::io::Result<()> {
    let mut sigchld = signal(SignalKind::child())?;
    let _ = ACTIVE.set(());
    tokio::spawn(async move {
        loop {
            // One signal may stand for many exits: drain them all.
            reap_all();
            if sigchld.recv().await.is_none() {
                return;
            }
        }
    });
    Ok(())
}

/// Waits for child `pid` to exit and returns its status. Only valid while
/// the reaper is active (see the module docs).
pub async fn wait(pid: i32) -> ExitStatus {
    let rx = {
        let mut t = table();
        if let Some(status) = t.unclaimed.remove(&pid) {
            t.order.retain(|p| *p != pid);
            return status;
        }
        let (tx, rx) = oneshot::channel();
        t.waiting.entry(pid).or_default().push(tx);
        rx
    };
    // The sender only goes away if the process table is torn down, which
    // does not happen while the agent runs; report a kill then.
    rx.await
        .unwrap_or_else(|_| ExitStatus::from_raw(libc::SIGKILL))
}

/// Reaps every exited child without blocking and delivers the statuses.
fn reap_all() {
    loop {
        let mut raw = 0;
        // SAFETY: plain syscall; raw is a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
        if pid <= 0 {
            // 0: children remain but none exited; -1: ECHILD (none left).
            return;
        }
        deliver(pid, ExitStatus::from_raw(raw));
    }
}

fn deliver(pid: i32, status: ExitStatus) {
    let mut t = table();
    if let Some(waiters) = t.waiting.remove(&pid) {
        for w in waiters {
            let _ = w.send(status);
        }
        return;
    }
    if t.unclaimed.insert(pid, status).is_none() {
        t.order.push_back(pid);
    }
    while t.order.len() > UNCLAIMED_LIMIT {
        if let Some(old) = t.order.pop_front() {
            t.unclaimed.remove(&old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the table is global, and a concurrent flood would evict the
    // status the other half waits for.
    #[tokio::test]
    async fn delivers_before_and_after_wait_and_stays_bounded() {
        // Exit before anyone waits: kept for the later wait.
        deliver(900_001, ExitStatus::from_raw(3 << 8));
        assert_eq!(wait(900_001).await.code(), Some(3));
        // Wait first, exit later.
        let waiter = tokio::spawn(wait(900_002));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        deliver(900_002, ExitStatus::from_raw(libc::SIGTERM));
        assert_eq!(waiter.await.unwrap().signal(), Some(libc::SIGTERM));

        for i in 0..(UNCLAIMED_LIMIT as i32 + 10) {
            deliver(800_000 + i, ExitStatus::from_raw(0));
        }
        let t = table();
        assert!(t.unclaimed.len() <= UNCLAIMED_LIMIT);
        assert!(!t.unclaimed.contains_key(&800_000));
    }
}
