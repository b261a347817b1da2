//! One file in the object store: content-addressed 4 MiB chunks and an
//! index naming them in order.
//!
//! 4 MiB: a 512 MiB memory blob is 128 requests; request overhead (a few
//! ms each on the test server) stays well under the transfer; a resume's
//! startup ranges touch a few dozen chunks, not the whole file. All-zero
//! chunks are not stored (the index has `null`), so a sparse file costs
//! what it holds. Every chunk and the whole file are checked against their
//! SHA-256 when fetched.

use std::path::Path;
use std::sync::Arc;

use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::{get_bytes, store_err, RemoteError};

pub const CHUNK_SIZE: usize = 4 << 20;

/// The index of one file (`files/<sha256>.idx`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIndex {
    pub size: u64,
    pub sha256: String,
    pub chunk_size: u64,
    /// Each chunk's digest in order; `None` for an all-zero chunk.
    pub chunks: Vec<Option<String>>,
}

pub fn chunk_key(sha: &str) -> Key {
    Key::from(format!("chunks/{sha}"))
}

pub fn index_key(sha: &str) -> Key {
    Key::from(format!("files/{sha}.idx"))
}

fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Uploads `path` (chunks not already there, then its index); returns the
/// index's key digest (the file's SHA-256).
pub async fn put_file(store: &Arc<dyn ObjectStore>, path: &Path) -> Result<String, RemoteError> {
    let io = |what: &'static str| {
        let path = path.to_path_buf();
        move |source| RemoteError::Io { what, path, source }
    };
    let mut file = tokio::fs::File::open(path).await.map_err(io("opening"))?;
    let size = file
        .metadata()
        .await
        .map_err(io("reading the size of"))?
        .len();
    let mut whole = Sha256::new();
    let mut chunks = Vec::new();
    let mut buf = vec![0u8; CHUNK_SIZE];
    loop {
        let n = read_full(&mut file, &mut buf)
            .await
            .map_err(io("reading"))?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        whole.update(chunk);
        if chunk.iter().all(|b| *b == 0) {
            chunks.push(None);
            continue;
        }
        let sha = hex(Sha256::digest(chunk));
        let key = chunk_key(&sha);
        if store.head(&key).await.is_err() {
            let payload = PutPayload::from(bytes::Bytes::copy_from_slice(chunk));
            store
                .put(&key, payload)
                .await
                .map_err(store_err("uploading", &key))?;
        }
        chunks.push(Some(sha));
    }
    let index = FileIndex {
        size,
        sha256: hex(whole.finalize()),
        chunk_size: CHUNK_SIZE as u64,
        chunks,
    };
    let key = index_key(&index.sha256);
    let body = serde_json::to_vec(&index).map_err(|e| RemoteError::Corrupt {
        key: key.to_string(),
        detail: e.to_string(),
    })?;
    store
        .put(&key, PutPayload::from(body))
        .await
        .map_err(store_err("uploading", &key))?;
    Ok(index.sha256)
}

/// How many chunks a fetch has in flight by default: a request costs a few
/// ms of latency that one stream cannot hide; eight keep the link busy
/// with 32 MiB in memory (`siesta bench resume --from s3` compares).
pub const FETCH_CONCURRENCY: usize = 8;

/// The index of the file whose SHA-256 is `sha`.
pub async fn get_index(store: &Arc<dyn ObjectStore>, sha: &str) -> Result<FileIndex, RemoteError> {
    let key = index_key(sha);
    let bytes = get_bytes(store, &key).await?;
    let index: FileIndex = serde_json::from_slice(&bytes).map_err(|e| RemoteError::Corrupt {
        key: key.to_string(),
        detail: e.to_string(),
    })?;
    if index.sha256 != sha || index.chunk_size == 0 {
        return Err(RemoteError::Corrupt {
            key: key.to_string(),
            detail: format!(
                "the index is of file {}, chunks of {} bytes",
                index.sha256, index.chunk_size
            ),
        });
    }
    Ok(index)
}

/// Chunk `sha`, which must be `len` bytes with that SHA-256.
pub async fn get_chunk(
    store: &Arc<dyn ObjectStore>,
    sha: &str,
    len: usize,
) -> Result<bytes::Bytes, RemoteError> {
    let data = get_bytes(store, &chunk_key(sha)).await?;
    check_chunk(&data, sha, len)?;
    Ok(data)
}

/// Refuses `data` unless it is `len` bytes with SHA-256 `sha`.
fn check_chunk(data: &[u8], sha: &str, len: usize) -> Result<(), RemoteError> {
    let got = hex(Sha256::digest(data));
    if got != sha || data.len() != len {
        return Err(RemoteError::Corrupt {
            key: chunk_key(sha).to_string(),
            detail: format!(
                "{} bytes with SHA-256 {got}, expected {len} bytes with {sha}",
                data.len()
            ),
        });
    }
    Ok(())
}

/// Downloads the file whose SHA-256 is `sha` into `dest` (created; holes
/// for zero chunks), checking every chunk and the whole. Up to
/// `concurrency` chunks are fetched at once; they are checked, hashed and
/// written in order.
pub async fn get_file(
    store: &Arc<dyn ObjectStore>,
    sha: &str,
    dest: &Path,
    concurrency: usize,
) -> Result<(), RemoteError> {
    use futures::StreamExt;

    let key = index_key(sha);
    let index = get_index(store, sha).await?;
    let io = |what: &'static str| {
        let path = dest.to_path_buf();
        move |source| RemoteError::Io { what, path, source }
    };
    let mut file = tokio::fs::File::create(dest)
        .await
        .map_err(io("creating"))?;
    file.set_len(index.size).await.map_err(io("sizing"))?;
    let mut whole = Sha256::new();
    let zeros = vec![0u8; index.chunk_size as usize];
    // Owned items and futures: a stream borrowing the index would make the
    // future of every caller (a create, a takeover) lose `Send`.
    let from = store.clone();
    let mut fetched = futures::stream::iter(index.chunks.clone())
        .map(move |chunk| {
            let store = from.clone();
            async move {
                match chunk {
                    Some(sha) => get_bytes(&store, &chunk_key(&sha)).await.map(Some),
                    None => Ok(None),
                }
            }
        })
        .buffered(concurrency.max(1));
    for (i, chunk) in index.chunks.iter().enumerate() {
        let offset = i as u64 * index.chunk_size;
        let len = (index.size - offset).min(index.chunk_size) as usize;
        let data = match fetched.next().await {
            Some(r) => r?,
            None => None,
        };
        let (Some(chunk_sha), Some(data)) = (chunk, data) else {
            whole.update(&zeros[..len]);
            continue;
        };
        check_chunk(&data, chunk_sha, len)?;
        whole.update(&data);
        file.seek(std::io::SeekFrom::Start(offset))
            .await
            .map_err(io("seeking in"))?;
        file.write_all(&data).await.map_err(io("writing"))?;
    }
    let got = hex(whole.finalize());
    if got != index.sha256 || got != sha {
        return Err(RemoteError::Corrupt {
            key: key.to_string(),
            detail: format!(
                "the chunks make SHA-256 {got}, the index says {}",
                index.sha256
            ),
        });
    }
    file.sync_all().await.map_err(io("syncing"))?;
    Ok(())
}

async fn read_full(file: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}
