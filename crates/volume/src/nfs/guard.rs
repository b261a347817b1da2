//! The guest-facing side of an export: bounded framing in front of
//! `nfsserve`.
//!
//! Each guest connection gets a connection of its own to the export's
//! `nfsserve` listener (on the namespace's loopback, see [`super::export`]).
//! Calls go through one at a time: read as a bounded record
//! ([`super::record`]), checked ([`super::call`]), then sent on whole.
//! Replies come back as `nfsserve` wrote them, streamed.
//!
//! Bounds, per export: [`NfsLimits::max_connections`] connections (more
//! are accepted and closed at once); per connection, one record being read
//! and at most [`NfsLimits::max_in_flight`] calls that `nfsserve` holds
//! (each with at most one record's worth of arguments or reply). Without
//! that window, a guest that sends READs and never reads the replies
//! would have `nfsserve` queue a 1 MiB reply per 100-byte call.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::timeout;

use super::call::{check_call, Refused};
use super::record::{mark, parse_mark, read_record, FrameError, MAX_RECORD};

/// What one export allows its guest.
#[derive(Debug, Clone)]
pub struct NfsLimits {
    /// Connections at once. Linux's client uses one for NFS and a short
    /// one for MOUNT.
    pub max_connections: usize,
    /// Calls sent on to the server and not yet answered, per connection.
    pub max_in_flight: usize,
    /// A connection with no call for this long is closed (knfsd waits six
    /// minutes; the client reconnects on its next call).
    pub idle_timeout: Duration,
    /// A record must arrive whole this long after its first byte.
    pub record_timeout: Duration,
    /// A reply must be taken by the guest within this long.
    pub write_timeout: Duration,
}

impl Default for NfsLimits {
    fn default() -> Self {
        Self {
            max_connections: 4,
            max_in_flight: 8,
            idle_timeout: Duration::from_secs(6 * 60),
            record_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
        }
    }
}

/// Why a guest connection was closed.
#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("no call for {0:?}")]
    Idle(Duration),
    #[error("a record took longer than {0:?} to arrive")]
    SlowRecord(Duration),
    #[error("the guest took no reply for {0:?}")]
    SlowReader(Duration),
    #[error("no answer to {0} calls for {1:?}")]
    Stalled(usize, Duration),
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("the NFS server sent a reply of {0} bytes in a fragment")]
    BadReply(usize),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Closed {
    move |source| Closed::Io { what, source }
}

/// Accepts guest connections on `listener` for ever, relaying each to
/// `upstream` (the export's `nfsserve`).
pub(super) async fn serve(listener: TcpListener, upstream: SocketAddr, limits: NfsLimits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was
                // taken: the listener itself is fine.
                tracing::debug!("NFS accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "NFS connection refused: {} open already", limits.max_connections);
            continue;
        };
        let limits = limits.clone();
        tokio::spawn(async move {
            if let Err(e) = relay(socket, upstream, &limits).await {
                tracing::debug!(%peer, "NFS connection closed: {e}");
            }
            drop(slot);
        });
    }
}

/// Calls sent on and not yet answered, by xid.
struct Window {
    free: Semaphore,
    in_flight: Mutex<HashSet<u32>>,
    size: usize,
}

impl Window {
    fn new(size: usize) -> Self {
        Self {
            free: Semaphore::new(size),
            in_flight: Mutex::new(HashSet::new()),
            size,
        }
    }

    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a place for call `xid`; `Ok(false)` for a retransmission of a
    /// call still in flight, which nfsserve would drop without an answer.
    async fn admit(&self, xid: u32, wait: Duration) -> Result<bool, Closed> {
        if self.set().contains(&xid) {
            return Ok(false);
        }
        match timeout(wait, self.free.acquire()).await {
            Ok(Ok(permit)) => permit.forget(),
            // The semaphore is never closed; a timeout means calls that
            // nfsserve never answers (it drops repeated xids silently).
            _ => return Err(Closed::Stalled(self.size, wait)),
        }
        self.set().insert(xid);
        Ok(true)
    }

    fn answered(&self, xid: u32) {
        if self.set().remove(&xid) {
            self.free.add_permits(1);
        }
    }
}

/// One guest connection, relayed until either side ends it.
async fn relay(guest: TcpStream, upstream: SocketAddr, limits: &NfsLimits) -> Result<(), Closed> {
    let _ = guest.set_nodelay(true);
    let mut server = TcpStream::connect(upstream)
        .await
        .map_err(io("connecting to the NFS server"))?;
    let _ = server.set_nodelay(true);
    let mut guest = guest;
    let (guest_rd, guest_wr) = guest.split();
    let (server_rd, server_wr) = server.split();
    let to_guest = tokio::sync::Mutex::new(guest_wr);
    let window = Window::new(limits.max_in_flight);
    tokio::select! {
        r = calls(BufReader::new(guest_rd), server_wr, &to_guest, &window, limits) => r,
        r = replies(BufReader::with_capacity(256 << 10, server_rd), &to_guest, &window, limits) => r,
    }
}

/// Guest to server: bounded records, checked calls, within the window.
async fn calls<R, W, G>(
    mut guest: BufReader<R>,
    mut server: W,
    to_guest: &tokio::sync::Mutex<G>,
    window: &Window,
    limits: &NfsLimits,
) -> Result<(), Closed>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    G: AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    loop {
        match timeout(limits.idle_timeout, guest.fill_buf()).await {
            Err(_) => return Err(Closed::Idle(limits.idle_timeout)),
            Ok(Err(e)) => return Err(io("reading from the guest")(e)),
            Ok(Ok([])) => return Ok(()),
            Ok(Ok(_)) => {}
        }
        let whole = timeout(limits.record_timeout, read_record(&mut guest, &mut buf))
            .await
            .map_err(|_| Closed::SlowRecord(limits.record_timeout))??;
        if !whole {
            return Ok(());
        }
        let refusal = match check_call(&mut buf[4..]) {
            Ok(call) => {
                if window.admit(call.xid, limits.idle_timeout).await? {
                    server
                        .write_all(&buf)
                        .await
                        .map_err(io("writing to the NFS server"))?;
                }
                continue;
            }
            Err(r @ Refused::NotACall(_)) => return Err(r.into()),
            Err(r) => r,
        };
        tracing::debug!("NFS call refused: {refusal}");
        let reply = refusal_reply(&refusal);
        let mut out = to_guest.lock().await;
        timeout(limits.write_timeout, out.write_all(&reply))
            .await
            .map_err(|_| Closed::SlowReader(limits.write_timeout))?
            .map_err(io("writing to the guest"))?;
    }
}

/// Server to guest: each reply streamed whole, its place in the window
/// given back once the guest has it.
async fn replies<R, G>(
    mut server: BufReader<R>,
    to_guest: &tokio::sync::Mutex<G>,
    window: &Window,
    limits: &NfsLimits,
) -> Result<(), Closed>
where
    R: AsyncRead + Unpin,
    G: AsyncWrite + Unpin,
{
    loop {
        let mut head = [0u8; 8];
        match server.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io("reading from the NFS server")(e)),
        }
        let (len, last) = parse_mark([head[0], head[1], head[2], head[3]]);
        // nfsserve sends each reply whole, in one fragment, xid first.
        if !last || !(4..=MAX_RECORD).contains(&len) {
            return Err(Closed::BadReply(len));
        }
        let xid = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        let mut to_guest = to_guest.lock().await;
        let sent = async {
            to_guest.write_all(&head).await?;
            let mut body = (&mut server).take(len as u64 - 4);
            let copied = tokio::io::copy_buf(&mut body, &mut *to_guest).await?;
            if copied < len as u64 - 4 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            Ok(())
        };
        timeout(limits.write_timeout, sent)
            .await
            .map_err(|_| Closed::SlowReader(limits.write_timeout))?
            .map_err(io("relaying a reply"))?;
        drop(to_guest);
        window.answered(xid);
    }
}

/// The record the guest gets for a refused call: AUTH_ERROR (AUTH_BADCRED)
/// for credentials, GARBAGE_ARGS for arguments (RFC 5531, section 9).
fn refusal_reply(refusal: &Refused) -> Vec<u8> {
    let words: Vec<u32> = match *refusal {
        Refused::Credentials { xid, .. } => vec![xid, 1, 1, 1, 1],
        Refused::Arguments { xid, .. } => vec![xid, 1, 0, 0, 0, 4],
        Refused::NotACall(_) => Vec::new(),
    };
    let mut out = Vec::with_capacity(4 + words.len() * 4);
    out.extend_from_slice(&mark(words.len() as u32 * 4));
    for w in words {
        out.extend_from_slice(&w.to_be_bytes());
    }
    out
}
