//! The egress proxy: domain rules for a slot.
//!
//! nftables cannot match names, so when a slot's policy allows domains its
//! table redirects the guest's TCP connections to ports 80 and 443 (except
//! those to an `allow_out` address, which pass directly) to a listener on
//! the slot's gateway address, inside the slot's namespace. For each
//! connection the proxy:
//!
//! 1. reads the first bytes and finds the name asked for: the TLS server
//!    name (SNI) or the HTTP `Host` header ([`sniff`]);
//! 2. decides: a name an `allow_domains` pattern matches is resolved by the
//!    node ([`Resolver`]) and connected to at what it resolves to (never the
//!    address the guest chose, so a guest cannot pair an allowed name with
//!    a forbidden address); any other connection goes to its original
//!    address only if the address rules allow that address;
//! 3. connects from a socket made inside the slot's namespace, so the
//!    traffic leaves exactly as the guest's own would, and copies bytes
//!    both ways. TLS is never terminated.
//!
//! A refused plain-HTTP request gets a 403 that says why; a refused TLS
//! connection is closed. The proxy runs on the server's runtime while the
//! slot's policy has domain rules, sees policy updates at once, and its
//! connections end when it stops (policy change, slot released, slot
//! destroyed).
//!
//! A slot's proxy carries at most [`MAX_CONNECTIONS_PER_SLOT`] connections
//! at once (each holds two descriptors, a task and, while it connects, a
//! thread in the slot's namespace); past it, new ones are closed as they
//! come, so one guest cannot exhaust the node's descriptors.

mod connection;
pub mod domain;
mod resolve;
pub mod sniff;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};

pub use domain::DomainPattern;
pub use resolve::Resolver;

use crate::boundary::Boundary;
use crate::error::Result;
use crate::layout::{EGRESS_PROXY_PORT, GATEWAY_ADDR};
use crate::policy::EgressPolicy;

/// Connections one slot's proxy carries at once; more are closed at once.
pub const MAX_CONNECTIONS_PER_SLOT: usize = 512;

/// How often a slot at its cap is logged, at most.
const FULL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// A running proxy for one slot; stops when dropped.
pub struct EgressProxy {
    policy: watch::Sender<Arc<EgressPolicy>>,
    task: AbortHandle,
}

impl EgressProxy {
    /// Binds `GATEWAY_ADDR:EGRESS_PROXY_PORT` inside the namespace at
    /// `netns` and serves it with `policy` until dropped.
    pub async fn start(
        scope: String,
        netns: PathBuf,
        resolver: Arc<Resolver>,
        boundary: Arc<Boundary>,
        policy: EgressPolicy,
    ) -> Result<Self> {
        let listener =
            crate::netns::in_netns(&scope, netns.clone(), "binding the egress proxy", || {
                let l = std::net::TcpListener::bind((GATEWAY_ADDR, EGRESS_PROXY_PORT))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .await?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| crate::NetError::io(&scope, "egress proxy listener", e))?;
        let (tx, rx) = watch::channel(Arc::new(policy));
        let ctx = Arc::new(connection::Context {
            scope,
            netns,
            resolver,
            boundary,
            policy: rx,
        });
        let task = tokio::spawn(serve(listener, ctx, MAX_CONNECTIONS_PER_SLOT)).abort_handle();
        Ok(Self { policy: tx, task })
    }

    /// The rules new connections are decided by from now on.
    pub fn update(&self, policy: EgressPolicy) {
        self.policy.send_replace(Arc::new(policy));
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every
        // connection it carries.
        self.task.abort();
    }
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("policy", &*self.policy.borrow())
            .finish()
    }
}

async fn serve(listener: tokio::net::TcpListener, ctx: Arc<connection::Context>, max: usize) {
    let mut connections = JoinSet::new();
    let mut logged_full: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) if connections.len() >= max => {
                    drop(stream);
                    if logged_full.is_none_or(|t| t.elapsed() > FULL_LOG_EVERY) {
                        logged_full = Some(std::time::Instant::now());
                        tracing::warn!(scope = %ctx.scope, max, "egress proxy at its connection cap: new connections are closed");
                    }
                }
                Ok((stream, peer)) => {
                    let ctx = ctx.clone();
                    connections.spawn(async move {
                        if let Err(e) = connection::handle(&ctx, stream).await {
                            tracing::info!(scope = %ctx.scope, %peer, "egress proxy: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(scope = %ctx.scope, "egress proxy accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpStream;

    use super::*;

    #[tokio::test]
    async fn a_slot_past_its_connection_cap_has_new_connections_closed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_policy, rx) = watch::channel(Arc::new(EgressPolicy::default()));
        let ctx = Arc::new(connection::Context {
            scope: "test".into(),
            netns: PathBuf::from("/proc/self/ns/net"),
            resolver: Arc::new(Resolver::new(None)),
            boundary: Arc::new(Boundary::default()),
            policy: rx,
        });
        let server = tokio::spawn(serve(listener, ctx, 2));
        // The attack: a guest opens connections and names no host, each
        // held until the head timeout.
        let held = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        // Closed (EOF or reset) while the two before it are still carried.
        let n = third.read(&mut byte).await.unwrap_or(0);
        assert_eq!(n, 0, "a connection past the cap was carried");
        for conn in &held {
            match conn.try_read(&mut byte) {
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
                Ok(n) => panic!("a carried connection ended early ({n} bytes)"),
            }
        }
        server.abort();
    }
}
