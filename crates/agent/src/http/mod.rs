//! The plain HTTP endpoints of envd: `/health`, `/init`, `/envs`, `/files`.
//!
//! Errors are JSON `{"code": <int status>, "message": "..."}`: the SDK reads
//! `message` and crashes on bodies it cannot parse.

mod auth;
mod files;
mod init;
mod metrics;
pub mod sysinit;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::rpc::{Code, RpcError};
use crate::state::AgentState;

pub use auth::signature;

/// The HTTP routes; the Connect services are mounted beside them by the caller.
pub fn routes() -> Router<AgentState> {
    Router::new()
        .route("/health", get(health))
        .route("/init", post(init::init))
        .route("/envs", get(init::envs))
        .route("/metrics", get(metrics::metrics))
        .route(
            "/files",
            // Uploads are streamed to disk, so no body limit applies.
            get(files::download)
                .post(files::upload)
                .layer(DefaultBodyLimit::disable()),
        )
}

/// Liveness: 204 without authentication (the SDK's `is_running`).
async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// An error answered as `{"code": status, "message": ...}`.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {message}")]
pub struct HttpError {
    pub status: StatusCode,
    pub message: String,
}

impl HttpError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    /// The status the SDK expects for an I/O failure on `path`: 404 missing,
    /// 403 refused, 507 disk full (`NotEnoughSpaceException`), 400 for a
    /// path of the wrong kind, else 500.
    pub fn from_io(e: &std::io::Error, path: &std::path::Path) -> Self {
        use std::io::ErrorKind;
        let status = match (e.kind(), e.raw_os_error()) {
            (ErrorKind::NotFound, _) => StatusCode::NOT_FOUND,
            (ErrorKind::PermissionDenied, _) => StatusCode::FORBIDDEN,
            (_, Some(libc::ENOSPC)) | (_, Some(libc::EDQUOT)) => StatusCode::INSUFFICIENT_STORAGE,
            (_, Some(libc::ENOTDIR)) | (_, Some(libc::EISDIR)) | (_, Some(libc::ENAMETOOLONG)) => {
                StatusCode::BAD_REQUEST
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, format!("{}: {e}", path.display()))
    }

    /// The HTTP form of an RPC-layer error (for example an unknown user).
    pub fn from_rpc(e: RpcError) -> Self {
        let status = match e.code {
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            c => StatusCode::from_u16(c.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        };
        Self::new(status, e.message)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, Json(body)).into_response()
    }
}
