//! `POST /init` and `GET /envs`: what the host tells the agent at create and
//! after every resume, and reading back the environment it set.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use base64::Engine;
use serde::Deserialize;

use super::{sysinit, HttpError};
use crate::auth::check_access_token;
use crate::state::AgentState;

/// The `/init` body (envd's `PostInitJSONBody` plus `entropy` and
/// `siestaMounts`). Unknown fields (envd's `volumeMounts`, `hyperloopIP`)
/// are accepted and ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitBody {
    pub env_vars: Option<HashMap<String, String>>,
    pub access_token: Option<String>,
    /// RFC 3339; the host's wall clock when it sent the request.
    pub timestamp: Option<pbjson_types::Timestamp>,
    pub default_user: Option<String>,
    pub default_workdir: Option<String>,
    /// Standard base64 of fresh random bytes from the host.
    pub entropy: Option<String>,
    /// Volumes to mount (NFSv3 from the host); already mounted ones are kept.
    #[serde(default)]
    pub siesta_mounts: Vec<siesta_envd_proto::NfsMount>,
}

pub async fn init(
    State(state): State<AgentState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<axum::response::Response, HttpError> {
    use axum::response::IntoResponse;
    // Once a token is set, only its holder may change the agent's defaults
    // (or the token itself).
    check_access_token(&state, &headers)
        .await
        .map_err(HttpError::from_rpc)?;
    let body: InitBody = if body.iter().all(u8::is_ascii_whitespace) {
        InitBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| HttpError::bad_request(format!("invalid /init body: {e}")))?
    };
    // Validate everything before changing anything.
    let entropy = match &body.entropy {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| HttpError::bad_request(format!("entropy is not base64: {e}")))?,
        None => Vec::new(),
    };
    if let Some(user) = &body.default_user {
        state.users.lookup(user).map_err(HttpError::from_rpc)?;
    }
    // Mounted before anything else changes: a sandbox must never run
    // without its volume (what it wrote there would be lost).
    let mounted: Vec<String> = body.siesta_mounts.iter().map(|m| m.path.clone()).collect();
    if !body.siesta_mounts.is_empty() {
        let mounts = body.siesta_mounts.clone();
        tokio::task::spawn_blocking(move || crate::mounts::ensure(&mounts))
            .await
            .map_err(|e| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
            .map_err(|e| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    }

    if let Some(ts) = &body.timestamp {
        match sysinit::set_clock(ts.seconds, ts.nanos) {
            Ok(sysinit::ClockOutcome::Set { skew_ms }) => {
                tracing::info!(skew_ms, "wall clock set from /init")
            }
            Ok(sysinit::ClockOutcome::InSync) => {}
            // Not fatal: an agent run unprivileged (tests, dev) cannot set it.
            Err(e) => tracing::warn!("cannot set the wall clock: {e}"),
        }
    }
    if !entropy.is_empty() {
        match sysinit::add_entropy(&entropy) {
            Ok(()) => tracing::debug!(bytes = entropy.len(), "entropy added, CRNG reseeded"),
            Err(e) => tracing::warn!("cannot add entropy / reseed the CRNG: {e}"),
        }
    }

    let mut d = state.defaults.write().await;
    if let Some(vars) = body.env_vars {
        // Merged, as envd does: a resume re-sends the same set.
        d.env_vars.extend(vars);
    }
    if let Some(token) = body.access_token {
        d.access_token = (!token.is_empty()).then_some(token);
    }
    if let Some(user) = body.default_user.filter(|u| !u.is_empty()) {
        d.user = Some(user);
    }
    if let Some(dir) = body.default_workdir.filter(|w| !w.is_empty()) {
        d.workdir = Some(dir);
    }
    // envd answers 204; with volumes, the list of what is mounted tells the
    // host this agent knows about them.
    if mounted.is_empty() {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Ok(Json(serde_json::json!({ "mounts": mounted })).into_response())
    }
}

pub async fn envs(
    State(state): State<AgentState>,
    headers: HeaderMap,
) -> Result<Json<HashMap<String, String>>, HttpError> {
    check_access_token(&state, &headers)
        .await
        .map_err(HttpError::from_rpc)?;
    Ok(Json(state.defaults.read().await.env_vars.clone()))
}
