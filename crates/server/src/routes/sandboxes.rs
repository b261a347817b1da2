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
use utoipa::ToSchema;

use super::model::{self, Error, ListedSandbox, Sandbox, SandboxDetail};
use super::network::{egress_policy, given_egress, NetworkBody};
use super::{body, optional_body, query, unsupported, AppState};
use crate::error::ApiError;

/// E2B's `NewSandbox`.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// A template's name (`name:tag` for a tagged build), or a snapshot's
    /// id or `snapshot:NAME`.
    #[serde(rename = "templateID")]
    template_id: String,
    /// Seconds until the timeout action; default 300.
    #[schema(maximum = 86400)]
    timeout: Option<u64>,
    /// `false`: a timeout kills instead of pausing.
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
    /// Refused unless empty (not supported).
    #[schema(value_type = Option<Object>)]
    iam: Option<Value>,
}

#[derive(Deserialize, ToSchema)]
pub struct AutoResume {
    enabled: bool,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleBody {
    #[schema(value_type = Option<model::TimeoutAction>)]
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
    let tags = siesta_template::tags::of_template(&layout, name)?;
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

/// Create a sandbox by resuming a template (or a snapshot).
#[utoipa::path(
    post, path = "/v2/sandboxes", tag = "sandboxes",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "the same key and body within 24 h return the sandbox the first create made")),
    request_body = NewSandbox,
    responses(
        (status = 201, description = "created", body = Sandbox),
        (status = 400, description = "a malformed body", body = Error),
        (status = 404, description = "no such template", body = Error),
        (status = 409, description = "the key was used with another body, or its sandbox no longer runs", body = Error),
        (status = 429, description = "the node runs as many sandboxes as max_slots allows", body = Error),
    ),
)]
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
        Json(Sandbox::new(&info, st.sandbox_domain.as_deref())),
    )
        .into_response())
}

/// Create a sandbox (the v1 path, the same as v2).
#[utoipa::path(
    post, path = "/sandboxes", tag = "sandboxes",
    params(("Idempotency-Key" = Option<String>, Header, description = "as for v2")),
    request_body = NewSandbox,
    responses(
        (status = 201, description = "created", body = Sandbox),
        (status = 400, description = "a malformed body", body = Error),
        (status = 404, description = "no such template", body = Error),
        (status = 409, description = "as for v2", body = Error),
        (status = 429, description = "as for v2", body = Error),
    ),
)]
pub async fn create_v1(
    st: State<AppState>,
    headers: HeaderMap,
    raw: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    create(st, headers, raw).await
}

const LIVE: &[SandboxState] = &[SandboxState::Running, SandboxState::Paused];

/// List sandboxes: running and paused by default (`state=dead` shows
/// sandboxes whose VM died), paged through the `x-next-token` header.
#[utoipa::path(
    get, path = "/v2/sandboxes", tag = "sandboxes",
    params(
        ("state" = Option<String>, Query, description = "comma-separated running,paused,dead"),
        ("metadata" = Option<String>, Query, description = "url-encoded k=v&k2=v2"),
        ("template" = Option<String>, Query),
        ("startedAfter" = Option<chrono::DateTime<chrono::Utc>>, Query),
        ("order" = Option<String>, Query, description = "asc or desc"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000),
        ("nextToken" = Option<String>, Query),
    ),
    responses(
        (status = 200, description = "one page", body = [ListedSandbox],
            headers(("x-next-token" = String, description = "the next page's token"))),
        (status = 400, description = "a malformed query", body = Error),
    ),
)]
pub async fn list_v2(
    State(st): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = query::parse(raw.as_deref(), LIVE)?;
    let (items, next) = list_page(&st, &q).await?;
    let mut headers = HeaderMap::new();
    if let Some(token) = next {
        if let Ok(v) = HeaderValue::from_str(&token) {
            headers.insert("x-next-token", v);
        }
    }
    let body: Vec<ListedSandbox> = items.iter().map(ListedSandbox::new).collect();
    Ok((headers, Json(body)).into_response())
}

/// List running sandboxes (v1).
#[utoipa::path(
    get, path = "/sandboxes", tag = "sandboxes",
    params(("metadata" = Option<String>, Query, description = "url-encoded k=v&k2=v2")),
    responses(
        (status = 200, description = "running sandboxes", body = [ListedSandbox]),
        (status = 400, description = "a malformed query", body = Error),
    ),
)]
pub async fn list_v1(
    State(st): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<ListedSandbox>>, ApiError> {
    let mut q = query::parse(raw.as_deref(), &[SandboxState::Running])?;
    q.limit = Some(siesta_sandbox::store::MAX_LIMIT);
    let (items, _) = list_page(&st, &q).await?;
    Ok(Json(items.iter().map(ListedSandbox::new).collect()))
}

/// One page of this node's sandboxes, or of the cluster's when the node
/// is in one.
async fn list_page(
    st: &AppState,
    q: &siesta_sandbox::ListQuery,
) -> Result<(Vec<siesta_sandbox::sandbox::SandboxInfo>, Option<String>), ApiError> {
    match &st.cluster {
        Some(cluster) => crate::cluster_front::list::list_page(cluster, q).await,
        None => Ok(st.manager.list_page(q).await?),
    }
}

/// One sandbox.
#[utoipa::path(
    get, path = "/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    responses(
        (status = 200, description = "the sandbox", body = SandboxDetail),
        (status = 404, description = "no such sandbox", body = Error),
        (status = 410, description = "its VM died", body = Error),
    ),
)]
pub async fn detail(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<SandboxDetail>, ApiError> {
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
    Ok(Json(SandboxDetail::new(
        &info,
        st.sandbox_domain.as_deref(),
    )))
}

/// Kill a sandbox and delete its files.
#[utoipa::path(
    delete, path = "/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    responses(
        (status = 204, description = "killed"),
        (status = 404, description = "no such sandbox", body = Error),
    ),
)]
pub async fn kill(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    st.manager.kill(&id).await?;
    st.sandbox_metrics.forget(&id);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default, ToSchema)]
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

/// Pause a running sandbox to disk.
#[utoipa::path(
    post, path = "/sandboxes/{id}/pause", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    request_body(content = Option<PauseBody>, description = "optional"),
    responses(
        (status = 204, description = "paused"),
        (status = 400, description = "a malformed body", body = Error),
        (status = 404, description = "no such sandbox", body = Error),
        (status = 409, description = "not running (already paused, or dead)", body = Error),
        (status = 503, description = "`requireHealthyGuest` and the guest does not answer; it runs on", body = Error),
    ),
)]
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

#[derive(Deserialize, Default, ToSchema)]
pub struct ConnectBody {
    /// Its deadline becomes at least this many seconds from now.
    timeout: Option<u64>,
    /// `false`: a paused sandbox comes back from its disk alone (a cold
    /// boot; E2B's `on_resume="reboot"`).
    memory: Option<bool>,
}

/// What connect, its v1 path and resume answer (for the document only).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
enum ConnectAnswers {
    /// it was running
    #[response(status = 200)]
    Running(Sandbox),
    /// resumed
    #[response(status = 201)]
    Resumed(Sandbox),
    /// a malformed body
    #[response(status = 400)]
    Malformed(Error),
    /// no such sandbox
    #[response(status = 404)]
    Missing(Error),
    /// dead, or its guest did not come back
    #[response(status = 409)]
    Conflict(Error),
    /// the node runs as many sandboxes as max_slots allows
    #[response(status = 429)]
    NodeFull(Error),
}

/// Resume a paused sandbox (201) or return a running one (200); either
/// way its deadline becomes at least `timeout` seconds from now.
#[utoipa::path(
    post, path = "/v2/sandboxes/{id}/connect", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    request_body(content = Option<ConnectBody>, description = "optional"),
    responses(ConnectAnswers),
)]
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
        Json(Sandbox::new(&info, st.sandbox_domain.as_deref())),
    )
        .into_response())
}

/// Resume or connect (the v1 path, the same as v2).
#[utoipa::path(
    post, path = "/sandboxes/{id}/connect", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    request_body(content = Option<ConnectBody>, description = "optional"),
    responses(ConnectAnswers),
)]
pub async fn connect_v1(
    st: State<AppState>,
    id: Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    connect(st, id, raw).await
}

/// Resume a paused sandbox (the older E2B path; the same as connect).
#[utoipa::path(
    post, path = "/sandboxes/{id}/resume", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    request_body(content = Option<ConnectBody>, description = "optional"),
    responses(ConnectAnswers),
)]
pub async fn resume(
    st: State<AppState>,
    id: Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    connect(st, id, raw).await
}

#[derive(Deserialize, ToSchema)]
pub struct TimeoutBody {
    /// Seconds from now.
    timeout: u64,
}

/// Set a running sandbox's deadline to `timeout` seconds from now.
#[utoipa::path(
    post, path = "/sandboxes/{id}/timeout", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    request_body = TimeoutBody,
    responses(
        (status = 204, description = "deadline set"),
        (status = 400, description = "a malformed body", body = Error),
        (status = 404, description = "no such sandbox", body = Error),
    ),
)]
pub async fn set_timeout(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Result<Json<TimeoutBody>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let req = body(req)?;
    st.manager.set_timeout(&id, req.timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default, ToSchema)]
pub struct RefreshBody {
    /// Seconds (default 60).
    #[schema(maximum = 3600)]
    duration: Option<u64>,
}

/// Keep a running sandbox alive at least `duration` seconds more
/// (default 60, at most 3600).
#[utoipa::path(
    post, path = "/sandboxes/{id}/refreshes", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    request_body(content = Option<RefreshBody>, description = "optional"),
    responses(
        (status = 204, description = "deadline at least now + duration"),
        (status = 400, description = "a malformed body or too long", body = Error),
        (status = 404, description = "no such sandbox", body = Error),
        (status = 409, description = "not running", body = Error),
    ),
)]
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
#[derive(Deserialize, ToSchema)]
pub struct UpdateNetwork {
    /// Absent: the internet switch stays as it was.
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(flatten)]
    network: NetworkBody,
}

/// Replace a sandbox's egress rules, at once if it runs.
#[utoipa::path(
    put, path = "/sandboxes/{id}/network", tag = "sandboxes", params(("id" = String, Path, description = "the sandbox's id")),
    request_body = UpdateNetwork,
    responses(
        (status = 204, description = "rules replaced"),
        (status = 400, description = "a malformed body or an option not supported", body = Error),
        (status = 404, description = "no such sandbox", body = Error),
        (status = 409, description = "dead", body = Error),
    ),
)]
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
