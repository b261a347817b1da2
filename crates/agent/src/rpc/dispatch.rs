//! The method table: which handler serves `/{package.Service}/{Method}`,
//! and whether it is unary, server-streaming or client-streaming.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::Response;
use http::HeaderMap;

use super::codec::Framing;
use super::server::{error_response, Incoming};
use super::{Code, RequestContext, RpcError};
use crate::state::AgentState;

/// Every method the agent serves, with its kind.
const METHODS: &[(&str, &str, Framing)] = &[
    ("process.Process", "List", Framing::Unary),
    ("process.Process", "Start", Framing::Stream),
    ("process.Process", "Connect", Framing::Stream),
    ("process.Process", "Update", Framing::Unary),
    ("process.Process", "StreamInput", Framing::Stream),
    ("process.Process", "SendInput", Framing::Unary),
    ("process.Process", "SendSignal", Framing::Unary),
    ("process.Process", "CloseStdin", Framing::Unary),
    ("filesystem.Filesystem", "Stat", Framing::Unary),
    ("filesystem.Filesystem", "MakeDir", Framing::Unary),
    ("filesystem.Filesystem", "Move", Framing::Unary),
    ("filesystem.Filesystem", "ListDir", Framing::Unary),
    ("filesystem.Filesystem", "Remove", Framing::Unary),
    ("filesystem.Filesystem", "WatchDir", Framing::Stream),
    ("filesystem.Filesystem", "CreateWatcher", Framing::Unary),
    ("filesystem.Filesystem", "GetWatcherEvents", Framing::Unary),
    ("filesystem.Filesystem", "RemoveWatcher", Framing::Unary),
];

/// The axum handler for `POST /{service}/{method}`.
pub async fn handle(
    State(state): State<AgentState>,
    Path((service, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(&(_, _, framing)) = METHODS
        .iter()
        .find(|(s, m, _)| *s == service && *m == method)
    else {
        return error_response(&RpcError::new(
            Code::Unimplemented,
            format!("/{service}/{method} is not implemented"),
        ));
    };
    if let Err(e) = crate::auth::check_access_token(&state, &headers).await {
        return error_response(&e);
    }
    let default_user = state.defaults.read().await.user.clone();
    let ctx = match RequestContext::from_headers(&headers, default_user.as_deref()) {
        Ok(ctx) => ctx,
        Err(e) => return error_response(&e),
    };
    let call = match Incoming::new(ctx, &headers, body, framing) {
        Ok(call) => call,
        Err(response) => return *response,
    };
    route(&state, &service, &method, call).await
}

async fn route(state: &AgentState, service: &str, method: &str, call: Incoming) -> Response {
    let p = &state.processes;
    let fs = &state.filesystem;
    match (service, method) {
        ("process.Process", "List") => call.unary(|c, r| async move { p.list(&c, r).await }).await,
        ("process.Process", "Start") => {
            call.server_stream(true, |c, r| async move { p.start(&c, r).await })
                .await
        }
        ("process.Process", "Connect") => {
            call.server_stream(true, |c, r| async move { p.connect(&c, r).await })
                .await
        }
        ("process.Process", "Update") => {
            call.unary(|c, r| async move { p.update(&c, r).await })
                .await
        }
        ("process.Process", "StreamInput") => {
            call.client_stream(|c, r| async move { p.stream_input(&c, r).await })
                .await
        }
        ("process.Process", "SendInput") => {
            call.unary(|c, r| async move { p.send_input(&c, r).await })
                .await
        }
        ("process.Process", "SendSignal") => {
            call.unary(|c, r| async move { p.send_signal(&c, r).await })
                .await
        }
        ("process.Process", "CloseStdin") => {
            call.unary(|c, r| async move { p.close_stdin(&c, r).await })
                .await
        }
        ("filesystem.Filesystem", "Stat") => {
            call.unary(|c, r| async move { fs.stat(&c, r).await }).await
        }
        ("filesystem.Filesystem", "MakeDir") => {
            call.unary(|c, r| async move { fs.make_dir(&c, r).await })
                .await
        }
        ("filesystem.Filesystem", "Move") => {
            call.unary(|c, r| async move { fs.move_(&c, r).await })
                .await
        }
        ("filesystem.Filesystem", "ListDir") => {
            call.unary(|c, r| async move { fs.list_dir(&c, r).await })
                .await
        }
        ("filesystem.Filesystem", "Remove") => {
            call.unary(|c, r| async move { fs.remove(&c, r).await })
                .await
        }
        ("filesystem.Filesystem", "WatchDir") => {
            call.server_stream(true, |c, r| async move { fs.watch_dir(&c, r).await })
                .await
        }
        ("filesystem.Filesystem", "CreateWatcher") => {
            call.unary(|c, r| async move { fs.create_watcher(&c, r).await })
                .await
        }
        ("filesystem.Filesystem", "GetWatcherEvents") => {
            call.unary(|c, r| async move { fs.get_watcher_events(&c, r).await })
                .await
        }
        ("filesystem.Filesystem", "RemoveWatcher") => {
            call.unary(|c, r| async move { fs.remove_watcher(&c, r).await })
                .await
        }
        // METHODS and this match list the same methods; a mismatch is a bug
        // here, reported rather than panicking.
        _ => error_response(&RpcError::internal(format!(
            "no route for /{service}/{method}"
        ))),
    }
}
