//! Where a sandbox is: the address at which this host reaches it, resuming
//! it first when it is paused and asked for that (E2B's `autoResume`).

use std::net::IpAddr;
use std::sync::Arc;

use siesta_sandbox::sandbox::SandboxState;
use siesta_sandbox::{Error, SandboxManager};

/// Why a sandbox cannot be reached. The messages are part of the wire
/// contract: the SDK maps a 502 whose message contains "was not found" to
/// `SandboxNotRunningException` (`e2b-contract.md` §3.1).
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("The sandbox {id} was not found")]
    NotFound { id: String },
    #[error("The sandbox {id} is paused and could not be resumed: {detail}")]
    ResumeFailed { id: String, detail: String },
    /// The SDK treats this like a missing sandbox (not running), as it is.
    #[error("The sandbox {id} was not found running: its VM is gone")]
    Dead { id: String },
    #[error("The sandbox {id} is not reachable: {detail}")]
    Unavailable { id: String, detail: String },
    /// Paused without auto-resume: traffic does not wake it. The SDK's
    /// `is_running()` reads the 502 as "not running", which it is.
    #[error("The sandbox {id} was not found running: it is paused (Sandbox.connect() resumes it; create it with auto-resume to resume on traffic)")]
    Paused { id: String },
    /// Paused or killed while a request to it waited for an answer.
    #[error(
        "The sandbox {id} was not found running: it stopped (paused or killed) before it answered"
    )]
    Stopped { id: String },
}

/// Looks sandboxes up for the proxy.
#[async_trait::async_trait]
pub trait SandboxTargets: Send + Sync + 'static {
    /// The IP address of running sandbox `id` (every port on it reaches the
    /// guest), after resuming it if it was paused.
    async fn address(&self, id: &str) -> Result<IpAddr, TargetError>;

    /// Ids of sandboxes whose VM stops from now on: streams to them end
    /// when theirs does. By default nothing ever stops.
    fn stopped(&self) -> tokio::sync::broadcast::Receiver<String> {
        tokio::sync::broadcast::channel(1).1
    }

    /// The traffic access token that requests to sandbox `id`'s ports must
    /// carry, if it has one (E2B's `allowPublicTraffic: false`). By default
    /// none.
    async fn traffic_token(&self, _id: &str) -> Option<String> {
        None
    }

    /// The sandbox whose access token made `signed` (a signed file URL
    /// that names no sandbox). By default none.
    async fn signed_by(&self, _signed: &super::SignedFiles) -> Option<String> {
        None
    }
}

/// The node's sandboxes, through its manager.
pub struct ManagerTargets(pub Arc<SandboxManager>);

#[async_trait::async_trait]
impl SandboxTargets for ManagerTargets {
    async fn address(&self, id: &str) -> Result<IpAddr, TargetError> {
        let not_found = || TargetError::NotFound { id: id.to_string() };
        // Two rounds: a concurrent request may resume the sandbox between
        // our look-up and our resume, which then reports the wrong state.
        for _ in 0..2 {
            let info = match self.0.get(id).await {
                Ok(info) => info,
                Err(Error::SandboxNotFound { .. }) => return Err(not_found()),
                Err(e) => return Err(unavailable(id, e)),
            };
            if info.state == SandboxState::Dead {
                return Err(TargetError::Dead { id: id.to_string() });
            }
            // A disk-only pause comes back by a cold boot, which only an
            // explicit connect asks for (as in E2B).
            let auto = info.lifecycle.auto_resume && !info.paused_disk_only;
            if info.state == SandboxState::Paused && !auto {
                return Err(TargetError::Paused { id: id.to_string() });
            }
            if info.state == SandboxState::Paused {
                tracing::info!(
                    sandbox = id,
                    "auto-resuming paused sandbox for a proxied request"
                );
                match self.0.resume(id).await {
                    Ok(info) => return running_address(id, info.agent_addr),
                    Err(Error::SandboxNotFound { .. }) => return Err(not_found()),
                    Err(Error::WrongState { .. }) => continue,
                    Err(e) => {
                        return Err(TargetError::ResumeFailed {
                            id: id.to_string(),
                            detail: e.to_string(),
                        })
                    }
                }
            }
            return running_address(id, info.agent_addr);
        }
        Err(unavailable(id, "its state keeps changing"))
    }

    fn stopped(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.0.node().subscribe_stopped()
    }

    async fn traffic_token(&self, id: &str) -> Option<String> {
        self.0.get(id).await.ok()?.traffic_token
    }

    async fn signed_by(&self, signed: &super::SignedFiles) -> Option<String> {
        // One SHA-256 per live sandbox: cheap next to the request itself.
        self.0
            .list()
            .await
            .into_iter()
            .filter(|s| s.state != SandboxState::Dead)
            .find(|s| signed.signed_with(&s.access_token))
            .map(|s| s.id)
    }
}

fn running_address(id: &str, addr: Option<std::net::SocketAddr>) -> Result<IpAddr, TargetError> {
    addr.map(|a| a.ip())
        .ok_or_else(|| unavailable(id, "it has no network address (is it running?)"))
}

fn unavailable(id: &str, detail: impl std::fmt::Display) -> TargetError {
    TargetError::Unavailable {
        id: id.to_string(),
        detail: detail.to_string(),
    }
}
