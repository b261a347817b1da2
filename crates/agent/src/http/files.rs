//! `GET /files` (download) and `POST /files` (upload), streamed both ways:
//! a multi-gigabyte file never sits in the agent's memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_compression::tokio::bufread::{GzipDecoder, GzipEncoder};
use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWriteExt, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};

use super::auth::{self, FileAccess};
use super::HttpError;
use crate::filesystem::perm::Caller;
use crate::filesystem::{paths, xattr};
use crate::state::AgentState;

#[derive(Debug, Default, Deserialize)]
pub struct FilesQuery {
    pub path: Option<String>,
    pub username: Option<String>,
    pub signature: Option<String>,
    pub signature_expiration: Option<String>,
}

/// One element of the upload response (`WriteInfo` in the SDK).
#[derive(Debug, Serialize)]
pub struct WriteInfo {
    pub name: String,
    pub path: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The metadata stored with the upload, if any (`X-Metadata-*`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<HashMap<String, String>>,
}

/// Authenticates and resolves the user a `/files` request acts as.
async fn admit(
    state: &AgentState,
    headers: &HeaderMap,
    q: &FilesQuery,
    operation: &str,
) -> Result<Caller, HttpError> {
    let (token, default_user) = {
        let d = state.defaults.read().await;
        (d.access_token.clone(), d.user.clone())
    };
    let access = FileAccess {
        path: q.path.as_deref().unwrap_or(""),
        operation,
        user: q.username.as_deref().unwrap_or(""),
        signature: q.signature.as_deref(),
        expiration: q.signature_expiration.as_deref(),
    };
    auth::authorize(token.as_deref(), headers, &access)?;
    let name = q
        .username
        .clone()
        .filter(|u| !u.is_empty())
        .or(default_user)
        .unwrap_or_else(|| "root".to_string());
    Caller::lookup(&state.users, &name).map_err(HttpError::from_rpc)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, HttpError> + Send + 'static,
) -> Result<T, HttpError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        HttpError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("file task failed: {e}"),
        )
    })?
}

pub async fn download(
    State(state): State<AgentState>,
    Query(q): Query<FilesQuery>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let caller = admit(&state, &headers, &q, "read").await?;
    let raw = q
        .path
        .as_deref()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| HttpError::bad_request("missing path"))?;
    let path = paths::resolve(raw, &caller.user.home);
    let (file, len) = blocking({
        let path = path.clone();
        move || {
            let meta = std::fs::metadata(&path).map_err(|e| HttpError::from_io(&e, &path))?;
            if meta.is_dir() {
                return Err(HttpError::bad_request(format!(
                    "{} is a directory",
                    path.display()
                )));
            }
            caller
                .check_read(&path)
                .map_err(|e| HttpError::from_io(&e, &path))?;
            let file = std::fs::File::open(&path).map_err(|e| HttpError::from_io(&e, &path))?;
            Ok((file, meta.len()))
        }
    })
    .await?;
    let file = tokio::fs::File::from_std(file);
    let name = paths::base_name(&path).replace('"', "");
    let disposition = format!("attachment; filename=\"{name}\"");
    let mut resp = if accepts_gzip(&headers) {
        let body = Body::from_stream(ReaderStream::new(GzipEncoder::new(BufReader::new(file))));
        let mut r = body.into_response();
        r.headers_mut().insert(
            header::CONTENT_ENCODING,
            header::HeaderValue::from_static("gzip"),
        );
        r
    } else {
        let mut r = Body::from_stream(ReaderStream::new(file)).into_response();
        r.headers_mut().insert(header::CONTENT_LENGTH, len.into());
        r
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = header::HeaderValue::from_str(&disposition) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

/// Whether `Accept-Encoding` lists gzip with a non-zero quality.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let q_zero = parts
                .find_map(|p| p.strip_prefix("q="))
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0);
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !q_zero
        })
}

pub async fn upload(
    State(state): State<AgentState>,
    Query(q): Query<FilesQuery>,
    headers: HeaderMap,
    req: Request,
) -> Result<Json<Vec<WriteInfo>>, HttpError> {
    let caller = admit(&state, &headers, &q, "write").await?;
    let metadata = metadata_headers(&headers);
    let path = q.path.as_deref().filter(|p| !p.is_empty());
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();

    let mut written = Vec::new();
    if content_type.starts_with("multipart/form-data") {
        let mut form = Multipart::from_request(req, &state)
            .await
            .map_err(|e| HttpError::bad_request(format!("invalid multipart body: {e}")))?;
        while let Some(mut field) = form.next_field().await.map_err(multipart_err)? {
            // One file with `?path=`: that is its destination. Several
            // files: each part's filename is its destination.
            let raw = match (path, field.file_name()) {
                (Some(p), _) if written.is_empty() => p.to_string(),
                (Some(_), _) => {
                    return Err(HttpError::bad_request(
                        "path is set but the body holds several files",
                    ))
                }
                (None, Some(f)) if !f.is_empty() => f.to_string(),
                (None, _) => {
                    return Err(HttpError::bad_request(
                        "a part has no filename and no path was given",
                    ))
                }
            };
            let dest = paths::resolve(&raw, &caller.user.home);
            let mut file = create(&caller, &dest).await?;
            while let Some(chunk) = field.chunk().await.map_err(multipart_err)? {
                file.write_all(&chunk)
                    .await
                    .map_err(|e| HttpError::from_io(&e, &dest))?;
            }
            written.push(finish(file, &dest, &metadata).await?);
        }
        if written.is_empty() {
            return Err(HttpError::bad_request("the multipart body holds no file"));
        }
    } else {
        let raw = path.ok_or_else(|| HttpError::bad_request("missing path"))?;
        let dest = paths::resolve(raw, &caller.user.home);
        let gzipped = headers
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("gzip"));
        let stream = req
            .into_body()
            .into_data_stream()
            .map_err(std::io::Error::other);
        let reader = StreamReader::new(stream);
        let mut body: Box<dyn AsyncRead + Send + Unpin> = if gzipped {
            Box::new(GzipDecoder::new(BufReader::new(reader)))
        } else {
            Box::new(reader)
        };
        let mut file = create(&caller, &dest).await?;
        tokio::io::copy(&mut body, &mut file).await.map_err(|e| {
            // A broken gzip stream is the client's fault, not the disk's.
            if e.kind() == std::io::ErrorKind::InvalidData {
                HttpError::bad_request(format!("invalid body: {e}"))
            } else {
                HttpError::from_io(&e, &dest)
            }
        })?;
        written.push(finish(file, &dest, &metadata).await?);
    }
    Ok(Json(written))
}

fn multipart_err(e: axum::extract::multipart::MultipartError) -> HttpError {
    HttpError::new(
        e.status(),
        format!("invalid multipart body: {}", e.body_text()),
    )
}

/// `X-Metadata-<key>: <value>` headers (keys arrive lower-cased).
fn metadata_headers(headers: &HeaderMap) -> HashMap<String, String> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name.as_str().strip_prefix("x-metadata-")?;
            Some((key.to_string(), value.to_str().ok()?.to_string()))
        })
        .collect()
}

/// Opens `dest` for writing (truncating), creating missing parents; all of
/// it owned by the caller.
async fn create(caller: &Caller, dest: &Path) -> Result<tokio::fs::File, HttpError> {
    let caller = caller.clone();
    let dest = dest.to_path_buf();
    let file = blocking(move || {
        if dest.is_dir() {
            return Err(HttpError::bad_request(format!(
                "{} is a directory",
                dest.display()
            )));
        }
        caller
            .check_write(&dest, true)
            .map_err(|e| HttpError::from_io(&e, &dest))?;
        if let Some(parent) = dest.parent() {
            caller
                .ensure_dirs(parent)
                .map_err(|e| HttpError::from_io(&e, parent))?;
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dest)
            .map_err(|e| HttpError::from_io(&e, &dest))?;
        caller
            .chown(&dest)
            .map_err(|e| HttpError::from_io(&e, &dest))?;
        Ok(file)
    })
    .await?;
    Ok(tokio::fs::File::from_std(file))
}

/// Flushes the upload, stores its metadata and describes it for the reply.
async fn finish(
    mut file: tokio::fs::File,
    dest: &Path,
    metadata: &HashMap<String, String>,
) -> Result<WriteInfo, HttpError> {
    file.flush()
        .await
        .map_err(|e| HttpError::from_io(&e, dest))?;
    drop(file);
    {
        let (dest2, metadata): (PathBuf, Vec<(String, String)>) =
            (dest.to_path_buf(), metadata.clone().into_iter().collect());
        blocking(move || {
            // Metadata describes this content: the previous upload's goes.
            xattr::clear_all(&dest2).map_err(|e| {
                HttpError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("clearing old metadata of {}: {e}", dest2.display()),
                )
            })?;
            for (k, v) in &metadata {
                xattr::set(&dest2, k, v).map_err(|e| {
                    let status = if e.raw_os_error() == Some(libc::ENOTSUP) {
                        StatusCode::BAD_REQUEST
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    };
                    HttpError::new(
                        status,
                        format!("storing metadata {k:?} on {}: {e}", dest2.display()),
                    )
                })?;
            }
            Ok(())
        })
        .await?;
    }
    Ok(WriteInfo {
        name: paths::base_name(dest),
        path: paths::display(dest),
        kind: "file",
        metadata: (!metadata.is_empty()).then(|| metadata.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(header::ACCEPT_ENCODING, v.parse().unwrap());
        m
    }

    #[test]
    fn gzip_negotiation() {
        assert!(accepts_gzip(&h("gzip")));
        assert!(accepts_gzip(&h("br, GZIP;q=0.5")));
        assert!(accepts_gzip(&h("*")));
        assert!(!accepts_gzip(&h("gzip;q=0")));
        assert!(!accepts_gzip(&h("identity")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }
}
