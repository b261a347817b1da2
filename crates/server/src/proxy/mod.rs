//! The envd front door: requests for a sandbox (by `E2b-Sandbox-Id` header
//! or `{port}-{sandboxID}.{domain}` host, see [`route`]) are forwarded to
//! that sandbox's port, streaming both ways ([`forward`]). A paused sandbox
//! is resumed first when it asked for auto-resume ([`target`]) and the
//! request is one it would accept ([`wake`]). A response still streaming
//! when its sandbox stops is cut off, so the client sees the connection
//! drop at once. Every other request goes on to the control API. The agent
//! in the guest checks `X-Access-Token` itself. The node's API key never
//! reaches a guest, however a client sends it
//! ([`forward::strip_control_credentials`]).

mod error;
mod forward;
mod route;
mod signed;
mod target;
mod upgrade;
mod wake;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

pub use error::ProxyError;
pub(crate) use forward::forward as forward_request;
pub use route::{
    route_of, route_of_host, Route, ENVD_PORT, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER,
};
pub use signed::SignedFiles;
pub use target::{ManagerTargets, SandboxTargets, Target, TargetError, TargetState};
pub use wake::{carries_tokens, TRAFFIC_TOKEN_HEADER};

/// Puts the proxy in front of `app`: sandbox requests never reach it.
/// `control_keys` are the node's API keys, which never go on to a guest.
pub fn front(
    app: Router,
    targets: Arc<dyn SandboxTargets>,
    control_keys: crate::ApiKeys,
) -> Router {
    let front = Front {
        targets,
        control_keys,
    };
    app.layer(axum::middleware::from_fn_with_state(front, dispatch))
}

#[derive(Clone)]
struct Front {
    targets: Arc<dyn SandboxTargets>,
    control_keys: crate::ApiKeys,
}

async fn dispatch(State(front): State<Front>, mut req: Request, next: Next) -> Response {
    let targets = front.targets.as_ref();
    let route = match route_of(req.headers(), req.uri()) {
        Ok(Some(route)) => route,
        Ok(None) => {
            let signed = signed::SignedFiles::of(req.method(), req.uri());
            match signed_route(targets, signed).await {
                Some(route) => route,
                None => return next.run(req).await,
            }
        }
        Err(e) => return ProxyError::from(e).into_response(),
    };
    // The node's key is for the control API: a guest never sees it.
    forward::strip_control_credentials(req.headers_mut(), |k| front.control_keys.accepts(k));
    match proxy(targets, route, req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

/// The envd route of a signed `/files` URL that names no sandbox (see
/// [`signed`]).
async fn signed_route(
    targets: &dyn SandboxTargets,
    signed: Option<signed::SignedFiles>,
) -> Option<Route> {
    let signed = signed?;
    let sandbox_id = targets.signed_by(&signed).await?;
    Some(Route {
        sandbox_id,
        port: ENVD_PORT,
    })
}

async fn proxy(
    targets: &dyn SandboxTargets,
    route: Route,
    req: Request,
) -> Result<Response, ProxyError> {
    // Before the look-up: a stop announced after it is not missed.
    let mut stopped = targets.stopped();
    // A request without the sandbox's token neither reaches a private port
    // nor wakes a paused sandbox.
    let ip = wake::reach(targets, &route, &wake::Credentials::of(&req)).await?;
    let conn = req
        .extensions()
        .get::<axum::extract::ConnectInfo<crate::conn::ConnHandle>>()
        .map(|c| c.0.clone());
    let addr = SocketAddr::new(ip, route.port);
    // A guest stopped while it had not answered yet never will: its VM is
    // gone and nothing resets the connection to it.
    let resp = tokio::select! {
        r = forward::forward(&route.sandbox_id, addr, req) => r?,
        () = forward::wait_stopped(&mut stopped, &route.sandbox_id) => {
            return Err(ProxyError::Target {
                id: route.sandbox_id.clone(),
                source: TargetError::Stopped { id: route.sandbox_id },
            });
        }
    };
    Ok(forward::end_when_stopped(
        resp,
        route.sandbox_id,
        stopped,
        conn,
    ))
}
