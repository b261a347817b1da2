//! siesta-server: the node's HTTP API.
//!
//! The control API follows the E2B wire contract
//! (`shared/reference/e2b-contract.md` §2) so the official SDKs and the
//! `siesta` CLI drive the same endpoints. Every control request needs the
//! node's API key in `X-API-KEY`; errors are JSON `{"code","message"}`.

mod api_key;
pub mod builds;
pub mod cluster_front;
pub mod conn;
mod error;
pub mod listen;
mod metrics;
pub mod peers;
pub mod proxy;
mod routes;
mod sandbox_metrics;
mod unread_body;

pub use api_key::{is_e2b_shaped, key_file, load_or_create_api_keys, ApiKeys};
pub use listen::HttpLimits;
pub use metrics::Metrics;
pub use routes::openapi::yaml as openapi_yaml;
pub use routes::{router, AppState};

use std::net::SocketAddr;
use std::sync::Arc;

use siesta_sandbox::SandboxManager;

/// How the server presents itself, and the node's parts it serves
/// besides the sandbox manager.
#[derive(Clone)]
pub struct ServerOptions {
    /// The `domain` of its sandboxes: the SDK's `get_host(port)` is
    /// `{port}-{sandboxID}.{domain}`, which the front door routes by Host.
    pub sandbox_domain: Option<String>,
    /// The node's volumes (`$SIESTA_HOME/volumes`).
    pub volumes: Arc<siesta_volume::Volumes>,
    /// The cluster this node belongs to (none: it works alone).
    pub cluster: Option<Arc<siesta_cluster::Cluster>>,
    /// Header timeout and connection cap of the listener.
    pub limits: HttpLimits,
}

/// Serves the API on `listen` until `shutdown` resolves.
pub async fn serve(
    listen: SocketAddr,
    manager: Arc<SandboxManager>,
    api_keys: ApiKeys,
    options: ServerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "siesta server listening");
    let targets = Arc::new(proxy::ManagerTargets(manager.clone()));
    let files = manager.node().config.layout().build_files();
    let state = AppState {
        manager,
        api_keys,
        metrics: Arc::new(Metrics::default()),
        builds: Arc::new(builds::Builds::new(files)),
        sandbox_metrics: Arc::default(),
        sandbox_domain: options.sandbox_domain,
        volumes: options.volumes,
        cluster: options.cluster.clone(),
    };
    let cluster = options.cluster.clone();
    let manager = state.manager.clone();
    let control_keys = state.api_keys.clone();
    let mut app = proxy::front(router(state), targets, control_keys.clone());
    if let Some(cluster) = cluster {
        let front = cluster_front::ClusterFront {
            cluster,
            manager,
            api_keys: control_keys,
        };
        app = cluster_front::front(app, front);
    }
    // Outermost, so that the front door's refusals are covered too.
    let app = app.layer(axum::middleware::from_fn(unread_body::close_if_body_unread));
    listen::serve_app(listener, app, options.limits, shutdown).await;
    Ok(())
}
