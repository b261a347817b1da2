//! A file of a snapshot in the object store, read before it is whole (the
//! lazy tier's `LazyFile`), against a real S3 server (SeaweedFS on
//! 127.0.0.1, `make s3-venv`): a read fetches only the chunks it touches,
//! an all-zero chunk is never fetched, every byte served is the file's,
//! the whole file checks out once every chunk is in, and a damaged chunk
//! is refused (no byte of it served) naming its digest.
//!
//! Without the `weed` binary the test is skipped with a message, except
//! under CI or `make test` (SIESTA_TESTS_MUST_RUN), where that is a failure.

#[path = "../../snapshot/tests/weed/mod.rs"]
mod weed;

use std::sync::Arc;

use sha2::{Digest, Sha256};
use siesta_snapshot::remote::RemoteRepo;
use siesta_snapshot::repo::{Placement, PublishFile, PublishRequest};
use siesta_snapshot::{Repository, SnapshotKind};
use siesta_tier::lazy::LazyFile;
use weed::{weed_binary, Weed};

const MIB: usize = 1 << 20;

/// 9 MiB: a chunk of one pattern, an all-zero chunk, 1 MiB of another.
fn memory() -> Vec<u8> {
    let mut data: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
    data.extend(vec![0u8; 4 * MIB]);
    data.extend((0..MIB).map(|i| (i % 13) as u8 + 1));
    data
}

fn publish(repo: &Repository, dir: &std::path::Path, data: &[u8]) {
    let mem = dir.join("memory.img");
    std::fs::write(&mem, data).unwrap();
    let state = dir.join("state.bin");
    std::fs::write(&state, b"state").unwrap();
    let file = |role: &str, source, placement| PublishFile {
        role: role.into(),
        source,
        placement,
        sha256: None,
    };
    repo.publish(PublishRequest {
        id: "lazy-t".into(),
        kind: SnapshotKind::Template,
        parent: None,
        guest_memory_size: data.len() as u64,
        files: vec![
            file("memory", mem, Placement::BlobCopy),
            file("state", state, Placement::LocalCopy),
        ],
        existing: vec![],
        aliases: vec![],
        meta: serde_json::json!({}),
    })
    .unwrap();
}

/// Runs `f` on a blocking thread (a `LazyFile` read blocks).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_fetch_only_their_chunks_and_check_each() {
    let Some(bin) = weed_binary() else { return };
    let weed = Weed::start(&bin);
    let remote = RemoteRepo::open(&weed.config()).expect("client");
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let data = memory();
    publish(&repo, tmp.path(), &data);
    remote.push(&repo, "lazy-t").await.expect("push");
    let index = remote.view("lazy-t").await.expect("view").files["memory"].clone();
    assert_eq!(index.chunks.len(), 3);
    assert!(index.chunks[1].is_none(), "the zero chunk is not stored");

    let runtime = tokio::runtime::Handle::current();
    let open = |name: &str| {
        let path = tmp.path().join(name);
        Arc::new(LazyFile::create(index.clone(), &path, remote.clone(), runtime.clone()).unwrap())
    };
    let file = open("lazy-a");
    let (f, want) = (Arc::clone(&file), data.clone());
    blocking(move || {
        // One page of the first chunk: that chunk only.
        let got = f.read_at(3 * 4096, 8192).unwrap();
        assert_eq!(got, want[3 * 4096..5 * 4096]);
        assert_eq!(f.fetched_bytes(), 4 * MIB as u64);
        // The zero chunk reads as zeros and costs nothing.
        let zeros = f.read_at(5 * MIB as u64, 4096).unwrap();
        assert!(zeros.iter().all(|b| *b == 0));
        assert_eq!(f.fetched_bytes(), 4 * MIB as u64);
        assert!(!f.is_whole());
        // Across the end: cut at the file's size.
        let tail = f.read_at(data_len(&want) - 100, 4096).unwrap();
        assert_eq!(tail, want[want.len() - 100..]);
        assert_eq!(f.fetched_bytes(), 5 * MIB as u64);
        assert!(f.is_whole());
        f.verify_whole().expect("the whole file is the pushed one");
        assert_eq!(f.read_at(0, 9 * MIB as u32).unwrap(), want);
    })
    .await;

    // A chunk damaged in the store: refused, naming its digest.
    let last = index.chunks[2].clone().unwrap();
    damage(&weed, &last).await;
    let damaged = open("lazy-b");
    let err = blocking(move || damaged.read_at(8 * MIB as u64, 16).unwrap_err()).await;
    assert!(err.contains(&last) && err.contains("SHA-256"), "{err}");
}

fn data_len(d: &[u8]) -> u64 {
    d.len() as u64
}

async fn damage(weed: &Weed, sha: &str) {
    use object_store::{ObjectStoreExt, PutPayload};
    let store = weed.config().build().unwrap();
    let key = object_store::path::Path::from(format!("chunks/{sha}"));
    let other: Vec<u8> = vec![7u8; MIB];
    assert_ne!(hex::encode(Sha256::digest(&other)), sha);
    store.put(&key, PutPayload::from(other)).await.unwrap();
}
