//! Node endpoints: health, Prometheus metrics, the OpenAPI document.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;

use super::AppState;
use siesta_sandbox::sandbox::SandboxState;
use siesta_sandbox::store::ListQuery;

pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// Prometheus text format: sandboxes by state, lifecycle counters and one
/// histogram per resume stage.
pub async fn prometheus(State(st): State<AppState>) -> impl IntoResponse {
    let mut by_state = Vec::new();
    for state in [
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Dead,
    ] {
        let q = ListQuery {
            states: vec![state],
            limit: Some(siesta_sandbox::store::MAX_LIMIT),
            ..Default::default()
        };
        let n = st.manager.list_page(&q).map(|(v, _)| v.len()).unwrap_or(0);
        by_state.push((state.as_str(), n));
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(&by_state),
    )
}

/// The API's OpenAPI 3 document (`docs/openapi.yaml`).
pub async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/yaml")],
        include_str!("../../../../docs/openapi.yaml"),
    )
}
