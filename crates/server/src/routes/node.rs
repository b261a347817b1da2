//! Node endpoints: health, Prometheus metrics, the OpenAPI document.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;

use super::AppState;

/// Whether the node is up.
#[utoipa::path(
    get, path = "/health", tag = "node", security(()),
    responses((status = 200, description = "the node is up")),
)]
pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// Prometheus metrics (OpenMetrics text): sandboxes by state, lifecycle
/// counters and one histogram per resume stage. Behind the API key: the
/// counts and timings describe every tenant's use of the node (Prometheus
/// sends the key as a bearer token, `authorization.credentials_file`).
#[utoipa::path(
    get, path = "/metrics", tag = "node",
    responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text")),
)]
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

/// This document (OpenAPI 3, YAML), made from the server's code.
#[utoipa::path(
    get, path = "/openapi.yaml", tag = "node", security(()),
    responses((status = 200, description = "the OpenAPI 3 document", content_type = "application/yaml")),
)]
pub async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/yaml")],
        super::openapi::yaml(),
    )
}
