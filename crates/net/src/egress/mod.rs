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
        let task = tokio::spawn(serve(listener, ctx)).abort_handle();
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

async fn serve(listener: tokio::net::TcpListener, ctx: Arc<connection::Context>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
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
