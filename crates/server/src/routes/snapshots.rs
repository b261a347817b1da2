//! Snapshots and forks of running sandboxes.

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{model, optional_body, AppState};
use crate::error::ApiError;

#[derive(Deserialize, Default)]
pub struct SnapshotBody {
    name: Option<String>,
    /// `false` (the SDK's `mode="filesystem"`): keep the disk only;
    /// sandboxes made from it cold-boot.
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/snapshots`: 201 `{"snapshotID", "names"}`; the
/// sandbox keeps running.
pub async fn create(
    State(st): State<AppState>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let req: SnapshotBody = optional_body(&raw)?;
    let memory = req.memory != Some(false);
    let snap = st.manager.snapshot_with(&id, req.name, memory).await?;
    let body = json!({"snapshotID": snap.id, "names": snap.names});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /snapshots?sandboxID=&name=`: every user snapshot (one page).
pub async fn list(
    State(st): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let params: std::collections::HashMap<String, String> =
        form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let source = params.get("sandboxID").filter(|s| !s.is_empty());
    let name = params.get("name").filter(|s| !s.is_empty());
    let all = st
        .manager
        .list_snapshots(source.map(String::as_str))
        .await?;
    Ok(Json(
        all.iter()
            .filter(|s| name.is_none_or(|n| s.names.contains(n)))
            .map(|s| {
                json!({
                    "snapshotID": s.id,
                    "names": s.names,
                    "sandboxID": s.source_sandbox,
                    "templateID": s.template,
                })
            })
            .collect(),
    ))
}

#[derive(Deserialize, Default)]
pub struct ForkBody {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork`: 201 with one `{sandbox}` or `{error}` per
/// child.
pub async fn fork(
    State(st): State<AppState>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let req: ForkBody = optional_body(&raw)?;
    let children = st
        .manager
        .fork(&id, req.count.unwrap_or(1), req.timeout)
        .await?;
    let body: Vec<Value> = children
        .into_iter()
        .map(|child| match child {
            Ok(info) => json!({"sandbox": model::sandbox(&info, st.sandbox_domain.as_deref())}),
            Err(e) => {
                let e = ApiError::from(e);
                json!({"error": {"code": e.status.as_u16(), "message": e.message}})
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(body)).into_response())
}
