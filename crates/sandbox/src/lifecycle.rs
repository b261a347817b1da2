//! Sandbox lifecycle: timeouts and the reaper.
//!
//! Every running sandbox has a deadline (`end_at`), set at create and
//! resume (`timeout`, default 300 s) and by `set_timeout`. A background task
//! wakes every [`TICK`] and
//! - pauses (default; E2B `autoPause`) or kills (`onTimeout: kill`) each
//!   running sandbox whose deadline passed, all of them concurrently;
//! - marks dead each running sandbox whose VMM process exited by itself
//!   (killed, crashed), freeing its slot: it is reported, not dropped.
//!
//! The task holds the manager only weakly, so dropping the manager ends it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::manager::SandboxManager;
use crate::memory_save::SaveMemory;
use crate::paused::PauseMode;
use crate::sandbox::{OnTimeout, SandboxInfo, SandboxState};
use crate::store;

/// Timeout of a sandbox created or resumed without one (as E2B).
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// The longest timeout accepted: a day.
pub const MAX_TIMEOUT_SECS: u64 = 24 * 3600;
/// How often the reaper looks.
pub const TICK: Duration = Duration::from_millis(500);
/// When a timeout pause fails, the next attempt waits this long rather than
/// retrying every tick.
const RETRY_SECS: i64 = 30;

/// The timeout for `secs` (default if `None`), checked against the bounds.
pub(crate) fn deadline(secs: Option<u64>) -> Result<chrono::Duration> {
    let secs = secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if secs > MAX_TIMEOUT_SECS {
        return Err(Error::Invalid(format!(
            "timeout {secs} s is longer than the maximum, {MAX_TIMEOUT_SECS} s"
        )));
    }
    Ok(chrono::Duration::seconds(secs as i64))
}

/// The reaper task's handle and stop signal.
pub(crate) struct Reaper {
    stop: watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Default for Reaper {
    fn default() -> Self {
        Self {
            stop: watch::channel(false).0,
            task: std::sync::Mutex::new(None),
        }
    }
}

impl Reaper {
    pub(crate) fn start(&self, manager: Weak<SandboxManager>) {
        let mut stop = self.stop.subscribe();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(TICK) => {}
                    _ = stop.changed() => return,
                }
                let Some(m) = manager.upgrade() else { return };
                m.reap_once().await;
            }
        });
        if let Ok(mut t) = self.task.lock() {
            *t = Some(task);
        }
    }

    /// Stops the task and waits until a tick in progress has finished, so
    /// nothing it started races the caller.
    pub(crate) async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl SandboxManager {
    /// E2B's refresh: keeps a running sandbox alive at least `secs` more
    /// seconds (a later deadline is kept).
    pub(crate) async fn refresh_op(&self, id: &str, secs: u64) -> Result<SandboxInfo> {
        let wanted = Utc::now() + deadline(Some(secs))?;
        let mut sb = self.lock(id).await?;
        if sb.record.state != SandboxState::Running {
            return Err(crate::manager::wrong_state(&sb, "running"));
        }
        if sb.record.end_at < wanted {
            let before = std::mem::replace(&mut sb.record.end_at, wanted);
            if let Err(e) = self.save_record(&sb.record).await {
                sb.record.end_at = before;
                return Err(e);
            }
        }
        Ok(sb.info())
    }

    /// One reaper pass: dead VMMs first (a dead one need not be paused),
    /// then expired deadlines.
    pub(crate) async fn reap_once(self: &Arc<Self>) {
        self.find_dead_vmms().await;
        let expired = store::db(&self.store, "finding expired sandboxes", |s| {
            s.expired(Utc::now())
        });
        let expired = match expired.await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::error!("reaper: {e}");
                return;
            }
        };
        let due = expired.iter().map(|id| self.on_timeout(id));
        futures::future::join_all(due).await;
    }

    /// Marks dead every running sandbox whose VMM exited. Busy sandboxes
    /// (locked by an operation) are looked at on a later tick.
    async fn find_dead_vmms(&self) {
        let entries: Vec<_> = self.sandboxes.lock().await.values().cloned().collect();
        for entry in entries {
            let Ok(mut sb) = entry.try_lock() else {
                continue;
            };
            let Some(running) = sb.running.as_mut() else {
                continue;
            };
            if let Some(status) = running.vm.try_exit_status() {
                let reason = format!("its VMM exited unexpectedly ({status})");
                self.mark_dead(&mut sb, reason).await;
            }
        }
    }

    /// Applies sandbox `id`'s timeout action if its deadline is still past
    /// once it is locked (a `set_timeout` may have moved it meanwhile).
    async fn on_timeout(&self, id: &str) {
        let Ok(mut sb) = self.lock(id).await else {
            return;
        };
        if sb.record.state != SandboxState::Running || sb.record.end_at > Utc::now() {
            return;
        }
        let action = sb.record.lifecycle.on_timeout;
        tracing::info!(sandbox = %id, action = action.as_str(), "timeout");
        let done = match action {
            OnTimeout::Pause => {
                let mode = if sb.record.lifecycle.filesystem_only {
                    PauseMode::DiskOnly
                } else {
                    PauseMode::Memory(SaveMemory::Changed)
                };
                self.pause_locked(&mut sb, mode).await.map(drop)
            }
            OnTimeout::Kill => self.kill_locked(&mut sb).await,
        };
        if let Err(e) = done {
            tracing::error!(sandbox = %id, "timeout {}: {e}", action.as_str());
            if sb.record.state == SandboxState::Running {
                sb.record.end_at = Utc::now() + chrono::Duration::seconds(RETRY_SECS);
                if let Err(e) = self.save_record(&sb.record).await {
                    tracing::error!(sandbox = %id, "postponing timeout: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_default_and_are_bounded() {
        assert_eq!(deadline(None).unwrap().num_seconds(), 300);
        assert_eq!(deadline(Some(2)).unwrap().num_seconds(), 2);
        assert!(deadline(Some(MAX_TIMEOUT_SECS)).is_ok());
        assert!(matches!(
            deadline(Some(MAX_TIMEOUT_SECS + 1)),
            Err(Error::Invalid(_))
        ));
    }
}
