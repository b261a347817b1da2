//! Where a sandbox is: the address at which this host reaches it, or that
//! it is paused, and resuming it (E2B's `autoResume`) when the proxy asks.

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
    /// Paused, and the request does not show its envd access token: it
    /// neither wakes it nor learns more.
    #[error("The sandbox {id} is paused: only a request with its access token (X-Access-Token, or a signed URL) resumes it")]
    Unauthorized { id: String },
    /// Paused or killed while a request to it waited for an answer.
    #[error(
        "The sandbox {id} was not found running: it stopped (paused or killed) before it answered"
    )]
    Stopped { id: String },
}

/// A sandbox as the front door sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub state: TargetState,
    /// Its envd access token: what a request to envd's port must show to
    /// wake it when it is paused.
    pub access_token: String,
    /// The token requests to its other ports must carry, if it has one
    /// (E2B's `allowPublicTraffic: false`).
    pub traffic_token: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetState {
    /// Running: every port at this address reaches the guest.
    Running(IpAddr),
    /// Paused; `auto_resume`: traffic may resume it (E2B's `autoResume`).
    Paused { auto_resume: bool },
}

/// Looks sandboxes up for the proxy. What may wake a paused one is decided
/// by the proxy, not here.
#[async_trait::async_trait]
pub trait SandboxTargets: Send + Sync + 'static {
    /// Sandbox `id`: running (and where) or paused, and its tokens.
    async fn target(&self, id: &str) -> Result<Target, TargetError>;

    /// Resumes paused sandbox `id` and returns its address; `None` when it
    /// was no longer paused (another request resumed it): look again.
    async fn resume(&self, id: &str) -> Result<Option<IpAddr>, TargetError>;

    /// Ids of sandboxes whose VM stops from now on: streams to them end
    /// when theirs does. By default nothing ever stops.
    fn stopped(&self) -> tokio::sync::broadcast::Receiver<String> {
        tokio::sync::broadcast::channel(1).1
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
    async fn target(&self, id: &str) -> Result<Target, TargetError> {
        let info = match self.0.get(id).await {
            Ok(info) => info,
            Err(Error::SandboxNotFound { .. }) => {
                return Err(TargetError::NotFound { id: id.to_string() })
            }
            Err(e) => return Err(unavailable(id, e)),
        };
        let state = match info.state {
            SandboxState::Dead => return Err(TargetError::Dead { id: id.to_string() }),
            SandboxState::Running => TargetState::Running(running_address(id, info.agent_addr)?),
            // A disk-only pause comes back by a cold boot, which only an
            // explicit connect asks for (as in E2B).
            SandboxState::Paused => TargetState::Paused {
                auto_resume: info.lifecycle.auto_resume && !info.paused_disk_only,
            },
        };
        Ok(Target {
            state,
            access_token: info.access_token,
            traffic_token: info.traffic_token,
        })
    }

    async fn resume(&self, id: &str) -> Result<Option<IpAddr>, TargetError> {
        tracing::info!(
            sandbox = id,
            "auto-resuming paused sandbox for a proxied request"
        );
        match self.0.resume(id).await {
            Ok(info) => running_address(id, info.agent_addr).map(Some),
            Err(Error::SandboxNotFound { .. }) => Err(TargetError::NotFound { id: id.to_string() }),
            Err(Error::WrongState { .. }) => Ok(None),
            Err(e) => Err(TargetError::ResumeFailed {
                id: id.to_string(),
                detail: e.to_string(),
            }),
        }
    }

    fn stopped(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.0.node().subscribe_stopped()
    }

    async fn signed_by(&self, signed: &super::SignedFiles) -> Option<String> {
        // From memory, no table read (a keyless request), and one SHA-256
        // per live sandbox: cheap next to the request itself.
        self.0
            .live_access_tokens()
            .into_iter()
            .find(|(_, token)| signed.signed_with(token))
            .map(|(id, _)| id)
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
