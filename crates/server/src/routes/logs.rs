//! `GET /sandboxes/{id}/logs` (v1) and `/v2/sandboxes/{id}/logs`: the
//! guest's console (its kernel's and its agent's messages) while it runs.
//! The console has no per-line times: every entry carries the time it was
//! read, at level `info`.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;
use crate::error::ApiError;

const DEFAULT_LIMIT: usize = 1000;
const MAX_LIMIT: usize = 10_000;

/// The console's last lines (v1).
#[utoipa::path(
    get, path = "/sandboxes/{id}/logs", tag = "sandboxes", operation_id = "logs_v1", params(("id" = String, Path, description = "the sandbox's id"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 10000, description = "the last this many lines (default 1000)")),
    responses(
        (status = 200, description = "`{logs: [{timestamp, line}], logEntries}`", body = Object),
        (status = 400, description = "a bad limit", body = super::model::Error),
        (status = 404, description = "no such sandbox", body = super::model::Error),
    ),
)]
pub async fn v1(
    State(st): State<AppState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let lines = console(&st, &id, raw.as_deref()).await?;
    let now = chrono::Utc::now().to_rfc3339();
    let logs: Vec<Value> = lines
        .iter()
        .map(|l| json!({"timestamp": now, "line": l}))
        .collect();
    let entries = entries(&lines, &now);
    Ok(Json(json!({"logs": logs, "logEntries": entries})))
}

/// The console's last lines (v2).
#[utoipa::path(
    get, path = "/v2/sandboxes/{id}/logs", tag = "sandboxes", operation_id = "logs_v2", params(("id" = String, Path, description = "the sandbox's id"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 10000, description = "the last this many lines (default 1000)")),
    responses(
        (status = 200, description = "`{logs: [{timestamp, level, message, fields}]}`", body = Object),
        (status = 400, description = "a bad limit", body = super::model::Error),
        (status = 404, description = "no such sandbox", body = super::model::Error),
    ),
)]
pub async fn v2(
    State(st): State<AppState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let lines = console(&st, &id, raw.as_deref()).await?;
    let now = chrono::Utc::now().to_rfc3339();
    Ok(Json(json!({"logs": entries(&lines, &now)})))
}

fn entries(lines: &[String], now: &str) -> Vec<Value> {
    lines
        .iter()
        .map(|l| json!({"timestamp": now, "level": "info", "message": l, "fields": {}}))
        .collect()
}

/// The last `limit` console lines (`limit` from the query, default 1000).
async fn console(st: &AppState, id: &str, raw: Option<&str>) -> Result<Vec<String>, ApiError> {
    let mut limit = DEFAULT_LIMIT;
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if k == "limit" {
            limit = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        format!("limit={v:?}: use 1 to {MAX_LIMIT}"),
                    )
                })?;
        }
    }
    let mut lines = st.manager.console_lines(id).await?;
    let skip = lines.len().saturating_sub(limit);
    lines.drain(..skip);
    Ok(lines)
}
