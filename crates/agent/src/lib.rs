//! siesta-agent: the envd-compatible agent that runs inside every sandbox.
//!
//! It serves the envd protocol on port 49983: plain HTTP endpoints (`/health`,
//! `/init`, `/files`, `/envs`) and two Connect RPC services, `process.Process`
//! and `filesystem.Filesystem`, in both the JSON and the binary protobuf codec.
//! In a guest it also runs as PID 1 (see [`pid1`]).

pub mod auth;
pub mod filesystem;
pub mod http;
pub mod mounts;
pub mod pid1;
pub mod process;
pub mod reaper;
pub mod rpc;
pub mod state;
pub mod users;

use axum::routing::post;
use axum::Router;

pub use state::AgentState;

/// All routes: the plain HTTP endpoints and the Connect services.
pub fn router(state: AgentState) -> Router {
    http::routes()
        .route("/{service}/{method}", post(rpc::handle))
        .with_state(state)
}

/// Serves the agent on `listener` until the process ends. Each connection
/// speaks HTTP/1.1 or h2c (prior knowledge), whichever the client opens with.
pub async fn serve(listener: tokio::net::TcpListener, state: AgentState) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use tower_service::Service;

    let app = router(state);
    loop {
        let (socket, _peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // EMFILE and friends are transient: back off instead of exiting.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small envelopes (start{pid}, keystrokes) must not wait for Nagle.
        let _ = socket.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let mut app = app.clone();
                    async move { app.call(req.map(axum::body::Body::new)).await }
                });
            if let Err(e) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(socket), service)
                .await
            {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
}
