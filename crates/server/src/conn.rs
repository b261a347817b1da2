//! The server's client connections, each with a handle that can reset it.
//!
//! When a sandbox's VM stops while a response still streams from it, the
//! front door cuts the stream *and resets the client's TCP connection*
//! (RST), which every HTTP client reads as "connection dropped", as it would
//! had it talked to the guest directly. A merely truncated chunked body is
//! read as a protocol error instead, and the SDK then does not probe the
//! sandbox to report it killed.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::peers::PeerPlace;

/// One client connection.
pub struct Conn {
    stream: TcpStream,
    reset: Arc<AtomicBool>,
    /// Its place under the server's connection cap, given back when the
    /// socket closes (an upgraded connection keeps it while it lives).
    _slot: OwnedSemaphorePermit,
    /// Its place under its peer's share of the cap, likewise.
    _peer: PeerPlace,
}

impl Conn {
    pub fn new(stream: TcpStream, slot: OwnedSemaphorePermit, peer: PeerPlace) -> Self {
        Self {
            stream,
            reset: Arc::new(AtomicBool::new(false)),
            _slot: slot,
            _peer: peer,
        }
    }

    /// What resets this connection.
    pub fn handle(&self) -> ConnHandle {
        ConnHandle(self.reset.clone())
    }

    fn check(&self) -> io::Result<()> {
        if self.reset.load(Ordering::SeqCst) {
            Err(io::ErrorKind::ConnectionReset.into())
        } else {
            Ok(())
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.reset.load(Ordering::SeqCst) {
            // Closing with a zero linger sends RST instead of FIN.
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(e) = this.check() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Resets the connection a request came on (`ConnectInfo<ConnHandle>`).
#[derive(Clone, Debug)]
pub struct ConnHandle(Arc<AtomicBool>);

impl ConnHandle {
    /// From now on the connection fails every read and write, and closes
    /// with RST.
    pub fn reset(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
