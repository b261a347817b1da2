//! COPY files of template builds (E2B's `Template.build` with `copy`):
//! whether an archive is here already, and a signed link to upload it to,
//! streamed to disk under a size cap. The first whole upload of a hash is
//! kept (docs/security.md, L3).

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::TryStreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::AppState;
use crate::error::ApiError;

/// The most a COPY archive may hold.
const MAX_UPLOAD_BYTES: u64 = 8 << 30;

/// Whether the COPY archive `hash` is here already; if not, a signed link
/// to upload it to.
#[utoipa::path(
    get, path = "/templates/{id}/files/{hash}", tag = "templates",
    params(("id" = String, Path, description = "the template's name"), ("hash" = String, Path, pattern = "^[0-9a-fA-F]{64}$", description = "SHA-256 of the archive")),
    responses(
        (status = 201, description = "`{present, url?}`", body = Object),
        (status = 400, description = "not a SHA-256", body = super::model::Error),
    ),
)]
pub async fn files(
    State(st): State<AppState>,
    Path((_template, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let path = st.builds.archive_path(&hash).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "the files hash must be 64 hex digits (SHA-256)",
        )
    })?;
    let present = tokio::fs::try_exists(&path).await.unwrap_or(false);
    let mut out = json!({ "present": present });
    if !present {
        let host = headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1");
        out["url"] = format!(
            "http://{host}/template-files/{hash}?{}",
            st.builds.sign_upload(&hash)
        )
        .into();
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    expires: Option<u64>,
    signature: Option<String>,
}

/// Upload a COPY archive through a signed link. It carries no API key (the
/// SDK sends it with a plain client): the signed link authorises it.
#[utoipa::path(
    put, path = "/template-files/{hash}", tag = "templates", security(()),
    params(("hash" = String, Path, description = "SHA-256 of the archive"), UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "stored"),
        (status = 400, description = "a bad hash or a broken upload", body = super::model::Error),
        (status = 403, description = "the link is unsigned, wrongly signed or expired", body = super::model::Error),
        (status = 413, description = "larger than 8 GiB", body = super::model::Error),
    ),
)]
pub async fn upload(
    State(st): State<AppState>,
    Path(hash): Path<String>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let forbidden = |m: String| ApiError::new(StatusCode::FORBIDDEN, m);
    let (Some(expires), Some(signature)) = (q.expires, q.signature) else {
        return Err(forbidden(
            "the upload link lacks its expires and signature parameters".into(),
        ));
    };
    let part = st
        .builds
        .upload_part_path(&hash)
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "bad files hash"))?;
    st.builds
        .check_upload(&hash, expires, &signature)
        .map_err(forbidden)?;
    let dir = st.builds.files_dir().to_path_buf();
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| io_err("creating", &dir, e))?;
    // The archive is not checked against `hash` (review L3): the SDKs'
    // `filesHash` covers `COPY <src> <dest>` and the source files' paths,
    // modes, sizes and bytes, not the tar they upload, so no check on these
    // bytes would pass a real upload (docs/security.md, "Not yet held").
    let written = receive(body, &part).await;
    if let Err(e) = written {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(e);
    }
    // The first whole upload of a hash stays; a second is answered as a
    // success (the archive is there) but does not replace it.
    let builds = st.builds.clone();
    let kept = tokio::task::spawn_blocking(move || builds.keep_upload(&part, &hash))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("storing the upload: {e}"),
            )
        })?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if !kept {
        tracing::info!("a COPY archive was uploaded again: the first one stays");
    }
    Ok(StatusCode::CREATED)
}

/// Streams `body` into `part` (synced), refusing more than the limit.
async fn receive(body: Body, part: &std::path::Path) -> Result<(), ApiError> {
    // A new file: a name taken already is someone else's upload.
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(part)
        .await
        .map_err(|e| io_err("creating", part, e))?;
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream
        .try_next()
        .await
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("reading the upload: {e}")))?
    {
        total += chunk.len() as u64;
        if total > MAX_UPLOAD_BYTES {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "a COPY archive may hold at most {} GiB",
                    MAX_UPLOAD_BYTES >> 30
                ),
            ));
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| io_err("writing", part, e))?;
    }
    file.sync_all()
        .await
        .map_err(|e| io_err("syncing", part, e))
}

fn io_err(what: &str, path: &std::path::Path, e: std::io::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{what} {}: {e}", path.display()),
    )
}
