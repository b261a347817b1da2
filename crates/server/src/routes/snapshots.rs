//! Snapshots and forks of running sandboxes.

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::model::{Error, Sandbox};
use super::{optional_body, AppState};
use crate::error::ApiError;

#[derive(Deserialize, Default, ToSchema)]
pub struct SnapshotBody {
    /// A name to find it by (alias `snapshot:NAME`).
    name: Option<String>,
    /// `false` (the SDK's `mode="filesystem"`): keep the disk only;
    /// sandboxes made from it cold-boot.
    memory: Option<bool>,
}

/// A user snapshot: sandboxes start from it with its id (or
/// `snapshot:NAME`) as `templateID`.
#[derive(Serialize, ToSchema)]
pub struct Snapshot {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
    /// The sandbox it was taken of (listing only).
    #[serde(rename = "sandboxID", skip_serializing_if = "Option::is_none")]
    sandbox_id: Option<String>,
    /// That sandbox's template (listing only).
    #[serde(rename = "templateID", skip_serializing_if = "Option::is_none")]
    template_id: Option<String>,
}

const ID: &str = "the sandbox's id";

/// Snapshot a running sandbox (it runs on).
#[utoipa::path(
    post, path = "/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path, description = ID)),
    request_body(content = Option<SnapshotBody>, description = "optional"),
    responses(
        (status = 201, description = "taken", body = Snapshot),
        (status = 400, description = "a malformed body or name", body = Error),
        (status = 404, description = "no such sandbox", body = Error),
        (status = 409, description = "not running, or the name is taken", body = Error),
    ),
)]
pub async fn create(
    State(st): State<AppState>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let req: SnapshotBody = optional_body(&raw)?;
    let memory = req.memory != Some(false);
    let snap = st.manager.snapshot_with(&id, req.name, memory).await?;
    let body = Snapshot {
        snapshot_id: snap.id,
        names: snap.names,
        sandbox_id: None,
        template_id: None,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// User snapshots (one page).
#[utoipa::path(
    get, path = "/snapshots", tag = "snapshots",
    params(
        ("sandboxID" = Option<String>, Query, description = "only those taken of this sandbox"),
        ("name" = Option<String>, Query, description = "only the one of this name"),
    ),
    responses((status = 200, description = "the snapshots", body = [Snapshot])),
)]
pub async fn list(
    State(st): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Snapshot>>, ApiError> {
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
            .map(|s| Snapshot {
                snapshot_id: s.id.clone(),
                names: s.names.clone(),
                sandbox_id: Some(s.source_sandbox.clone()),
                template_id: Some(s.template.clone()),
            })
            .collect(),
    ))
}

#[derive(Deserialize, Default, ToSchema)]
pub struct ForkBody {
    /// The children's timeout in seconds.
    #[schema(maximum = 86400)]
    timeout: Option<u64>,
    /// How many children (default 1).
    #[schema(minimum = 1, maximum = 64)]
    count: Option<u32>,
}

/// One child of a fork: the sandbox, or why it could not start.
#[derive(Serialize, ToSchema)]
pub struct ForkChild {
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Error>,
}

/// Fork a running sandbox into `count` children that resume from one
/// capture of it.
#[utoipa::path(
    post, path = "/sandboxes/{id}/fork", tag = "snapshots",
    params(("id" = String, Path, description = ID)),
    request_body(content = Option<ForkBody>, description = "optional"),
    responses(
        (status = 201, description = "one entry per child", body = [ForkChild]),
        (status = 400, description = "a malformed body or count", body = Error),
        (status = 404, description = "no such sandbox", body = Error),
        (status = 409, description = "not running", body = Error),
        (status = 429, description = "fewer free network slots than children (max_slots); nothing was captured", body = Error),
    ),
)]
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
    let body: Vec<ForkChild> = children
        .into_iter()
        .map(|child| match child {
            Ok(info) => ForkChild {
                sandbox: Some(Sandbox::new(&info, st.sandbox_domain.as_deref())),
                error: None,
            },
            Err(e) => ForkChild {
                sandbox: None,
                error: Some(ApiError::from(e).body()),
            },
        })
        .collect();
    Ok((StatusCode::CREATED, Json(body)).into_response())
}
