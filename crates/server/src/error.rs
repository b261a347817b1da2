//! API errors: JSON `{"code": <int>, "message": <str>}`, as the E2B SDK parses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use siesta_sandbox::Error;

pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::TemplateNotFound { .. } | Error::SandboxNotFound { .. } => StatusCode::NOT_FOUND,
            Error::WrongState { .. } => StatusCode::CONFLICT,
            Error::Invalid(_) => StatusCode::BAD_REQUEST,
            Error::GuestNotReady { .. } => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }
}
