//! The two ways a client consumes a watch: polled watchers
//! (`CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher`, what the sync SDK
//! uses) and the `WatchDir` server stream (the async SDK).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use siesta_envd_proto::filesystem::{watch_dir_response, FilesystemEvent, WatchDirResponse};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::rpc::RpcError;

/// Events a polled watcher keeps between two `GetWatcherEvents`; beyond it
/// the newest are dropped (and logged) so a forgotten watcher cannot eat the
/// guest's memory.
const MAX_BUFFERED: usize = 100_000;

/// How long a stream may stay silent before a keepalive when the client sent
/// no `Keepalive-Ping-Interval` (envd's default).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

struct Polled {
    events: Arc<Mutex<Vec<FilesystemEvent>>>,
    pump: JoinHandle<()>,
}

impl Drop for Polled {
    fn drop(&mut self) {
        // Ending the pump drops the receiver, which stops the inotify task.
        self.pump.abort();
    }
}

/// The polled watchers, by id.
#[derive(Default)]
pub struct WatcherTable {
    watchers: Mutex<HashMap<String, Polled>>,
    next: std::sync::atomic::AtomicU64,
}

impl WatcherTable {
    /// Registers a watch whose events are buffered until polled; returns its id.
    pub fn insert(&self, mut rx: mpsc::Receiver<FilesystemEvent>) -> String {
        let events: Arc<Mutex<Vec<FilesystemEvent>>> = Arc::default();
        let sink = Arc::clone(&events);
        let pump = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                let mut buf = lock(&sink);
                if buf.len() < MAX_BUFFERED {
                    buf.push(ev);
                } else {
                    tracing::warn!("watcher buffer full; dropping event for {}", ev.name);
                }
            }
        });
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Unguessable enough to keep clients from polling each other's
        // watchers by accident, and unique within this agent's life.
        let id = format!("w{n}-{:08x}", rand_u32());
        lock(&self.watchers).insert(id.clone(), Polled { events, pump });
        id
    }

    /// Returns and clears the buffered events of watcher `id`.
    pub fn drain(&self, id: &str) -> Result<Vec<FilesystemEvent>, RpcError> {
        let table = lock(&self.watchers);
        let w = table
            .get(id)
            .ok_or_else(|| RpcError::not_found(format!("watcher {id:?} not found")))?;
        let events = std::mem::take(&mut *lock(&w.events));
        Ok(events)
    }

    /// Stops and forgets watcher `id`.
    pub fn remove(&self, id: &str) -> Result<(), RpcError> {
        lock(&self.watchers)
            .remove(id)
            .map(drop)
            .ok_or_else(|| RpcError::not_found(format!("watcher {id:?} not found")))
    }
}

/// The `WatchDir` response stream: `start{}`, then events, with a keepalive
/// after every `keepalive` of silence. It ends when the client goes away.
pub fn stream(
    mut rx: mpsc::Receiver<FilesystemEvent>,
    keepalive: Duration,
) -> BoxStream<'static, Result<WatchDirResponse, RpcError>> {
    let (tx, out) = mpsc::channel(64);
    tokio::spawn(async move {
        let start = WatchDirResponse {
            event: Some(watch_dir_response::Event::Start(
                watch_dir_response::StartEvent {},
            )),
        };
        if tx.send(Ok(start)).await.is_err() {
            return;
        }
        loop {
            let event = tokio::select! {
                _ = tx.closed() => return,
                ev = rx.recv() => match ev {
                    Some(ev) => watch_dir_response::Event::Filesystem(ev),
                    None => return,
                },
                // The timer restarts whenever an event goes out, as in envd.
                _ = tokio::time::sleep(keepalive) => {
                    watch_dir_response::Event::Keepalive(watch_dir_response::KeepAlive {})
                }
            };
            if tx
                .send(Ok(WatchDirResponse { event: Some(event) }))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(out).boxed()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    // getrandom never blocks once the CRNG is up; a failure only makes the id
    // less random, which the counter already keeps unique.
    let _ = nix::errno::Errno::result(unsafe {
        // SAFETY: b is writable for 4 bytes.
        libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK)
    });
    u32::from_ne_bytes(b)
}
