//! The volume content API (`E2B_VOLUME_API_URL`): a volume's files with no
//! sandbox running. Every call carries `Authorization: Bearer <token>`, the
//! volume's own token, not the node's API key; [`Target`] checks it.
//!
//! | route | what |
//! |---|---|
//! | `GET /volumecontent/{id}/file?path=` | read a file (streamed) |
//! | `PUT /volumecontent/{id}/file?path=&uid=&gid=&mode=&force=` | write a file (streamed; replaces only with `force`) |
//! | `GET /volumecontent/{id}/dir?path=&depth=` | list a directory |
//! | `POST /volumecontent/{id}/dir?path=&uid=&gid=&mode=&force=` | make a directory (`force`: with its parents) |
//! | `GET /volumecontent/{id}/path?path=` | stat |
//! | `PATCH /volumecontent/{id}/path?path=` `{uid,gid,mode}` | change owner and mode |
//! | `DELETE /volumecontent/{id}/path?path=` | remove a file or a tree |

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use siesta_volume::content::Attrs;
use siesta_volume::{VolumeError, VolumeFs, VolumePath, Volumes};
use tokio::io::AsyncWriteExt;

use super::volumes::blocking;
use super::AppState;
use crate::error::ApiError;

/// The query string every content call takes.
#[derive(Deserialize, Default)]
pub struct ContentQuery {
    #[serde(default)]
    path: String,
    depth: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

impl ContentQuery {
    fn attrs(&self) -> Attrs {
        Attrs {
            uid: self.uid,
            gid: self.gid,
            mode: self.mode,
        }
    }
}

/// The PATCH body.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct AttrsBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

/// What a content call works on: the volume named in the path, once its
/// token checked, and the path and options of the query string.
pub struct Target {
    fs: Arc<VolumeFs>,
    path: VolumePath,
    query: ContentQuery,
}

impl FromRequestParts<AppState> for Target {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, st)
            .await
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
        let Query(query) = Query::<ContentQuery>::from_request_parts(parts, st)
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("invalid query string: {}", e.body_text()),
                )
            })?;
        let fs = authorized(st.volumes.clone(), id, &parts.headers).await?;
        let path = VolumePath::parse(&query.path)?;
        Ok(Self { fs, path, query })
    }
}

/// A file's bytes (the volume's bearer token, not the API key).
#[utoipa::path(
    get, path = "/volumecontent/{id}/file", tag = "volumes", security(("volumeToken" = [])),
    params(("id" = String, Path, description = "the volume's id"), ("path" = String, Query, description = "a path in the volume")),
    responses(
        (status = 200, description = "the file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 401, description = "a missing or wrong token, or no such volume", body = super::model::Error),
        (status = 404, description = "no such path", body = super::model::Error),
    ),
)]
pub async fn read_file(t: Target) -> Result<Response, ApiError> {
    let (file, len) = blocking(move || t.fs.open_read(&t.path)).await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Write a file (replaces one only with `force`).
#[utoipa::path(
    put, path = "/volumecontent/{id}/file", tag = "volumes", security(("volumeToken" = [])),
    params(("id" = String, Path, description = "the volume's id"), ("path" = String, Query, description = "a path in the volume"), ("uid" = Option<u32>, Query), ("gid" = Option<u32>, Query), ("mode" = Option<u32>, Query), ("force" = Option<bool>, Query)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "the entry", body = Object),
        (status = 409, description = "it exists (without force)", body = super::model::Error),
        (status = 507, description = "the volume's size limit", body = super::model::Error),
        (status = 401, description = "a missing or wrong token, or no such volume", body = super::model::Error),
        (status = 404, description = "no such path", body = super::model::Error),
    ),
)]
pub async fn write_file(t: Target, body: Body) -> Result<Response, ApiError> {
    let Target { fs, path, query } = t;
    let force = query.force.unwrap_or(false);
    let pending = {
        let fs = fs.clone();
        blocking(move || fs.begin_write(&path, force)).await?
    };
    let copied = match pending.file.try_clone() {
        Ok(file) => copy_body(body, tokio::fs::File::from_std(file), pending.budget).await,
        Err(e) => Err(Upload::Io(e)),
    };
    let failure = match copied {
        Ok(_) => {
            let attrs = query.attrs();
            let stat = blocking(move || fs.commit(pending, attrs)).await?;
            return Ok((StatusCode::CREATED, Json(stat)).into_response());
        }
        Err(failure) => failure,
    };
    let fs2 = fs.clone();
    let _ = blocking(move || {
        fs2.abort(pending);
        Ok(())
    })
    .await;
    Err(match failure {
        Upload::TooLarge(wanted) => fs.full(wanted).into(),
        Upload::Body(e) => ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the upload was cut off: {e}; nothing was written"),
        ),
        Upload::Io(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("writing the upload: {e}; nothing was written"),
        ),
    })
}

/// A directory's entries.
#[utoipa::path(
    get, path = "/volumecontent/{id}/dir", tag = "volumes", security(("volumeToken" = [])),
    params(("id" = String, Path, description = "the volume's id"), ("path" = String, Query, description = "a path in the volume"), ("depth" = Option<u32>, Query, minimum = 1)),
    responses(
        (status = 200, description = "its entries", body = [Object]),
        (status = 401, description = "a missing or wrong token, or no such volume", body = super::model::Error),
        (status = 404, description = "no such path", body = super::model::Error),
    ),
)]
pub async fn list_dir(t: Target) -> Result<Response, ApiError> {
    let depth = t.query.depth.unwrap_or(1);
    let entries = blocking(move || t.fs.list(&t.path, depth)).await?;
    Ok(Json(entries).into_response())
}

/// Make a directory (`force`: with its parents).
#[utoipa::path(
    post, path = "/volumecontent/{id}/dir", tag = "volumes", security(("volumeToken" = [])),
    params(("id" = String, Path, description = "the volume's id"), ("path" = String, Query, description = "a path in the volume"), ("uid" = Option<u32>, Query), ("gid" = Option<u32>, Query), ("mode" = Option<u32>, Query), ("force" = Option<bool>, Query)),
    responses(
        (status = 201, description = "the entry", body = Object),
        (status = 409, description = "it exists", body = super::model::Error),
        (status = 401, description = "a missing or wrong token, or no such volume", body = super::model::Error),
        (status = 404, description = "no such path", body = super::model::Error),
    ),
)]
pub async fn make_dir(t: Target) -> Result<Response, ApiError> {
    let (attrs, parents) = (t.query.attrs(), t.query.force.unwrap_or(false));
    let stat = blocking(move || t.fs.make_dir(&t.path, attrs, parents)).await?;
    Ok((StatusCode::CREATED, Json(stat)).into_response())
}

/// Stat a path.
#[utoipa::path(
    get, path = "/volumecontent/{id}/path", tag = "volumes", security(("volumeToken" = [])),
    params(("id" = String, Path, description = "the volume's id"), ("path" = String, Query, description = "a path in the volume")),
    responses(
        (status = 200, description = "the entry", body = Object),
        (status = 401, description = "a missing or wrong token, or no such volume", body = super::model::Error),
        (status = 404, description = "no such path", body = super::model::Error),
    ),
)]
pub async fn stat(t: Target) -> Result<Response, ApiError> {
    let stat = blocking(move || t.fs.stat(&t.path)).await?;
    Ok(Json(stat).into_response())
}

/// Change owner and mode.
#[utoipa::path(
    patch, path = "/volumecontent/{id}/path", tag = "volumes", security(("volumeToken" = [])),
    params(("id" = String, Path, description = "the volume's id"), ("path" = String, Query, description = "a path in the volume")),
    request_body(content = Option<AttrsBody>, description = "optional"),
    responses(
        (status = 200, description = "the entry", body = Object),
        (status = 401, description = "a missing or wrong token, or no such volume", body = super::model::Error),
        (status = 404, description = "no such path", body = super::model::Error),
    ),
)]
pub async fn set_attrs(t: Target, bytes: Bytes) -> Result<Response, ApiError> {
    let body: AttrsBody = super::optional_body(&bytes)?;
    let attrs = Attrs {
        uid: body.uid,
        gid: body.gid,
        mode: body.mode,
    };
    let stat = blocking(move || t.fs.set_attrs(&t.path, attrs)).await?;
    Ok(Json(stat).into_response())
}

/// Remove a file or a tree.
#[utoipa::path(
    delete, path = "/volumecontent/{id}/path", tag = "volumes", security(("volumeToken" = [])),
    params(("id" = String, Path, description = "the volume's id"), ("path" = String, Query, description = "a path in the volume")),
    responses(
        (status = 204, description = "removed"),
        (status = 400, description = "the volume's root", body = super::model::Error),
        (status = 401, description = "a missing or wrong token, or no such volume", body = super::model::Error),
        (status = 404, description = "no such path", body = super::model::Error),
    ),
)]
pub async fn remove(t: Target) -> Result<StatusCode, ApiError> {
    blocking(move || t.fs.remove(&t.path)).await?;
    Ok(StatusCode::NO_CONTENT)
}

enum Upload {
    TooLarge(u64),
    Body(axum::Error),
    Io(std::io::Error),
}

/// Copies the request body into the upload file, stopping as soon as it
/// passes `budget` bytes.
async fn copy_body(body: Body, mut file: tokio::fs::File, budget: u64) -> Result<u64, Upload> {
    let mut stream = body.into_data_stream();
    let mut written = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(Upload::Body)?;
        written += chunk.len() as u64;
        if written > budget {
            return Err(Upload::TooLarge(written));
        }
        file.write_all(&chunk).await.map_err(Upload::Io)?;
    }
    file.flush().await.map_err(Upload::Io)?;
    Ok(written)
}

/// Volume `id`'s files, if `headers` carry its bearer token. An unknown
/// volume is refused as a wrong token is: a 404 would tell a client without
/// any token which volume ids and names exist.
async fn authorized(
    volumes: Arc<Volumes>,
    id: String,
    headers: &HeaderMap,
) -> Result<Arc<VolumeFs>, ApiError> {
    let given = bearer(headers).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>`: the volume's token from POST or GET /volumes/{id}",
        )
    })?;
    let registry = volumes.clone();
    let record = blocking(move || match registry.get(&id) {
        Ok(record) => Ok(Some(record)),
        Err(VolumeError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    })
    .await?
    .filter(|record| record.token_matches(&given))
    .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "invalid token for this volume"))?;
    let fs = blocking(move || volumes.content(&record)).await?;
    Ok(Arc::new(fs))
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_token(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        h.insert(header::AUTHORIZATION, value);
        h
    }

    /// Probing names without a token: an unknown volume must answer as a
    /// known one with a wrong token does.
    #[tokio::test]
    async fn unknown_volumes_look_like_wrong_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let volumes = Arc::new(Volumes::open(dir.path(), 16).unwrap());
        let vol = volumes.create("known", None).unwrap();
        let refusal = |id: &str, token: &str| {
            let (volumes, id, headers) = (volumes.clone(), id.to_string(), with_token(token));
            async move {
                match authorized(volumes, id, &headers).await {
                    Ok(_) => panic!("accepted"),
                    Err(e) => (e.status, e.message),
                }
            }
        };
        let wrong = refusal("known", "guess").await;
        assert_eq!(wrong.0, StatusCode::UNAUTHORIZED);
        assert_eq!(refusal(&vol.id, "guess").await, wrong);
        assert_eq!(refusal("unknown", "guess").await, wrong);
        assert_eq!(refusal("vol-0123456789", "guess").await, wrong);
        assert!(
            authorized(volumes.clone(), vol.id.clone(), &with_token(&vol.token))
                .await
                .is_ok()
        );
        assert!(authorized(volumes, "known".into(), &with_token(&vol.token))
            .await
            .is_ok());
    }
}
