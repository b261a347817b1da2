//! The cluster's front door: a request for a sandbox this node does not
//! hold goes to the node that does.
//!
//! Any node answers for any sandbox. A request that names one (a control
//! call under `/sandboxes/{id}` or `/v2/sandboxes/{id}`, or envd traffic
//! routed by `E2b-Sandbox-Id` or `{port}-{id}.{domain}`) and finds it
//! missing here is looked up in etcd ([`siesta_cluster::Cluster::locate`]):
//! held by a live node, it is forwarded there unchanged (streaming both
//! ways, as the envd proxy does) with [`FORWARDED_BY`] set, so it makes one
//! hop at most; held by a node whose lease expired, this node takes the
//! sandbox over when it was paused ([`takeover`]) and serves it itself.
//! Everything else goes on to this node's own routes.
//!
//! Before it forwards or takes over, the front door checks the request as
//! the owner would ([`admitted`]): the API key on a control call, the
//! sandbox's tokens (from its sealed row) on traffic for its ports. A
//! request without them never leaves this node and wakes nothing.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use siesta_cluster::{Cluster, Location, NodeInfo, Owned};
use siesta_sandbox::{Error, SandboxManager};

use crate::error::ApiError;

/// Set on a forwarded request to the id of the node that forwarded it.
pub const FORWARDED_BY: &str = "x-siesta-forwarded-by";

/// Set on a forwarded request's answer to the id of the node that served
/// it (for whoever debugs a cluster).
pub const SERVED_BY: &str = "x-siesta-node";

/// What the front door needs: this node's cluster membership and its
/// sandboxes.
#[derive(Clone)]
pub struct ClusterFront {
    pub cluster: Arc<Cluster>,
    pub manager: Arc<SandboxManager>,
    /// The node's API keys (the cluster's: every node has the same).
    pub api_keys: crate::ApiKeys,
}

/// Puts the cluster's front door before `app`.
pub fn front(app: axum::Router, front: ClusterFront) -> axum::Router {
    app.layer(axum::middleware::from_fn_with_state(
        Arc::new(front),
        dispatch,
    ))
}

async fn dispatch(State(front): State<Arc<ClusterFront>>, req: Request, next: Next) -> Response {
    let Some(id) = sandbox_of(&req) else {
        return served_here(&front, req, next).await;
    };
    if req.headers().contains_key(FORWARDED_BY) {
        return served_here(&front, req, next).await;
    }
    let envd = matches!(
        crate::proxy::route_of(req.headers(), req.uri()),
        Ok(Some(_))
    );
    if !envd && crate::api_key::refusal(&front.api_keys, req.headers()).is_some() {
        // The control API's own 401, before any look-up: a keyless caller
        // costs neither a SQLite nor an etcd read (review M1.2).
        return served_here(&front, req, next).await;
    }
    match front.manager.get(&id).await {
        Err(Error::SandboxNotFound { .. }) => {}
        _ => return served_here(&front, req, next).await,
    }
    match front.cluster.locate(&id).await {
        Ok(Location::Elsewhere(node, owned)) => match admitted(&front, &req, &id, &owned) {
            Ok(()) => forward(&front, &id, &node, req).await,
            Err(e) => e.into_response(),
        },
        Ok(Location::Orphaned(owned)) => match admitted(&front, &req, &id, &owned) {
            Ok(()) => match takeover::adopt(&front, &id, owned).await {
                Ok(()) => served_here(&front, req, next).await,
                Err(e) => e.into_response(),
            },
            Err(e) => e.into_response(),
        },
        Ok(Location::Here | Location::Unknown) => served_here(&front, req, next).await,
        Err(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "sandbox {id} is not on this node, and the cluster state that says where it is \
                 could not be read: {e}"
            ),
        )
        .into_response(),
    }
}

/// Whether `req` may go on to sandbox `id` on another node, or have it
/// taken over: as the owner would check it. A control call needs the API
/// key; traffic for the sandbox's ports needs its tokens, read from its
/// row (a sandbox whose row is not written yet cannot be checked, so
/// nothing reaches it until it is).
fn admitted(front: &ClusterFront, req: &Request, id: &str, owned: &Owned) -> Result<(), ApiError> {
    let route = match crate::proxy::route_of(req.headers(), req.uri()) {
        Ok(Some(route)) => route,
        _ => return crate::api_key::refusal(&front.api_keys, req.headers()).map_or(Ok(()), Err),
    };
    let Some(row) = &owned.row else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "sandbox {id} is being created on node {}; retry in a moment",
                owned.node
            ),
        ));
    };
    if crate::proxy::carries_tokens(req, &route, &row.access_token, row.traffic_token.as_deref()) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNAUTHORIZED,
        format!(
            "sandbox {id}, port {}: the request does not carry the sandbox's access token{}",
            route.port,
            if route.port == crate::proxy::ENVD_PORT {
                " (X-Access-Token)"
            } else {
                " (e2b-traffic-access-token)"
            }
        ),
    ))
}

/// Serves `req` on this node. A control call that may change a sandbox
/// (any method but GET and HEAD) answers only once the rows it changed are
/// in etcd: a client that created or paused a sandbox here and asks
/// another node next finds it where it is.
async fn served_here(front: &ClusterFront, req: Request, next: Next) -> Response {
    let envd = matches!(
        crate::proxy::route_of(req.headers(), req.uri()),
        Ok(Some(_))
    );
    let changes = !envd && !matches!(*req.method(), Method::GET | Method::HEAD);
    let resp = next.run(req).await;
    if changes {
        front.cluster.row_writer().flush().await;
    }
    resp
}

/// The sandbox a request is for, by the envd routing rules or the control
/// API's paths.
fn sandbox_of(req: &Request) -> Option<String> {
    if let Ok(Some(route)) = crate::proxy::route_of(req.headers(), req.uri()) {
        return Some(route.sandbox_id);
    }
    let path = req.uri().path();
    let path = path.strip_prefix("/v2").unwrap_or(path);
    let rest = path.strip_prefix("/sandboxes/")?;
    let id = rest.split('/').next()?;
    // `/sandboxes/metrics` is a collection route, not a sandbox.
    (!id.is_empty() && id != "metrics").then(|| id.to_string())
}

async fn forward(front: &ClusterFront, id: &str, node: &NodeInfo, mut req: Request) -> Response {
    let me = &front.cluster.node().id;
    let unreachable = |detail: String| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "sandbox {id} is on node {} ({}), which did not answer: {detail}",
                node.id, node.api
            ),
        )
        .into_response()
    };
    let addr = match resolve(&node.api).await {
        Ok(addr) => addr,
        Err(detail) => return unreachable(detail),
    };
    if let Ok(value) = HeaderValue::from_str(me) {
        req.headers_mut().insert(FORWARDED_BY, value);
    }
    tracing::debug!(
        sandbox = id,
        node = node.id,
        "forwarding to the owning node"
    );
    match crate::proxy::forward_request(id, addr, req).await {
        Ok(mut resp) => {
            if let Ok(value) = HeaderValue::from_str(&node.id) {
                resp.headers_mut().insert(SERVED_BY, value);
            }
            resp
        }
        Err(e) => unreachable(e.to_string()),
    }
}

async fn resolve(api: &str) -> Result<SocketAddr, String> {
    tokio::net::lookup_host(api)
        .await
        .map_err(|e| format!("resolving {api}: {e}"))?
        .next()
        .ok_or_else(|| format!("{api} resolves to no address"))
}

pub mod list;
mod takeover;

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn requests_name_their_sandbox_by_path_header_or_host() {
        assert_eq!(
            sandbox_of(&req("/sandboxes/abc", &[])).as_deref(),
            Some("abc")
        );
        assert_eq!(
            sandbox_of(&req("/sandboxes/abc/connect", &[])).as_deref(),
            Some("abc")
        );
        assert_eq!(
            sandbox_of(&req("/v2/sandboxes/abc/logs", &[])).as_deref(),
            Some("abc")
        );
        assert_eq!(
            sandbox_of(&req("/files", &[("e2b-sandbox-id", "abc")])).as_deref(),
            Some("abc")
        );
        assert_eq!(
            sandbox_of(&req("/files", &[("host", "49983-abc.localhost:3000")])).as_deref(),
            Some("abc")
        );
        assert_eq!(sandbox_of(&req("/sandboxes", &[])), None);
        assert_eq!(sandbox_of(&req("/sandboxes/metrics", &[])), None);
        assert_eq!(sandbox_of(&req("/v2/sandboxes", &[])), None);
        assert_eq!(sandbox_of(&req("/templates/base", &[])), None);
    }
}
