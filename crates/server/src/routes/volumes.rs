//! Volumes (E2B's `Volume` API): `POST/GET /volumes`, `GET/DELETE
//! /volumes/{id}`. A volume is named by its id or its name. Its files are
//! served by the volume content API (`volume_content.rs`).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use siesta_sandbox::volumes::VolumeMount;
use siesta_volume::{VolumeError, VolumeRecord};
use utoipa::ToSchema;

use super::model::Error;
use super::AppState;
use crate::error::ApiError;

/// The create body: E2B's `NewVolume`, plus siesta's optional size limit.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewVolume {
    name: String,
    /// Size limit in MiB (default: the server's `--volume-size-mib`).
    #[serde(rename = "sizeLimitMB")]
    #[schema(minimum = 1)]
    size_limit_mb: Option<u64>,
}

/// E2B's `VolumeAndToken` (and `Volume`, which is the same without the
/// token), with the size limit and creation time as extra fields.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct VolumeBody {
    #[serde(rename = "volumeID")]
    volume_id: String,
    name: String,
    /// The bearer token of its content API (create and get only).
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    #[serde(rename = "sizeLimitMB")]
    size_limit_mb: u64,
    created_at: String,
}

impl VolumeBody {
    fn new(r: VolumeRecord, with_token: bool) -> Self {
        Self {
            volume_id: r.id,
            name: r.name,
            token: with_token.then_some(r.token),
            size_limit_mb: r.size_limit_bytes / (1024 * 1024),
            created_at: r.created_at.to_rfc3339(),
        }
    }
}

/// A new volume (E2B's `NewVolume`, plus an optional size limit in MiB).
#[utoipa::path(
    post, path = "/volumes", tag = "volumes",
    request_body = NewVolume,
    responses(
        (status = 201, description = "created, with its token", body = VolumeBody),
        (status = 400, description = "a malformed body or name", body = Error),
        (status = 409, description = "the name is taken", body = Error),
    ),
)]
pub async fn create(
    State(st): State<AppState>,
    bytes: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: NewVolume = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    let record = blocking(move || st.volumes.create(&body.name, body.size_limit_mb)).await?;
    tracing::info!(volume = %record.id, name = %record.name, "volume created");
    Ok((StatusCode::CREATED, Json(VolumeBody::new(record, true))))
}

/// Every volume, oldest first.
#[utoipa::path(
    get, path = "/volumes", tag = "volumes",
    responses((status = 200, description = "every volume, without tokens", body = [VolumeBody])),
)]
pub async fn list(State(st): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let all = blocking(move || st.volumes.list()).await?;
    let out: Vec<VolumeBody> = all.into_iter().map(|r| VolumeBody::new(r, false)).collect();
    Ok(Json(out))
}

/// One volume, with its token.
#[utoipa::path(
    get, path = "/volumes/{id}", tag = "volumes", params(("id" = String, Path, description = "the volume's id or name")),
    responses(
        (status = 200, description = "the volume", body = VolumeBody),
        (status = 404, description = "no such volume", body = Error),
    ),
)]
pub async fn get(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let record = blocking(move || st.volumes.get(&id)).await?;
    Ok(Json(VolumeBody::new(record, true)))
}

/// Delete a volume and its files.
#[utoipa::path(
    delete, path = "/volumes/{id}", tag = "volumes", params(("id" = String, Path, description = "the volume's id or name")),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "no such volume", body = Error),
        (status = 409, description = "mounted in a running or paused sandbox", body = Error),
    ),
)]
pub async fn delete(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let volumes = st.volumes.clone();
    let key = id.clone();
    let record = blocking(move || volumes.get(&key)).await?;
    let users = st.manager.mounting(&record.id).await;
    if !users.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "volume {:?} is mounted in sandboxes {} (running or paused): kill them first",
                record.name,
                users.join(", ")
            ),
        ));
    }
    let record = blocking(move || st.volumes.delete(&id)).await?;
    tracing::info!(volume = %record.id, name = %record.name, "volume deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// One entry of a create request's `volumeMounts`.
/// A volume to mount, by name, at an absolute path in the guest.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountBody {
    name: String,
    path: String,
}

/// The create request's mounts, each volume looked up by name (or id).
pub(crate) async fn resolve_mounts(
    st: &AppState,
    mounts: Vec<MountBody>,
) -> Result<Vec<VolumeMount>, ApiError> {
    let mut resolved = Vec::with_capacity(mounts.len());
    for m in mounts {
        let volumes = st.volumes.clone();
        let name = m.name.clone();
        let record = blocking(move || volumes.get(&name)).await.map_err(|e| {
            if e.status == StatusCode::NOT_FOUND {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "volumeMounts: volume {:?} not found (create it with Volume.create or `siesta volume create`)",
                        m.name
                    ),
                )
            } else {
                e
            }
        })?;
        resolved.push(VolumeMount {
            volume_id: record.id,
            name: record.name,
            path: m.path,
        });
    }
    siesta_sandbox::volumes::check_mounts(&resolved)?;
    Ok(resolved)
}

/// Runs a registry or file call on a blocking thread (SQLite, fsync).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("volume operation failed: {e}"),
        )),
    }
}

impl From<VolumeError> for ApiError {
    fn from(e: VolumeError) -> Self {
        let status = match &e {
            VolumeError::NotFound(_) | VolumeError::PathNotFound(_) => StatusCode::NOT_FOUND,
            VolumeError::NameTaken(_)
            | VolumeError::Exists(_)
            | VolumeError::IsDirectory(_)
            | VolumeError::NotDirectory(_) => StatusCode::CONFLICT,
            VolumeError::BadName { .. }
            | VolumeError::BadLimit(_)
            | VolumeError::BadPath { .. }
            | VolumeError::RemoveRoot => StatusCode::BAD_REQUEST,
            VolumeError::Escapes { .. } => StatusCode::FORBIDDEN,
            VolumeError::Full { .. } => StatusCode::INSUFFICIENT_STORAGE,
            VolumeError::Io { .. } | VolumeError::Sql { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!("volume: {e}");
        }
        ApiError::new(status, e.to_string())
    }
}
