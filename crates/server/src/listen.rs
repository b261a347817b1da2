//! The server's HTTP listener, with the limits `axum::serve` does not set.
//!
//! - **Header timeout.** A client must bring a request's head within
//!   [`HttpLimits::header_timeout`]: on a fresh connection (HTTP/1 or h2c),
//!   and on a kept-alive HTTP/1 connection between requests (hyper's
//!   `header_read_timeout` runs while it waits for the next head, so it is
//!   the idle timeout too). A client that opens connections and sends a
//!   few bytes of a header, or nothing, no longer holds them forever.
//! - **Nothing bounds a request once its head is in.** Connect streams,
//!   uploads, downloads and upgraded connections last as long as they need
//!   (a process's output stream lives as long as the process).
//! - **A cap on open connections** ([`HttpLimits::max_connections`]). Past
//!   it, new connections wait in the kernel's accept queue until one
//!   closes, instead of the server running out of descriptors, which would
//!   also stop its sandboxes' QEMU from opening files.
//! - **A share of the cap per client address**
//!   ([`HttpLimits::max_connections_per_ip`], see [`crate::peers`]), so one
//!   host cannot hold every place.
//!
//! HTTP/2 connections get a ping every [`H2_PING`]; a peer that does not
//! answer within [`H2_PING_TIMEOUT`] is dropped.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::conn::Conn;
use crate::peers::PeerCounts;

/// How often an HTTP/2 connection is pinged, and how long the answer may
/// take before the connection is dropped.
pub const H2_PING: Duration = Duration::from_secs(30);
pub const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// How often reaching the connection cap is logged, at most.
const FULL_LOG_EVERY: Duration = Duration::from_secs(60);

/// Limits on the server's client connections (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
    /// Most connections open at once from one client address; past it that
    /// address's new connections are closed at once.
    pub max_connections_per_ip: usize,
}

impl HttpLimits {
    pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
    /// Each connection holds a descriptor, and a proxied one a second to
    /// the guest: well under the systemd unit's `LimitNOFILE`.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
    /// A tenth of the cap: room for a busy client's pool, and no single host
    /// can fill the server. Behind a reverse proxy every client is the
    /// proxy's address: raise it to the cap there.
    pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1_000;
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_timeout: Self::DEFAULT_HEADER_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: Self::DEFAULT_MAX_CONNECTIONS_PER_IP,
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves,
/// then waits for open connections to finish (idle ones close at once).
/// Requests carry `ConnectInfo<ConnHandle>`, which can reset their
/// connection (see [`crate::conn`]).
pub async fn serve_app(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let peers = PeerCounts::new(limits.max_connections_per_ip);
    let builder = Arc::new(builder(&limits));
    let graceful = GracefulShutdown::new();
    let mut full = FullLog::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            conn = accept(&listener, &slots, &peers, &mut full, limits.max_connections) => conn,
        };
        tokio::spawn(serve_one(
            accepted,
            builder.clone(),
            app.clone(),
            graceful.watcher(),
            limits.header_timeout,
        ));
    }
    graceful.shutdown().await;
}

/// Serves one connection until it ends, or until `timeout` passes without
/// its first request.
async fn serve_one(
    conn: Conn,
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: Router,
    watcher: Watcher,
    timeout: Duration,
) {
    // Each request gets the connection's handle; `served` notes that one
    // came.
    let served = Arc::new(AtomicBool::new(false));
    let (handle, app) = (conn.handle(), TowerToHyperService::new(app));
    let came = served.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        came.store(true, Ordering::SeqCst);
        req.extensions_mut().insert(ConnectInfo(handle.clone()));
        hyper::service::Service::call(&app, req)
    });
    let conn = watcher.watch(builder.serve_connection_with_upgrades(TokioIo::new(conn), service));
    tokio::pin!(conn);
    // The first request's head must come within the timeout; later ones
    // are hyper's business (HTTP/1) or the pings' (HTTP/2).
    tokio::select! {
        r = conn.as_mut() => return log_end(r),
        () = tokio::time::sleep(timeout) => {}
    }
    if !served.load(Ordering::SeqCst) {
        tracing::debug!("no request within {timeout:?} of connecting: closing");
        return;
    }
    log_end(conn.await);
}

fn builder(limits: &HttpLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_PING)
        .keep_alive_timeout(H2_PING_TIMEOUT)
        // As axum::serve: the CONNECT protocol of HTTP/2 websockets.
        .enable_connect_protocol();
    builder
}

/// The next connection, once a slot is free for it, from a peer under its
/// share of the slots (one over it is closed as it comes).
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    peers: &PeerCounts,
    full: &mut FullLog,
    max: usize,
) -> Conn {
    let slot = slot(slots, full, max).await;
    loop {
        match listener.accept().await {
            Ok((stream, addr)) => {
                let Some(place) = peers.admit(addr.ip()) else {
                    drop(stream);
                    continue;
                };
                // Small envelopes (a process's output) must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                return Conn::new(stream, slot, place);
            }
            // Out of descriptors and the like: wait and go on serving.
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn slot(slots: &Arc<Semaphore>, full: &mut FullLog, max: usize) -> OwnedSemaphorePermit {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return slot;
    }
    full.note(max);
    loop {
        // The semaphore is never closed; should it be, wait and retry
        // rather than serve past the cap.
        match slots.clone().acquire_owned().await {
            Ok(slot) => return slot,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Logs reaching the cap once a minute at most: under a flood, every
/// connection would otherwise log.
#[derive(Default)]
struct FullLog {
    last: Option<Instant>,
}

impl FullLog {
    fn note(&mut self, max: usize) {
        if self.last.is_some_and(|t| t.elapsed() < FULL_LOG_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        tracing::warn!(
            max,
            "at the connection limit: new connections wait until one closes (server --max-connections)"
        );
    }
}

fn log_end(result: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
    if let Err(e) = result {
        tracing::debug!("connection ended: {e}");
    }
}
