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
#[cfg(test)]
mod openapi_check;
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
use axum::routing::{MethodFilter, MethodRouter};
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

/// One path of the API and the handler of each method it answers. The
/// router is built from [`control_routes`] and [`public_routes`], and a test
/// (`openapi_document_names_every_route`) checks that the served OpenAPI
/// document lists exactly these paths and methods.
pub(crate) struct ApiRoute {
    pub path: &'static str,
    /// Read by the OpenAPI document check (a test).
    #[cfg_attr(not(test), allow(dead_code))]
    pub methods: Vec<&'static str>,
    pub handler: MethodRouter<AppState>,
}

/// `api_route!(path, METHOD => handler, ...)`: the methods named once, for
/// both the router and the inventory.
macro_rules! api_route {
    ($path:expr, $($method:ident => $handler:expr),+ $(,)?) => {{
        let handler = MethodRouter::<AppState>::new()
            $(.on(MethodFilter::$method, $handler))+;
        ApiRoute {
            path: $path,
            methods: vec![$(stringify!($method)),+],
            handler,
        }
    }};
}

/// The routes that need the node's API key.
pub(crate) fn control_routes() -> Vec<ApiRoute> {
    vec![
        api_route!("/sandboxes", POST => sandboxes::create, GET => sandboxes::list_v1),
        api_route!("/v2/sandboxes", POST => sandboxes::create, GET => sandboxes::list_v2),
        api_route!("/sandboxes/{id}", GET => sandboxes::detail, DELETE => sandboxes::kill),
        api_route!("/sandboxes/{id}/pause", POST => sandboxes::pause),
        api_route!("/sandboxes/{id}/connect", POST => sandboxes::connect),
        api_route!("/v2/sandboxes/{id}/connect", POST => sandboxes::connect),
        api_route!("/sandboxes/{id}/resume", POST => sandboxes::connect),
        api_route!("/sandboxes/{id}/timeout", POST => sandboxes::set_timeout),
        api_route!("/sandboxes/{id}/network", PUT => sandboxes::set_network),
        api_route!("/sandboxes/{id}/metrics", GET => metrics::one),
        api_route!("/sandboxes/metrics", GET => metrics::many),
        api_route!("/sandboxes/{id}/logs", GET => logs::v1),
        api_route!("/v2/sandboxes/{id}/logs", GET => logs::v2),
        api_route!("/sandboxes/{id}/refreshes", POST => sandboxes::refresh),
        api_route!("/sandboxes/{id}/snapshots", POST => snapshots::create),
        api_route!("/sandboxes/{id}/fork", POST => snapshots::fork),
        api_route!("/snapshots", GET => snapshots::list),
        api_route!("/templates", GET => templates::list),
        api_route!("/v3/templates", POST => template_builds::create),
        api_route!(
            "/templates/{id}",
            GET => template_builds::get,
            DELETE => template_builds::delete,
        ),
        api_route!("/templates/aliases/{alias}", GET => template_builds::alias),
        api_route!(
            "/templates/tags",
            POST => template_tags::assign,
            DELETE => template_tags::remove,
        ),
        api_route!("/templates/{id}/tags", GET => template_tags::list),
        api_route!(
            "/secrets",
            GET => unsupported::secrets_list,
            POST => unsupported::secrets_store,
        ),
        api_route!(
            "/secrets/{id}",
            GET => unsupported::secret_missing,
            POST => unsupported::secret_missing,
            DELETE => unsupported::secret_missing,
        ),
        api_route!("/volumes", POST => volumes::create, GET => volumes::list),
        api_route!("/volumes/{id}", GET => volumes::get, DELETE => volumes::delete),
        api_route!("/templates/{id}/files/{hash}", GET => template_builds::files),
        api_route!("/v2/templates/{id}/builds/{build}", POST => template_builds::start),
        api_route!(
            "/templates/{id}/builds/{build}/status",
            GET => template_builds::status,
        ),
        api_route!(
            "/templates/{id}/builds/{build}/logs",
            GET => template_builds::logs,
        ),
    ]
}

/// The routes without the API key: node endpoints, signed upload links,
/// and the volume content API (each volume's own bearer token).
pub(crate) fn public_routes() -> Vec<ApiRoute> {
    vec![
        api_route!("/health", GET => node::health),
        api_route!("/metrics", GET => node::prometheus),
        api_route!("/openapi.yaml", GET => node::openapi),
        api_route!("/template-files/{hash}", PUT => template_builds::upload),
        api_route!(
            "/volumecontent/{id}/file",
            GET => volume_content::read_file,
            PUT => volume_content::write_file,
        ),
        api_route!(
            "/volumecontent/{id}/dir",
            GET => volume_content::list_dir,
            POST => volume_content::make_dir,
        ),
        api_route!(
            "/volumecontent/{id}/path",
            GET => volume_content::stat,
            PATCH => volume_content::set_attrs,
            DELETE => volume_content::remove,
        ),
    ]
}

fn add_routes(router: Router<AppState>, routes: Vec<ApiRoute>) -> Router<AppState> {
    routes
        .into_iter()
        .fold(router, |r, route| r.route(route.path, route.handler))
}

pub fn router(state: AppState) -> Router {
    let control = add_routes(Router::new(), control_routes()).route_layer(
        middleware::from_fn_with_state(state.clone(), require_api_key),
    );
    add_routes(Router::new(), public_routes())
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
