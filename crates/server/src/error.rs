//! API errors: JSON `{"code": <int>, "message": <str>}`, as the E2B SDK parses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use siesta_sandbox::Error;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// E2B's machine-readable `error_code`, where the SDK acts on one.
    pub error_code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            error_code: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        if let Some(code) = self.error_code {
            body["error_code"] = code.into();
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::TemplateNotFound { .. } | Error::SandboxNotFound { .. } => StatusCode::NOT_FOUND,
            Error::WrongState { .. } => StatusCode::CONFLICT,
            Error::Invalid(_) => StatusCode::BAD_REQUEST,
            // The SDK turns this code into GuestUnresponsiveException.
            Error::GuestNotReady { .. } => {
                let mut err = Self::new(StatusCode::CONFLICT, e.to_string());
                err.error_code = Some("sandbox_snapshot_guest_agent_unresponsive");
                return err;
            }
            Error::Incompatible { .. } => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }
}
