//! The eviction policy on a real repository: least recently used first,
//! parents after their children, what a sandbox uses and what was used a
//! moment ago never, what this node made itself never.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use siesta_snapshot::repo::{Placement, PublishFile, PublishRequest};
use siesta_snapshot::{Repository, SnapshotKind};

use super::FetchCache;

const MIB: usize = 1 << 20;

fn file(dir: &Path, name: &str, fill: u8, len: usize) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, vec![fill; len]).unwrap();
    path
}

/// Template `id`: a 1 MiB memory blob and a small state file.
fn template(repo: &Repository, dir: &Path, id: &str, fill: u8) {
    let mem = file(dir, &format!("{id}.mem"), fill, MIB);
    let state = file(dir, &format!("{id}.state"), fill, 4096);
    repo.publish(PublishRequest {
        id: id.into(),
        kind: SnapshotKind::Template,
        parent: None,
        guest_memory_size: MIB as u64,
        files: vec![
            PublishFile {
                role: "memory".into(),
                source: mem,
                placement: Placement::BlobCopy,
                sha256: None,
            },
            PublishFile {
                role: "state".into(),
                source: state,
                placement: Placement::LocalCopy,
                sha256: None,
            },
        ],
        existing: vec![],
        aliases: vec![format!("template:{id}")],
        meta: serde_json::json!({}),
    })
    .unwrap();
}

/// User snapshot `id` over template `parent`: its memory is the template's
/// blob, its state its own.
fn user_snapshot(repo: &Repository, dir: &Path, id: &str, parent: &str) {
    let memory = repo.get(parent).unwrap().files["memory"].clone();
    let state = file(dir, &format!("{id}.state"), 9, 64 * 1024);
    repo.publish(PublishRequest {
        id: id.into(),
        kind: SnapshotKind::User,
        parent: Some(parent.into()),
        guest_memory_size: MIB as u64,
        files: vec![PublishFile {
            role: "state".into(),
            source: state,
            placement: Placement::LocalCopy,
            sha256: None,
        }],
        existing: vec![("memory".into(), memory)],
        aliases: vec![format!("snapshot:{id}")],
        meta: serde_json::json!({}),
    })
    .unwrap();
}

/// Marks `id` as fetched and last used `ago` before now.
fn fetched(cache: &FetchCache, id: &str, ago: Duration) {
    cache.mark(id).unwrap();
    let marker = std::fs::File::options()
        .write(true)
        .open(cache.marker(id))
        .unwrap();
    marker.set_modified(SystemTime::now() - ago).unwrap();
}

fn ids(evicted: &[super::Evicted]) -> Vec<&str> {
    evicted.iter().map(|e| e.id.as_str()).collect()
}

#[test]
fn least_recently_used_first_and_never_what_is_needed() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    template(&repo, tmp.path(), "t-old", 1);
    user_snapshot(&repo, tmp.path(), "u-mid", "t-old");
    template(&repo, tmp.path(), "t-new", 2);
    template(&repo, tmp.path(), "own", 3);
    let markers = tmp.path().join("fetched");
    let hour = Duration::from_secs(3600);
    let roomy = FetchCache::new(&markers, 64 << 20);
    fetched(&roomy, "t-old", 3 * hour);
    fetched(&roomy, "u-mid", 2 * hour);
    fetched(&roomy, "t-new", hour);

    let none = HashSet::new();
    assert!(roomy
        .prune(&repo, &none, super::MIN_IDLE)
        .unwrap()
        .is_empty());

    // Bound 0: everything fetched must go, except what is needed. t-old is
    // the oldest but u-mid's parent: u-mid goes first, then t-old; t-new
    // is in use by a sandbox; "own" was never fetched.
    let tight = FetchCache::new(&markers, 0);
    let in_use = HashSet::from(["t-new".to_string()]);
    let evicted = tight.prune(&repo, &in_use, super::MIN_IDLE).unwrap();
    assert_eq!(ids(&evicted), ["u-mid", "t-old"]);
    assert_eq!(evicted[0].aliases, ["snapshot:u-mid"]);
    assert_eq!(evicted[1].aliases, ["template:t-old"]);
    for gone in ["u-mid", "t-old"] {
        assert!(repo.get(gone).is_err(), "{gone} is still in the repository");
        assert!(!tight.marker(gone).exists());
    }
    assert!(repo.resolve("template:t-old").is_err(), "alias left");
    for kept in ["t-new", "own"] {
        repo.get(kept).expect("kept");
    }
    assert!(repo.check().unwrap().issues.is_empty(), "repository clean");

    // Used a moment ago: safe, even when nothing else holds it.
    tight.touch("t-new");
    assert!(tight
        .prune(&repo, &none, super::MIN_IDLE)
        .unwrap()
        .is_empty());
    let evicted = tight.prune(&repo, &none, Duration::ZERO).unwrap();
    assert_eq!(ids(&evicted), ["t-new"]);
    repo.get("own")
        .expect("what this node made is never evicted");
}

#[test]
fn markers_of_snapshots_deleted_elsewhere_are_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    template(&repo, tmp.path(), "t1", 1);
    let cache = FetchCache::new(tmp.path().join("fetched"), 0);
    fetched(&cache, "t1", Duration::from_secs(3600));
    repo.delete("t1").unwrap();
    assert!(cache
        .prune(&repo, &HashSet::new(), Duration::ZERO)
        .unwrap()
        .is_empty());
    assert!(!cache.marker("t1").exists());
    // A touch of something never fetched creates nothing.
    cache.touch("t2");
    assert!(!cache.marker("t2").exists());
}
