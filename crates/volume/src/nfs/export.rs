//! An NFS server bound inside a network namespace.
//!
//! A socket belongs to the namespace of the thread that creates it, so each
//! export runs on a thread of its own that first enters the sandbox's
//! namespace (`setns` changes only the calling thread) and then runs a
//! single-threaded runtime with the listeners and their connections.
//! Stopping the export drops that runtime, which closes every connection.
//!
//! Two listeners: the guest's, on the address it mounts ([`super::guard`]:
//! bounded framing, checked calls), and `nfsserve`'s own, on an ephemeral
//! port of the namespace's loopback, which only the guard connects to.
//! The guest cannot reach it: a packet for 127.0.0.0/8 arriving on the
//! tap is a martian and dropped, and no other namespace shares that
//! loopback. `nfsserve` offers no entry point per message (its
//! `handle_rpc` is private), only its own listener, hence the second hop.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc;

use nfsserve::tcp::{NFSTcp, NFSTcpListener};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::guard::{self, NfsLimits};
use super::VolumeNfs;

/// The port of a sandbox's first mount; the n-th mount listens on
/// `NFS_BASE_PORT + n`.
pub const NFS_BASE_PORT: u16 = 2049;

/// A running NFS server for one mount of one volume.
pub struct NfsExport {
    addr: SocketAddrV4,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NfsExport {
    /// Serves `fs` on `addr` inside the network namespace `netns` (a path
    /// such as `/run/netns/NAME`), with the default [`NfsLimits`]. Returns
    /// once the listeners are bound.
    pub fn start(netns: &Path, addr: SocketAddrV4, fs: VolumeNfs) -> std::io::Result<Self> {
        Self::start_with(netns, addr, fs, NfsLimits::default())
    }

    /// As [`NfsExport::start`], with other limits. Port 0 in `addr` takes a
    /// free port; [`NfsExport::addr`] tells which.
    pub fn start_with(
        netns: &Path,
        addr: SocketAddrV4,
        fs: VolumeNfs,
        limits: NfsLimits,
    ) -> std::io::Result<Self> {
        let ns = std::fs::File::open(netns).map_err(|e| with_context(e, netns, "opening"))?;
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("nfs-{}", addr.port()))
            .spawn(move || serve(ns, addr, fs, limits, ready_tx, stop_rx))?;
        let ready = ready_rx.recv().unwrap_or_else(|_| {
            Err(std::io::Error::other(
                "the NFS server thread ended before binding",
            ))
        });
        let mut export = Self {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        match ready {
            Ok(bound) => {
                export.addr = bound;
                Ok(export)
            }
            Err(e) => {
                export.shutdown();
                Err(with_context(e, netns, "serving NFS in"))
            }
        }
    }

    /// Where the guest reaches it.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for NfsExport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve(
    ns: std::fs::File,
    addr: SocketAddrV4,
    fs: VolumeNfs,
    limits: NfsLimits,
    ready: mpsc::Sender<std::io::Result<SocketAddrV4>>,
    stop: oneshot::Receiver<()>,
) {
    // SAFETY: a valid namespace descriptor; setns affects only this thread.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let _ = ready.send(Err(std::io::Error::last_os_error()));
        return;
    }
    drop(ns);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    runtime.block_on(async move {
        let (guest, server) = match bind(addr, fs).await {
            Ok(both) => both,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, server.get_listen_port()));
        let bound = match guest.local_addr() {
            Ok(SocketAddr::V4(a)) => a,
            _ => addr,
        };
        let _ = ready.send(Ok(bound));
        tokio::select! {
            r = server.handle_forever() => {
                if let Err(e) = r {
                    tracing::warn!(%addr, "NFS server stopped: {e}");
                }
            }
            () = guard::serve(guest, upstream, limits) => {}
            _ = stop => {}
        }
    });
}

/// The guest's listener on `addr`, and nfsserve's on the loopback.
async fn bind(
    addr: SocketAddrV4,
    fs: VolumeNfs,
) -> std::io::Result<(TcpListener, NFSTcpListener<VolumeNfs>)> {
    let server = NFSTcpListener::bind("127.0.0.1:0", fs).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding the NFS server on the namespace's loopback (is lo up?): {e}"),
        )
    })?;
    let guest = TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("binding the NFS export on {addr}: {e}"))
    })?;
    Ok((guest, server))
}

fn with_context(e: std::io::Error, netns: &Path, what: &str) -> std::io::Error {
    std::io::Error::new(
        e.kind(),
        format!("{what} network namespace {}: {e}", netns.display()),
    )
}
