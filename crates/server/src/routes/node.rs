//! Node endpoints: health, Prometheus metrics, the OpenAPI document.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;

use super::AppState;

pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// Prometheus text format: sandboxes by state, lifecycle counters and one
/// histogram per resume stage.
pub async fn prometheus(State(st): State<AppState>) -> impl IntoResponse {
    // Every sandbox counted, not a page of them.
    let by_state: Vec<(&str, usize)> = match st.manager.count_by_state().await {
        Ok(counts) => counts
            .into_iter()
            .map(|(state, n)| (state.as_str(), n as usize))
            .collect(),
        Err(e) => {
            tracing::error!("counting sandboxes for the metrics: {e}");
            Vec::new()
        }
    };
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
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
