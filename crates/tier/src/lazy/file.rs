//! One file of a snapshot served before it is whole: a local sparse file
//! filled chunk by chunk from the object store. A read waits only for the
//! chunks it touches (fetched then, if nobody fetches them already); every
//! chunk is checked against its SHA-256 before a byte of it is served.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use siesta_snapshot::remote::{FileIndex, RemoteRepo};
use tokio::runtime::Handle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Missing,
    Fetching,
    Present,
}

/// A file of a remote snapshot, readable at any offset while it fills.
pub struct LazyFile {
    index: FileIndex,
    backing: File,
    path: PathBuf,
    chunks: Mutex<Vec<Chunk>>,
    filled: Condvar,
    remote: RemoteRepo,
    runtime: Handle,
    /// Bytes fetched so far (what a create waited for, in the tests and
    /// the bench).
    fetched: AtomicU64,
}

impl LazyFile {
    /// A file of `index`, backed by a new sparse file at `path`; chunks
    /// come from `remote`, fetched on `runtime`.
    pub fn create(
        index: FileIndex,
        path: &Path,
        remote: RemoteRepo,
        runtime: Handle,
    ) -> std::io::Result<Self> {
        let backing = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        backing.set_len(index.size)?;
        let chunks = index
            .chunks
            .iter()
            .map(|c| match c {
                Some(_) => Chunk::Missing,
                // An all-zero chunk: the sparse file already reads zeros.
                None => Chunk::Present,
            })
            .collect();
        Ok(Self {
            index,
            backing,
            path: path.to_path_buf(),
            chunks: Mutex::new(chunks),
            filled: Condvar::new(),
            remote,
            runtime,
            fetched: AtomicU64::new(0),
        })
    }

    pub fn size(&self) -> u64 {
        self.index.size
    }

    pub fn sha256(&self) -> &str {
        &self.index.sha256
    }

    /// Where the backing file was created (an import moves it; the open
    /// file stays this one's).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn chunk_count(&self) -> usize {
        self.index.chunks.len()
    }

    /// The chunk holding byte `offset`.
    pub fn chunk_of(&self, offset: u64) -> usize {
        (offset / self.index.chunk_size) as usize
    }

    pub fn fetched_bytes(&self) -> u64 {
        self.fetched.load(Ordering::Relaxed)
    }

    /// Whether every chunk is in the backing file.
    pub fn is_whole(&self) -> bool {
        self.lock().iter().all(|c| *c == Chunk::Present)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Chunk>> {
        // A panic while holding it leaves only chunk states behind.
        self.chunks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `len` bytes at `offset` (fewer at the end of the file), fetching
    /// the chunks they lie in first. Blocking: called from the FUSE
    /// threads and the background fill, never from async code.
    pub fn read_at(&self, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        if offset >= self.index.size {
            return Ok(Vec::new());
        }
        let end = (offset + u64::from(len)).min(self.index.size);
        for chunk in self.chunk_of(offset)..=self.chunk_of(end - 1) {
            self.ensure(chunk)?;
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        self.backing
            .read_exact_at(&mut buf, offset)
            .map_err(|e| format!("reading {}: {e}", self.path.display()))?;
        Ok(buf)
    }

    /// Makes chunk `i` present: fetched by this thread, or waited for
    /// while another fetches it.
    pub fn ensure(&self, i: usize) -> Result<(), String> {
        {
            let mut chunks = self.lock();
            loop {
                match chunks.get(i).copied() {
                    None => return Err(format!("chunk {i} is past the end")),
                    Some(Chunk::Present) => return Ok(()),
                    Some(Chunk::Fetching) => {
                        chunks = self.filled.wait(chunks).unwrap_or_else(|p| p.into_inner());
                    }
                    Some(Chunk::Missing) => {
                        chunks[i] = Chunk::Fetching;
                        break;
                    }
                }
            }
        }
        let fetched = self.fetch(i);
        let mut chunks = self.lock();
        chunks[i] = if fetched.is_ok() {
            Chunk::Present
        } else {
            Chunk::Missing
        };
        self.filled.notify_all();
        fetched
    }

    fn fetch(&self, i: usize) -> Result<(), String> {
        let Some(Some(sha)) = self.index.chunks.get(i) else {
            return Ok(());
        };
        let offset = i as u64 * self.index.chunk_size;
        let len = (self.index.size - offset).min(self.index.chunk_size) as usize;
        let data = self
            .runtime
            .block_on(self.remote.chunk(sha, len))
            .map_err(|e| e.to_string())?;
        self.backing
            .write_all_at(&data, offset)
            .map_err(|e| format!("writing {}: {e}", self.path.display()))?;
        self.fetched.fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Checks the whole backing file against the file's SHA-256 (every
    /// chunk was checked on its way in; this checks the index itself).
    /// Holes (the all-zero chunks) are hashed without being read.
    pub fn verify_whole(&self) -> Result<(), String> {
        self.backing
            .sync_all()
            .map_err(|e| format!("syncing {}: {e}", self.path.display()))?;
        let got = siesta_host::blob_checks::sparse_sha256(&self.path)
            .map_err(|e| format!("reading {}: {e}", self.path.display()))?;
        if got != self.index.sha256 {
            return Err(format!(
                "{} has SHA-256 {got} once whole, the object store's index says {}",
                self.path.display(),
                self.index.sha256
            ));
        }
        Ok(())
    }
}
