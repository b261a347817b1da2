//! The control API: the E2B subset the SDKs call, plus node endpoints.
//!
//! | file | endpoints |
//! |---|---|
//! | `sandboxes.rs` | create, list, get, kill, pause, connect/resume, timeout |
//! | `metrics.rs` | a sandbox's metrics over time, the latest of several |
//! | `snapshots.rs` | snapshots of running sandboxes (create, list, delete), fork |
//! | `templates.rs` | templates list, the `Template` model |
//! | `template_tags.rs` | template tags: assign, remove, list |
//! | `template_builds.rs` | the E2B template build API: create, upload links, start, status, logs; alias, get, delete |
//! | `volumes.rs` | volumes: create, list, get, delete |
//! | `volume_content.rs` | a volume's files, authorised by the volume's token |
//! | `node.rs` | `/health`, Prometheus `/metrics`, `/openapi.yaml` |
//! | `model.rs` | the JSON models (`Sandbox`, `SandboxDetail`, `ListedSandbox`) |
//! | `query.rs` | the list query string (double-encoded metadata, comma states) |

mod logs;
mod metrics;
mod model;
mod network;
mod node;
mod query;
mod sandboxes;
mod snapshots;
mod template_builds;
mod template_tags;
mod templates;
mod unsupported;
mod volume_content;
mod volumes;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use siesta_sandbox::SandboxManager;
use siesta_volume::Volumes;

use crate::error::ApiError;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<SandboxManager>,
    pub api_keys: crate::ApiKeys,
    pub metrics: Arc<Metrics>,
    pub builds: crate::builds::SharedBuilds,
    pub sandbox_metrics: Arc<crate::sandbox_metrics::SandboxMetrics>,
    /// What the SDK builds sandbox host names with (`ServerOptions`).
    pub sandbox_domain: Option<String>,
    /// The node's volumes.
    pub volumes: Arc<Volumes>,
}

pub fn router(state: AppState) -> Router {
    let control = Router::new()
        .route(
            "/sandboxes",
            post(sandboxes::create).get(sandboxes::list_v1),
        )
        .route(
            "/v2/sandboxes",
            post(sandboxes::create).get(sandboxes::list_v2),
        )
        .route(
            "/sandboxes/{id}",
            get(sandboxes::detail).delete(sandboxes::kill),
        )
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/v2/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/sandboxes/{id}/resume", post(sandboxes::connect))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/network", put(sandboxes::set_network))
        .route("/sandboxes/{id}/metrics", get(metrics::one))
        .route("/sandboxes/metrics", get(metrics::many))
        .route("/sandboxes/{id}/logs", get(logs::v1))
        .route("/v2/sandboxes/{id}/logs", get(logs::v2))
        .route("/sandboxes/{id}/refreshes", post(sandboxes::refresh))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/snapshots", get(snapshots::list))
        .route("/templates", get(templates::list))
        .route("/v3/templates", post(template_builds::create))
        .route(
            "/templates/{id}",
            get(template_builds::get).delete(template_builds::delete),
        )
        .route("/templates/aliases/{alias}", get(template_builds::alias))
        .route(
            "/templates/tags",
            post(template_tags::assign).delete(template_tags::remove),
        )
        .route("/templates/{id}/tags", get(template_tags::list))
        .route(
            "/secrets",
            get(unsupported::secrets_list).post(unsupported::secrets_store),
        )
        .route(
            "/secrets/{id}",
            get(unsupported::secret_missing)
                .post(unsupported::secret_missing)
                .delete(unsupported::secret_missing),
        )
        .route("/volumes", post(volumes::create).get(volumes::list))
        .route("/volumes/{id}", get(volumes::get).delete(volumes::delete))
        .route("/templates/{id}/files/{hash}", get(template_builds::files))
        .route(
            "/v2/templates/{id}/builds/{build}",
            post(template_builds::start),
        )
        .route(
            "/templates/{id}/builds/{build}/status",
            get(template_builds::status),
        )
        .route(
            "/templates/{id}/builds/{build}/logs",
            get(template_builds::logs),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(node::health))
        .route("/metrics", get(node::prometheus))
        .route("/openapi.yaml", get(node::openapi))
        // Signed links: the SDK uploads without the API key.
        .route(
            "/template-files/{hash}",
            axum::routing::put(template_builds::upload),
        )
        // The volume content API: each volume's own bearer token.
        .route(
            "/volumecontent/{id}/file",
            get(volume_content::read_file).put(volume_content::write_file),
        )
        .route(
            "/volumecontent/{id}/dir",
            get(volume_content::list_dir).post(volume_content::make_dir),
        )
        .route(
            "/volumecontent/{id}/path",
            get(volume_content::stat)
                .patch(volume_content::set_attrs)
                .delete(volume_content::remove),
        )
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
    if !st.api_keys.accepts(given) {
        let msg = if given.is_empty() {
            "missing X-API-KEY header (the node's key is in $SIESTA_HOME/secrets/api-key)"
        } else {
            "invalid API key"
        };
        return ApiError::new(StatusCode::UNAUTHORIZED, msg).into_response();
    }
    next.run(req).await
}

/// A JSON body whose every parse failure is a 400 JSON error naming what
/// was wrong (a missing field, a wrong type, bad JSON).
pub(crate) fn body<T>(parsed: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    parsed.map(|Json(v)| v).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {}", e.body_text()),
        )
    })
}

/// Like [`body`], but an empty body means the type's default (the SDK
/// sends `{}` or nothing for optional bodies).
pub(crate) fn optional_body<T: Default + serde::de::DeserializeOwned>(
    bytes: &axum::body::Bytes,
) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
}
