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

impl ApiError {
    /// What the client reads: `{"code", "message", "error_code"?}`.
    pub fn body(self) -> crate::routes::model::Error {
        crate::routes::model::Error {
            code: self.status.as_u16(),
            message: self.message,
            error_code: self.error_code,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// A template's error answers as the sandbox layer's of the same kind.
impl From<siesta_template::Error> for ApiError {
    fn from(e: siesta_template::Error) -> Self {
        Error::from(e).into()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        if e.is_missing_dependency() {
            return Self::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
        }
        if e.is_node_full() {
            return Self::new(StatusCode::TOO_MANY_REQUESTS, e.to_string());
        }
        let status = match &e {
            Error::TemplateNotFound { .. } | Error::SandboxNotFound { .. } => StatusCode::NOT_FOUND,
            Error::WrongState { .. } | Error::KeyConflict { .. } => StatusCode::CONFLICT,
            Error::Invalid(_) => StatusCode::BAD_REQUEST,
            // The shared store failed us, not the request.
            Error::Remote { .. } | Error::RemoteWrite { .. } => StatusCode::BAD_GATEWAY,
            // The SDK turns this code into GuestUnresponsiveException.
            Error::GuestNotReady { .. } => {
                let mut err = Self::new(StatusCode::CONFLICT, e.to_string());
                err.error_code = Some("sandbox_snapshot_guest_agent_unresponsive");
                return err;
            }
            Error::Incompatible { .. } => StatusCode::CONFLICT,
            // The SDK's ServiceBusyException: the sandbox runs on.
            Error::GuestUnresponsive { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Error::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_host_tool_is_503_naming_the_package() {
        let e = Error::MissingTool {
            command: "qemu-img".into(),
            package: "qemu-utils".into(),
            used_for: "creates each sandbox's copy-on-write disk".into(),
        };
        let api = ApiError::from(e);
        assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(api.message.contains("qemu-img") && api.message.contains("qemu-utils"));
    }

    #[test]
    fn a_vmm_binary_that_cannot_start_is_503() {
        let e = Error::Vmm {
            id: "sbx".into(),
            source: Box::new(siesta_vmm::VmmError::Spawn {
                id: "sbx".into(),
                binary: "qemu-system-x86_64".into(),
                netns: None,
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }),
        };
        assert_eq!(ApiError::from(e).status, StatusCode::SERVICE_UNAVAILABLE);
        let other = Error::Command {
            what: "x".into(),
            detail: "y".into(),
        };
        assert_eq!(
            ApiError::from(other).status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn faults_of_siesta_are_500_a_stop_503_and_conflicts_409() {
        let status = |e: Error| ApiError::from(e).status;
        let internal = Error::Internal {
            what: "pausing x".into(),
            detail: "the operation panicked".into(),
        };
        assert_eq!(status(internal), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(status(Error::ShuttingDown), StatusCode::SERVICE_UNAVAILABLE);
        let wrong = Error::WrongState {
            id: "x".into(),
            state: "paused".into(),
            expected: "running",
        };
        assert_eq!(status(wrong), StatusCode::CONFLICT);
        let key = Error::KeyConflict {
            key: "k".into(),
            detail: "d".into(),
        };
        assert_eq!(status(key), StatusCode::CONFLICT);
        assert_eq!(
            status(Error::Invalid("bad".into())),
            StatusCode::BAD_REQUEST
        );
        let missing = Error::SandboxNotFound { id: "x".into() };
        assert_eq!(status(missing), StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_full_node_is_429_naming_max_slots() {
        let e = Error::NodeFull {
            wanted: 8,
            room: 3,
            max_slots: 64,
        };
        let api = ApiError::from(e);
        assert_eq!(api.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(api.message.contains("room for 3") && api.message.contains("max_slots"));
        let e = Error::Net {
            id: "sbx".into(),
            source: siesta_net::NetError::Exhausted {
                tag: "s".into(),
                capacity: 64,
            },
        };
        let api = ApiError::from(e);
        assert_eq!(api.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(api.message.contains("max_slots"), "{}", api.message);
    }
}
