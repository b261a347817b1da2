//! What the proxy answers when it cannot forward: JSON
//! `{"code","message","sandboxId"?}` like the rest of the API, 502 for a
//! sandbox or port that cannot be reached (the SDK reads the message, see
//! `e2b-contract.md` §3.1), 400 for a request that names a sandbox wrongly,
//! 401 for a request to a paused sandbox's envd without its token, 403
//! for a private port without the traffic token.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::route::RouteError;
use super::target::TargetError;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error("{source}")]
    Target {
        id: String,
        #[source]
        source: TargetError,
    },
    /// Nothing listens on the port (or the guest does not answer at all).
    #[error("The sandbox {id} is running but port is not open: {port} ({detail})")]
    PortNotOpen {
        id: String,
        port: u16,
        detail: String,
    },
    /// The connection broke or the guest answered with something that is
    /// not HTTP.
    #[error("The sandbox {id} did not answer on port {port}: {detail}")]
    Upstream {
        id: String,
        port: u16,
        detail: String,
    },
    #[error("invalid request for sandbox {id}: {detail}")]
    BadRequest { id: String, detail: String },
    /// The sandbox's ports are private and the request lacks its token.
    #[error("The sandbox {id} requires a traffic access token for port {port}: send it in the e2b-traffic-access-token header (Sandbox.traffic_access_token)")]
    TrafficToken { id: String, port: u16 },
}

impl ProxyError {
    fn status(&self) -> StatusCode {
        match self {
            ProxyError::Route(_) | ProxyError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ProxyError::TrafficToken { .. } => StatusCode::FORBIDDEN,
            ProxyError::Target {
                source: TargetError::Unauthorized { .. },
                ..
            } => StatusCode::UNAUTHORIZED,
            ProxyError::Target { .. }
            | ProxyError::PortNotOpen { .. }
            | ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    fn sandbox_id(&self) -> Option<&str> {
        match self {
            ProxyError::Route(_) => None,
            ProxyError::Target { id, .. }
            | ProxyError::PortNotOpen { id, .. }
            | ProxyError::Upstream { id, .. }
            | ProxyError::BadRequest { id, .. }
            | ProxyError::TrafficToken { id, .. } => Some(id),
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let status = self.status();
        // A missing sandbox or closed port is the client's business (the SDK
        // probes with /health); a broken guest or failed resume is ours.
        match &self {
            ProxyError::Target {
                source:
                    TargetError::NotFound { .. }
                    | TargetError::Dead { .. }
                    | TargetError::Paused { .. }
                    | TargetError::Unauthorized { .. }
                    | TargetError::Stopped { .. },
                ..
            }
            | ProxyError::PortNotOpen { .. }
            | ProxyError::Route(_)
            | ProxyError::BadRequest { .. }
            | ProxyError::TrafficToken { .. } => tracing::debug!("proxy: {self}"),
            _ => tracing::warn!("proxy: {self}"),
        }
        let mut body = serde_json::json!({"code": status.as_u16(), "message": self.to_string()});
        if let (Some(id), Some(obj)) = (self.sandbox_id(), body.as_object_mut()) {
            obj.insert("sandboxId".into(), id.into());
        }
        (status, Json(body)).into_response()
    }
}
