//! Prefetching a startup manifest's ranges of a memory file into the page
//! cache, concurrently with the restore that maps the same file.
//!
//! Reads go through the very file the VMM maps (buffered `pread`, so the
//! pages land in the page cache the VMM's faults are served from). One
//! in-flight prefetch per (file, manifest) is shared by every concurrent
//! resume of that snapshot; each resume holds a [`PrefetchHandle`], and when
//! the last one is dropped before the reads finish, they are cancelled
//! between chunks (a read already in the kernel completes). At most
//! `readers` reads run at once in the whole process, each with its own
//! 1 MiB buffer, taking chunks in first-touch order. A chunk already
//! resident (`mincore`, see [`crate::pagecache`]) is skipped: reading it
//! would only copy memory, on CPUs the restoring VM needs.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};

use crate::manifest::Manifest;
use crate::pagecache::Residency;

#[derive(Debug, Clone)]
pub struct PrefetchConfig {
    /// Concurrent reads in the whole process.
    pub readers: usize,
    /// Bytes per read (and per reader buffer).
    pub buffer_bytes: usize,
    /// Widen every manifest run to whole aligned blocks of this many bytes
    /// (0: exactly the recorded pages). A resume touches a few pages near
    /// the recorded ones that one recording did not see; the kernel's
    /// fault read-around would fetch them one disk read each.
    pub pad_bytes: u64,
    /// Pause after every chunk (tests: make a prefetch slow enough to be
    /// cancelled while running).
    #[doc(hidden)]
    pub chunk_delay: Option<Duration>,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        Self {
            readers: 4,
            buffer_bytes: 1 << 20,
            pad_bytes: 0,
            chunk_delay: None,
        }
    }
}

/// How a prefetch ended.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefetchOutcome {
    /// Bytes of the manifest now cached: read, or found resident.
    pub bytes: u64,
    /// Of those, bytes skipped because they were already resident.
    pub resident_bytes: u64,
    pub chunks: usize,
    /// From start to the last read.
    pub elapsed: Duration,
    /// Every chunk was read (not cancelled, no error).
    pub completed: bool,
    pub error: Option<String>,
}

type Key = (u64, u64, String);

struct Shared {
    key: Key,
    users: AtomicUsize,
    cancel: AtomicBool,
    started: Instant,
    done: watch::Receiver<Option<PrefetchOutcome>>,
}

struct Inner {
    config: PrefetchConfig,
    readers: Arc<Semaphore>,
    inflight: Mutex<HashMap<Key, Weak<Shared>>>,
}

/// The process's prefetcher; cheap to clone.
#[derive(Clone)]
pub struct Prefetcher {
    inner: Arc<Inner>,
}

impl Default for Prefetcher {
    fn default() -> Self {
        Self::new(PrefetchConfig::default())
    }
}

impl Prefetcher {
    pub fn new(config: PrefetchConfig) -> Self {
        let readers = config.readers.max(1);
        Self {
            inner: Arc::new(Inner {
                config,
                readers: Arc::new(Semaphore::new(readers)),
                inflight: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Starts prefetching `manifest` (whose SHA-256 is `digest`) from
    /// `memory_file`, or joins the prefetch of the same already running.
    /// Must be called inside a tokio runtime.
    pub fn start(
        &self,
        memory_file: &Path,
        manifest: Arc<Manifest>,
        digest: &str,
    ) -> std::io::Result<PrefetchHandle> {
        let file = std::fs::File::open(memory_file)?;
        let meta = file.metadata()?;
        let key: Key = (meta.dev(), meta.ino(), digest.to_string());
        let mut inflight = self
            .inner
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(shared) = inflight.get(&key).and_then(Weak::upgrade) {
            if !shared.cancel.load(Ordering::SeqCst) && shared.done.borrow().is_none() {
                shared.users.fetch_add(1, Ordering::SeqCst);
                return Ok(PrefetchHandle {
                    shared,
                    prefetcher: Arc::downgrade(&self.inner),
                    joined: true,
                });
            }
        }
        let (tx, rx) = watch::channel(None);
        let shared = Arc::new(Shared {
            key: key.clone(),
            users: AtomicUsize::new(1),
            cancel: AtomicBool::new(false),
            started: Instant::now(),
            done: rx,
        });
        inflight.insert(key, Arc::downgrade(&shared));
        drop(inflight);
        let config = &self.inner.config;
        let chunks = Arc::new(chunks(
            &manifest,
            config.buffer_bytes as u64,
            config.pad_bytes,
        ));
        tokio::spawn(run(
            Arc::clone(&self.inner),
            Arc::clone(&shared),
            Arc::new(file),
            memory_file.to_path_buf(),
            chunks,
            tx,
        ));
        Ok(PrefetchHandle {
            shared,
            prefetcher: Arc::downgrade(&self.inner),
            joined: false,
        })
    }

    /// Prefetches in flight (tests, metrics).
    pub fn in_flight(&self) -> usize {
        let inflight = self
            .inner
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        inflight.values().filter(|w| w.strong_count() > 0).count()
    }
}

/// A resume's claim on a prefetch; dropping the last claim cancels it.
pub struct PrefetchHandle {
    shared: Arc<Shared>,
    prefetcher: Weak<Inner>,
    joined: bool,
}

impl PrefetchHandle {
    /// Whether this handle joined a prefetch another resume started.
    pub fn joined(&self) -> bool {
        self.joined
    }
    /// The outcome, once the prefetch ended.
    pub fn outcome(&self) -> Option<PrefetchOutcome> {
        self.shared.done.borrow().clone()
    }
    /// Time since the prefetch started.
    pub fn running_for(&self) -> Duration {
        self.shared.started.elapsed()
    }
    /// Something to wait on that does not keep the prefetch alive.
    pub fn watch(&self) -> PrefetchWatch {
        PrefetchWatch(self.shared.done.clone())
    }
    /// Waits for the prefetch to end.
    pub async fn wait(&self) -> PrefetchOutcome {
        self.watch().wait().await
    }
}

impl Drop for PrefetchHandle {
    fn drop(&mut self) {
        // Under the in-flight lock, so a concurrent `start` either joins
        // before the count reaches zero or starts a fresh prefetch after.
        let Some(inner) = self.prefetcher.upgrade() else {
            self.shared.cancel.store(true, Ordering::SeqCst);
            return;
        };
        let mut inflight = inner.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if self.shared.users.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.cancel.store(true, Ordering::SeqCst);
            if inflight
                .get(&self.shared.key)
                .is_some_and(|w| w.as_ptr() == Arc::as_ptr(&self.shared))
            {
                inflight.remove(&self.shared.key);
            }
        }
    }
}

/// Waits for a prefetch's outcome without claiming it.
#[derive(Clone)]
pub struct PrefetchWatch(watch::Receiver<Option<PrefetchOutcome>>);

impl PrefetchWatch {
    pub async fn wait(mut self) -> PrefetchOutcome {
        match self.0.wait_for(Option::is_some).await {
            Ok(v) => v.clone().unwrap_or_else(lost),
            Err(_) => lost(),
        }
    }
}

fn lost() -> PrefetchOutcome {
    PrefetchOutcome {
        bytes: 0,
        resident_bytes: 0,
        chunks: 0,
        elapsed: Duration::ZERO,
        completed: false,
        error: Some("prefetch task ended without an outcome".into()),
    }
}

/// The manifest's runs, in first-touch order, widened to `pad`-aligned
/// blocks (if `pad` is a multiple of the page size), cut into reads of at
/// most `max` bytes.
pub fn chunks(manifest: &Manifest, max: u64, pad: u64) -> Vec<(u64, u64)> {
    let page = u64::from(manifest.page_size);
    let max = max.max(page);
    let runs: Vec<(u64, u64)> = if pad > page && pad.is_multiple_of(page) {
        padded(manifest, pad)
    } else {
        manifest.runs.iter().map(|r| (r.offset, r.end())).collect()
    };
    let mut out = Vec::new();
    for (start, end) in runs {
        let mut off = start;
        while off < end {
            let len = (end - off).min(max);
            out.push((off, len));
            off += len;
        }
    }
    out
}

/// The runs widened to whole `pad` blocks, each block once, in the order
/// its first page was touched, adjacent new blocks merged.
fn padded(manifest: &Manifest, pad: u64) -> Vec<(u64, u64)> {
    let limit = manifest.guest_memory_size;
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for r in &manifest.runs {
        for block in r.offset / pad..r.end().div_ceil(pad) {
            if !seen.insert(block) {
                continue;
            }
            let (start, end) = (block * pad, ((block + 1) * pad).min(limit));
            match out.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => out.push((start, end)),
            }
        }
    }
    out
}

async fn run(
    inner: Arc<Inner>,
    shared: Arc<Shared>,
    file: Arc<std::fs::File>,
    path: PathBuf,
    chunks: Arc<Vec<(u64, u64)>>,
    tx: watch::Sender<Option<PrefetchOutcome>>,
) {
    let next = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let resident_bytes = Arc::new(AtomicU64::new(0));
    // Without a mapping (it failed), every chunk is read.
    let residency = Arc::new(Residency::map(&file).ok().flatten());
    let done_chunks = Arc::new(AtomicUsize::new(0));
    let workers = inner.config.readers.max(1).min(chunks.len());
    let mut tasks = Vec::with_capacity(workers);
    for _ in 0..workers {
        let permits = Arc::clone(&inner.readers);
        let (shared, file, chunks) = (Arc::clone(&shared), Arc::clone(&file), Arc::clone(&chunks));
        let (next, bytes, done_chunks) = (
            Arc::clone(&next),
            Arc::clone(&bytes),
            Arc::clone(&done_chunks),
        );
        let (residency, resident_bytes) = (Arc::clone(&residency), Arc::clone(&resident_bytes));
        let (buf_len, delay) = (inner.config.buffer_bytes, inner.config.chunk_delay);
        tasks.push(tokio::spawn(async move {
            // The permit bounds reads in the whole process, not per prefetch.
            let _permit = permits.acquire_owned().await.ok()?;
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let mut buf = vec![0u8; buf_len];
                loop {
                    if shared.cancel.load(Ordering::SeqCst) {
                        return Ok(());
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&(off, len)) = chunks.get(i) else {
                        return Ok(());
                    };
                    let want = (len as usize).min(buf.len());
                    let cached = residency
                        .as_ref()
                        .as_ref()
                        .is_some_and(|r| r.all_resident(off, want as u64));
                    let n = if cached {
                        resident_bytes.fetch_add(want as u64, Ordering::Relaxed);
                        want
                    } else {
                        read_at_most(&file, &mut buf[..want], off)?
                    };
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                    done_chunks.fetch_add(1, Ordering::Relaxed);
                    if let Some(d) = delay {
                        std::thread::sleep(d);
                    }
                }
            })
            .await
            .ok()
        }));
    }
    let mut error = None;
    for t in tasks {
        match t.await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => error = Some(format!("reading {}: {e}", path.display())),
            _ => error = Some("prefetch reader task failed".into()),
        }
    }
    let chunks_read = done_chunks.load(Ordering::SeqCst);
    let outcome = PrefetchOutcome {
        bytes: bytes.load(Ordering::SeqCst),
        resident_bytes: resident_bytes.load(Ordering::SeqCst),
        chunks: chunks_read,
        elapsed: shared.started.elapsed(),
        completed: error.is_none() && chunks_read == chunks.len(),
        error,
    };
    let _ = tx.send(Some(outcome));
    let mut inflight = inner.inflight.lock().unwrap_or_else(|p| p.into_inner());
    if inflight
        .get(&shared.key)
        .is_some_and(|w| w.as_ptr() == Arc::as_ptr(&shared))
    {
        inflight.remove(&shared.key);
    }
}

/// `pread` until `buf` is full or the file ends (a manifest range beyond a
/// truncated file reads short, which is not an error: nothing to cache).
fn read_at_most(file: &std::fs::File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests;
