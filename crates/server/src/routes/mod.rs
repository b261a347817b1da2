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
//! | `node.rs` | `/health`, Prometheus `/metrics` (keyed), `/openapi.yaml` |
//! | `model.rs` | the JSON models (`Sandbox`, `SandboxDetail`, `ListedSandbox`, `Error`) |
//! | `openapi.rs` | the OpenAPI document, made from the handlers' `#[utoipa::path]` and the models |
//! | `query.rs` | the list query string (double-encoded metadata, comma states) |

mod logs;
mod metrics;
pub(crate) mod model;
mod network;
mod node;
pub mod openapi;
mod query;
mod sandboxes;
mod snapshots;
mod template_builds;
mod template_files;
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
use axum::{Json, Router};
use siesta_sandbox::SandboxManager;
use siesta_volume::Volumes;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

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
    /// The cluster the node belongs to: lists show every node's sandboxes.
    pub cluster: Option<Arc<siesta_cluster::Cluster>>,
}

/// The routes that need the node's API key. Each handler's
/// `#[utoipa::path]` names its path and methods once, for both the router
/// and the OpenAPI document (`openapi.rs`); `routes!` takes the handlers of
/// one path.
pub(crate) fn control_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(sandboxes::create_v1, sandboxes::list_v1))
        .routes(routes!(sandboxes::create, sandboxes::list_v2))
        .routes(routes!(sandboxes::detail, sandboxes::kill))
        .routes(routes!(sandboxes::pause))
        .routes(routes!(sandboxes::connect_v1))
        .routes(routes!(sandboxes::connect))
        .routes(routes!(sandboxes::resume))
        .routes(routes!(sandboxes::set_timeout))
        .routes(routes!(sandboxes::set_network))
        .routes(routes!(metrics::one))
        .routes(routes!(metrics::many))
        .routes(routes!(logs::v1))
        .routes(routes!(logs::v2))
        .routes(routes!(sandboxes::refresh))
        .routes(routes!(snapshots::create))
        .routes(routes!(snapshots::fork))
        .routes(routes!(snapshots::list))
        .routes(routes!(templates::list))
        .routes(routes!(template_builds::create))
        .routes(routes!(template_builds::get, template_builds::delete))
        .routes(routes!(template_builds::alias))
        .routes(routes!(template_tags::assign, template_tags::remove))
        .routes(routes!(template_tags::list))
        .routes(routes!(
            unsupported::secrets_list,
            unsupported::secrets_store
        ))
        .routes(routes!(unsupported::secret_missing))
        .routes(routes!(volumes::create, volumes::list))
        .routes(routes!(volumes::get, volumes::delete))
        .routes(routes!(template_files::files))
        .routes(routes!(template_builds::start))
        .routes(routes!(template_builds::status))
        .routes(routes!(template_builds::logs))
        .routes(routes!(node::prometheus))
}

/// The routes without the API key: node endpoints, signed upload links,
/// and the volume content API (each volume's own bearer token).
pub(crate) fn public_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(node::health))
        .routes(routes!(node::openapi))
        .routes(routes!(template_files::upload))
        .routes(routes!(
            volume_content::read_file,
            volume_content::write_file
        ))
        .routes(routes!(volume_content::list_dir, volume_content::make_dir))
        .routes(routes!(
            volume_content::stat,
            volume_content::set_attrs,
            volume_content::remove
        ))
}

pub fn router(state: AppState) -> Router {
    let (control, _) = control_routes().split_for_parts();
    let control = control.route_layer(middleware::from_fn_with_state(
        state.clone(),
        require_api_key,
    ));
    let (public, _) = public_routes().split_for_parts();
    public
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
    if let Some(refusal) = crate::api_key::refusal(&st.api_keys, req.headers()) {
        return refusal.into_response();
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
