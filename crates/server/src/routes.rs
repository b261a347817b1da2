//! The control API routes (the E2B subset the SDK and the CLI use).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use siesta_sandbox::sandbox::{SandboxInfo, SandboxState};
use siesta_sandbox::{CreateRequest, Error, SandboxManager};

use crate::error::ApiError;

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<SandboxManager>,
    pub api_key: String,
}

pub fn router(state: AppState) -> Router {
    let control = Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(connect))
        .route("/templates", get(templates))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .merge(control)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint",
            )
        })
        .with_state(state)
}

async fn require_api_key(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !constant_time_eq(given.as_bytes(), st.api_key.as_bytes()) {
        let msg = if given.is_empty() {
            "missing X-API-KEY header"
        } else {
            "invalid API key"
        };
        return ApiError::new(StatusCode::UNAUTHORIZED, msg).into_response();
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A JSON body that turns every parse failure into a 400 JSON error.
fn body<T>(parsed: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    parsed
        .map(|Json(v)| v)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(default)]
    env_vars: HashMap<String, String>,
    #[serde(default)]
    metadata: HashMap<String, String>,
    #[serde(default, rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

async fn create(
    State(st): State<AppState>,
    req: Result<Json<NewSandbox>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = body(req)?;
    let info = st
        .manager
        .create(CreateRequest {
            template: req.template_id,
            env_vars: req.env_vars,
            metadata: req.metadata,
            allow_internet: req.allow_internet_access.unwrap_or(true),
            ..Default::default()
        })
        .await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&info))).into_response())
}

async fn list(State(st): State<AppState>) -> Json<Value> {
    let all = st.manager.list().await;
    Json(Value::Array(all.iter().map(detail_json).collect()))
}

async fn detail(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(detail_json(&st.manager.get(&id).await?)))
}

async fn kill(State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    st.manager.kill(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    match st.manager.pause(&id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(e @ Error::WrongState { .. }) => {
            Err(ApiError::new(StatusCode::CONFLICT, e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Resumes a paused sandbox (201) or returns a running one as it is (200).
async fn connect(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let info = st.manager.get(&id).await?;
    if info.state == SandboxState::Running {
        return Ok((StatusCode::OK, Json(sandbox_json(&info))).into_response());
    }
    let info = st.manager.resume(&id).await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&info))).into_response())
}

async fn templates(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let layout = st.manager.node().config.layout();
    let all = siesta_sandbox::template::list(&layout)?;
    Ok(Json(Value::Array(
        all.iter()
            .map(|t| {
                json!({
                    "templateID": t.record.name,
                    "aliases": [t.record.name],
                    "cpuCount": t.record.vcpus,
                    "memoryMB": t.record.memory_mib,
                    "createdAt": t.record.created_at,
                    "public": false,
                })
            })
            .collect(),
    )))
}

fn sandbox_json(info: &SandboxInfo) -> Value {
    json!({
        "templateID": info.template,
        "sandboxID": info.id,
        "clientID": "siesta",
        "envdVersion": siesta_envd_proto::ENVD_VERSION,
        "envdAccessToken": info.access_token,
        // siesta extension: where this host reaches the agent directly.
        "agentAddress": info.agent_addr.map(|a| a.to_string()),
    })
}

fn detail_json(info: &SandboxInfo) -> Value {
    let mut v = sandbox_json(info);
    let extra = json!({
        "startedAt": info.created_at,
        "endAt": info.created_at + chrono::Duration::hours(24),
        "state": info.state.to_string(),
        "metadata": info.metadata,
        "cpuCount": 1,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "timings": info.timings,
    });
    if let (Some(a), Some(b)) = (v.as_object_mut(), extra.as_object()) {
        a.extend(b.clone());
    }
    v
}
