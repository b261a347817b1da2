//! Sandbox endpoints.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use siesta_sandbox::sandbox::{Lifecycle, OnTimeout, SandboxState};
use siesta_sandbox::CreateRequest;

use super::network::{egress_policy, given_egress, NetworkBody};
use super::{body, model, optional_body, query, unsupported, AppState};
use crate::error::ApiError;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    auto_pause: Option<bool>,
    auto_resume: Option<AutoResume>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    metadata: HashMap<String, String>,
    #[serde(default)]
    env_vars: HashMap<String, String>,
    lifecycle: Option<LifecycleBody>,
    network: Option<NetworkBody>,
    /// Volumes to mount, by name (`[{name, path}]`).
    #[serde(default)]
    volume_mounts: Vec<super::volumes::MountBody>,
    /// `false` asks for filesystem-only auto-pause: refused (not yet).
    auto_pause_memory: Option<bool>,
    // `mcp` is accepted as it is: the SDK starts the MCP gateway in the
    // sandbox itself after the create (and kills the sandbox if that fails).
    iam: Option<Value>,
}

#[derive(Deserialize)]
pub struct AutoResume {
    enabled: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleBody {
    on_timeout: Option<OnTimeout>,
    auto_resume: Option<bool>,
}

impl NewSandbox {
    /// A timeout pauses unless `autoPause` is false or the lifecycle says kill.
    fn lifecycle(&self) -> Lifecycle {
        let mut on_timeout = match self.auto_pause {
            Some(false) => OnTimeout::Kill,
            _ => OnTimeout::Pause,
        };
        let mut auto_resume = self.auto_resume.as_ref().is_some_and(|a| a.enabled);
        if let Some(l) = &self.lifecycle {
            on_timeout = l.on_timeout.unwrap_or(on_timeout);
            auto_resume = l.auto_resume.unwrap_or(auto_resume);
        }
        Lifecycle {
            on_timeout,
            auto_resume,
            // E2B's `autoPauseMemory: false`: a timeout pauses the disk only.
            filesystem_only: self.auto_pause_memory == Some(false),
        }
    }
}

/// `name:tag` names template `name` when it carries that tag (`default`
/// always); a plain name is returned as it is.
fn untagged(st: &AppState, raw: &str) -> Result<String, ApiError> {
    let Some((name, tag)) = raw.split_once(':') else {
        return Ok(raw.to_string());
    };
    let layout = st.manager.node().config.layout();
    let tags = siesta_sandbox::template::tags::of_template(&layout, name)?;
    if tag == "default" || tags.contains_key(tag) {
        Ok(name.to_string())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("template {name:?} has no tag {tag:?} (Template.get_tags lists them)"),
        ))
    }
}

/// The header that makes a create idempotent.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

pub async fn create(
    State(st): State<AppState>,
    headers: HeaderMap,
    raw: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let raw = body(raw)?;
    let req: NewSandbox = serde_json::from_value(raw.clone()).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::new(StatusCode::BAD_REQUEST, "Idempotency-Key is not ASCII text")
        })?),
    };
    unsupported::unset("iam", req.iam.as_ref())?;
    let lifecycle = req.lifecycle();
    let template = untagged(&st, &req.template_id)?;
    let create = CreateRequest {
        template,
        env_vars: req.env_vars,
        metadata: req.metadata,
        egress: given_egress(req.allow_internet_access, req.network.as_ref())?,
        private_traffic: req
            .network
            .as_ref()
            .is_some_and(NetworkBody::private_traffic),
        timeout_secs: req.timeout,
        lifecycle,
        volume_mounts: super::volumes::resolve_mounts(&st, req.volume_mounts).await?,
    };
    let created = match key {
        // Keys sort JSON objects' fields, so the digest is the request's,
        // not its spelling's.
        Some(key) => {
            let digest = hex::encode(Sha256::digest(raw.to_string()));
            st.manager
                .create_keyed(key, &digest, create)
                .await
                .map(|(info, _)| info)
        }
        None => st.manager.create(create).await,
    };
    st.metrics.observe_resume("create", &created);
    let info = created?;
    Ok((
        StatusCode::CREATED,
        Json(model::sandbox(&info, st.sandbox_domain.as_deref())),
    )
        .into_response())
}

const LIVE: &[SandboxState] = &[SandboxState::Running, SandboxState::Paused];

/// `GET /v2/sandboxes`: running and paused by default (`state=dead` shows
/// sandboxes whose VM died), paged through the `x-next-token` header.
pub async fn list_v2(
    State(st): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = query::parse(raw.as_deref(), LIVE)?;
    let (items, next) = st.manager.list_page(&q).await?;
    let mut headers = HeaderMap::new();
    if let Some(token) = next {
        if let Ok(v) = HeaderValue::from_str(&token) {
            headers.insert("x-next-token", v);
        }
    }
    let body: Vec<Value> = items.iter().map(model::listed).collect();
    Ok((headers, Json(body)).into_response())
}

/// `GET /sandboxes` (v1): running sandboxes only.
pub async fn list_v1(
    State(st): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let mut q = query::parse(raw.as_deref(), &[SandboxState::Running])?;
    q.limit = Some(siesta_sandbox::store::MAX_LIMIT);
    let (items, _) = st.manager.list_page(&q).await?;
    Ok(Json(items.iter().map(model::listed).collect()))
}

pub async fn detail(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let info = st.manager.get(&id).await?;
    if info.state == SandboxState::Dead {
        return Err(ApiError::new(
            StatusCode::GONE,
            format!(
                "sandbox {id} is dead: {}; kill it to free its disk",
                info.dead_reason.as_deref().unwrap_or("its VM stopped")
            ),
        ));
    }
    Ok(Json(model::detail(&info, st.sandbox_domain.as_deref())))
}

pub async fn kill(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    st.manager.kill(&id).await?;
    st.sandbox_metrics.forget(&id);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PauseBody {
    /// `false`: keep only the disk (filesystem-only pause; the resume
    /// cold-boots).
    memory: Option<bool>,
    /// Refuse the pause (503, the SDK's ServiceBusyException; the sandbox
    /// runs on) when the guest's agent does not answer (the SDK's `strict`).
    require_healthy_guest: Option<bool>,
}

/// How long `requireHealthyGuest` waits for the agent's `/health`.
const HEALTHY_GUEST_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// `{"memory"?, "requireHealthyGuest"?}`; 409 when already paused.
pub async fn pause(
    State(st): State<AppState>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<StatusCode, ApiError> {
    let req: PauseBody = optional_body(&raw)?;
    if req.require_healthy_guest == Some(true) {
        let healthy = st
            .manager
            .envd(&id)
            .await?
            .wait_healthy(HEALTHY_GUEST_WAIT)
            .await;
        if let Err(e) = healthy {
            return Err(siesta_sandbox::Error::GuestUnresponsive {
                id,
                detail: e.to_string(),
            }
            .into());
        }
    }
    let paused = match req.memory {
        Some(false) => st.manager.pause_disk_only(&id).await,
        _ => st.manager.pause(&id).await,
    };
    st.metrics.observe_pause(&paused);
    paused?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
pub struct ConnectBody {
    timeout: Option<u64>,
    /// `false`: a paused sandbox comes back from its disk alone (a cold
    /// boot; E2B's `on_resume="reboot"`).
    memory: Option<bool>,
}

/// Resumes a paused sandbox (201) or returns a running one (200); either
/// way its deadline becomes at least `timeout` seconds from now.
pub async fn connect(
    State(st): State<AppState>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let req: ConnectBody = optional_body(&raw)?;
    let reboot = req.memory == Some(false);
    let connected = st.manager.connect_with(&id, req.timeout, reboot).await;
    if let Ok((info, true)) = &connected {
        st.metrics.observe_resume("resume", &Ok(info.clone()));
    } else if let Err(e) = &connected {
        st.metrics.count_failure("resume", e);
    }
    let (info, resumed) = connected?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(model::sandbox(&info, st.sandbox_domain.as_deref())),
    )
        .into_response())
}

#[derive(Deserialize)]
pub struct TimeoutBody {
    timeout: u64,
}

pub async fn set_timeout(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<TimeoutBody>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let req = body(req)?;
    st.manager.set_timeout(&id, req.timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
pub struct RefreshBody {
    duration: Option<u64>,
}

/// `POST /sandboxes/{id}/refreshes {"duration"?}`: keeps a running sandbox
/// alive at least `duration` seconds more (default 60, at most 3600).
pub async fn refresh(
    State(st): State<AppState>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<StatusCode, ApiError> {
    let req: RefreshBody = optional_body(&raw)?;
    let secs = req.duration.unwrap_or(60);
    if secs > 3600 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("duration={secs}: at most 3600 seconds"),
        ));
    }
    st.manager.refresh(&id, secs).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /sandboxes/{id}/network` (`update_network`): the body replaces the
/// sandbox's address rules; `allow_internet_access` absent keeps the
/// internet switch as it was.
#[derive(Deserialize)]
pub struct UpdateNetwork {
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(flatten)]
    network: NetworkBody,
}

pub async fn set_network(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<UpdateNetwork>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let req = body(req)?;
    let internet = match req.allow_internet_access {
        Some(on) => on,
        None => st.manager.get(&id).await?.egress.allow_internet,
    };
    let policy = egress_policy(Some(internet), Some(req.network.without_public_traffic()?))?;
    st.manager.set_egress(&id, policy).await?;
    Ok(StatusCode::NO_CONTENT)
}
