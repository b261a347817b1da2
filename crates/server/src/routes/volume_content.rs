//! The volume content API (`E2B_VOLUME_API_URL`): a volume's files with no
//! sandbox running. Every call carries `Authorization: Bearer <token>`, the
//! volume's own token, not the node's API key.
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
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use siesta_volume::content::Attrs;
use siesta_volume::{VolumeFs, VolumePath};
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
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AttrsBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

type Q = Result<Query<ContentQuery>, QueryRejection>;

pub async fn read_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q,
) -> Result<Response, ApiError> {
    let (fs, path) = open(&st, &id, &headers, q).await?;
    let (file, len) = blocking(move || fs.open_read(&path)).await?;
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

pub async fn write_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q,
    body: Body,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let (fs, path) = open_parsed(&st, &id, &headers, &q).await?;
    let force = q.force.unwrap_or(false);
    let pending = {
        let fs = fs.clone();
        blocking(move || fs.begin_write(&path, force)).await?
    };
    let copied = match pending.file.try_clone() {
        Ok(file) => copy_body(body, tokio::fs::File::from_std(file), pending.budget).await,
        Err(e) => Err(Upload::Io(e)),
    };
    match copied {
        Ok(_) => {
            let attrs = q.attrs();
            let stat = blocking(move || fs.commit(pending, attrs)).await?;
            Ok((StatusCode::CREATED, Json(stat)).into_response())
        }
        Err(failure) => {
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
    }
}

pub async fn list_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let depth = q.depth.unwrap_or(1);
    let (fs, path) = open_parsed(&st, &id, &headers, &q).await?;
    let entries = blocking(move || fs.list(&path, depth)).await?;
    Ok(Json(entries).into_response())
}

pub async fn make_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let (fs, path) = open_parsed(&st, &id, &headers, &q).await?;
    let (attrs, parents) = (q.attrs(), q.force.unwrap_or(false));
    let stat = blocking(move || fs.make_dir(&path, attrs, parents)).await?;
    Ok((StatusCode::CREATED, Json(stat)).into_response())
}

pub async fn stat(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q,
) -> Result<Response, ApiError> {
    let (fs, path) = open(&st, &id, &headers, q).await?;
    let stat = blocking(move || fs.stat(&path)).await?;
    Ok(Json(stat).into_response())
}

pub async fn set_attrs(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let (fs, path) = open(&st, &id, &headers, q).await?;
    let body: AttrsBody = super::optional_body(&bytes)?;
    let attrs = Attrs {
        uid: body.uid,
        gid: body.gid,
        mode: body.mode,
    };
    let stat = blocking(move || fs.set_attrs(&path, attrs)).await?;
    Ok(Json(stat).into_response())
}

pub async fn remove(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q,
) -> Result<StatusCode, ApiError> {
    let (fs, path) = open(&st, &id, &headers, q).await?;
    blocking(move || fs.remove(&path)).await?;
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

fn query(q: Q) -> Result<ContentQuery, ApiError> {
    q.map(|Query(q)| q).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid query string: {}", e.body_text()),
        )
    })
}

async fn open(
    st: &AppState,
    id: &str,
    headers: &HeaderMap,
    q: Q,
) -> Result<(Arc<VolumeFs>, VolumePath), ApiError> {
    let q = query(q)?;
    open_parsed(st, id, headers, &q).await
}

/// Checks the bearer token against volume `id` and parses the path.
async fn open_parsed(
    st: &AppState,
    id: &str,
    headers: &HeaderMap,
    q: &ContentQuery,
) -> Result<(Arc<VolumeFs>, VolumePath), ApiError> {
    let given = bearer(headers).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>`: the volume's token from POST or GET /volumes/{id}",
        )
    })?;
    let volumes = st.volumes.clone();
    let id = id.to_string();
    let record = blocking(move || volumes.get(&id)).await?;
    if !record.token_matches(&given) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid token for this volume",
        ));
    }
    let path = VolumePath::parse(&q.path)?;
    let volumes = st.volumes.clone();
    let fs = blocking(move || volumes.content(&record)).await?;
    Ok((Arc::new(fs), path))
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}
