//! Repository behaviour: publication, sharing, deletion racing publication
//! and manifest attachment, check and repair.

mod common;

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::*;
use siesta_snapshot::manifest::ManifestError;
use siesta_snapshot::repo::{IssueKind, PublishStep};
use siesta_snapshot::{Manifest, RepoError, Repository};

#[test]
fn publish_resolve_share_and_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let (mem, state) = sources(tmp.path(), "a", 1);
    let a = repo.publish(request("a", &mem, &state)).unwrap();
    let (_, state_b) = sources(tmp.path(), "b", 1);
    // Same memory content: one blob for both.
    let b = repo.publish(request("b", &mem, &state_b)).unwrap();
    assert_eq!(repo.resolve("template:a").unwrap(), a);
    assert_eq!(repo.resolve("a").unwrap(), a);
    assert!(matches!(
        repo.resolve("template:none"),
        Err(RepoError::NotFound(_))
    ));
    assert_eq!(repo.list().unwrap().len(), 2);
    let pa = repo.file_path(&a, "memory").unwrap();
    assert_eq!(pa, repo.file_path(&b, "memory").unwrap());
    assert_eq!(
        std::fs::read_dir(repo.root().join("blobs"))
            .unwrap()
            .count(),
        1
    );
    assert_eq!(
        std::fs::read_to_string(repo.file_path(&a, "state").unwrap()).unwrap(),
        "state of a"
    );
    assert!(matches!(
        repo.publish(request("a", &mem, &state)),
        Err(RepoError::Exists(_))
    ));

    repo.delete("a").unwrap();
    assert!(matches!(repo.get("a"), Err(RepoError::NotFound(_))));
    assert!(repo.alias_target("template:a").unwrap().is_none());
    assert!(pa.exists(), "b still references the blob");
    repo.delete("b").unwrap();
    // Collection after a delete is best effort: it is skipped while the
    // gate is held, and a child that another test thread forks holds a
    // writer's gate descriptor for an instant until it execs. `repair`
    // waits for the gate and catches up, as `delete` documents.
    if pa.exists() {
        repo.repair(std::time::Duration::from_secs(10)).unwrap();
    }
    assert!(!pa.exists(), "unreferenced blob collected");
    assert!(matches!(repo.delete("b"), Err(RepoError::NotFound(_))));
    // A deleted id is never published again.
    assert!(matches!(
        repo.publish(request("a", &mem, &state)),
        Err(RepoError::Deleted { .. })
    ));
    assert!(repo.check().unwrap().is_clean());
}

#[test]
fn an_evicted_copy_can_come_back_a_deleted_one_cannot() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let (mem, state) = sources(tmp.path(), "e", 4);
    let first = repo.publish(request("e", &mem, &state)).unwrap();
    repo.evict("e").unwrap();
    assert!(matches!(repo.get("e"), Err(RepoError::NotFound(_))));
    assert!(repo.alias_target("template:e").unwrap().is_none());
    assert!(matches!(repo.evict("e"), Err(RepoError::NotFound(_))));
    // Fetched again (here: published again under the same id).
    let again = repo.publish(request("e", &mem, &state)).unwrap();
    assert_eq!(again.files, first.files);
    assert_eq!(repo.resolve("template:e").unwrap().id, "e");
    repo.delete("e").unwrap();
    assert!(matches!(
        repo.publish(request("e", &mem, &state)),
        Err(RepoError::Deleted { .. })
    ));
    assert!(repo.check().unwrap().is_clean());
}

#[test]
fn publication_racing_deletion_never_resurrects() {
    let tmp = tempfile::tempdir().unwrap();
    let (reached_tx, reached_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Arc::new(Mutex::new(go_rx));
    let repo = Repository::open(tmp.path().join("repo"))
        .unwrap()
        .with_publish_hook(Arc::new(move |step| {
            if step == PublishStep::FilesWritten {
                let _ = reached_tx.send(());
                let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
            }
            Ok(())
        }));
    let (mem, state) = sources(tmp.path(), "x", 2);
    let publisher = {
        let repo = repo.clone();
        std::thread::spawn(move || repo.publish(request("x", &mem, &state)))
    };
    reached_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    // Deleting a snapshot still being published: the publisher must lose.
    repo.delete("x").unwrap();
    go_tx.send(()).unwrap();
    let result = publisher.join().unwrap();
    assert!(
        matches!(result, Err(RepoError::Deleted { .. })),
        "{result:?}"
    );
    assert!(matches!(repo.get("x"), Err(RepoError::NotFound(_))));
    assert!(!repo.snapshot_dir("x").exists());
    assert!(repo.alias_target("template:x").unwrap().is_none());
    repo.repair(Duration::from_secs(5)).unwrap();
    assert!(repo.check().unwrap().is_clean());
    assert_eq!(
        std::fs::read_dir(repo.root().join("blobs"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn manifest_attach_after_delete_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let (mem, state) = sources(tmp.path(), "m", 3);
    let rec = repo.publish(request("m", &mem, &state)).unwrap();
    let manifest = Manifest::from_touch_order(4096, MEM, &[3, 1, 2, 9]);

    // Attached normally, it resolves and validates.
    let with = repo
        .attach_manifest("m", rec.generation, &manifest)
        .unwrap();
    assert_eq!(repo.load_manifest(&with).unwrap(), Some(manifest.clone()));
    // A recorder holding a stale generation is refused.
    assert!(matches!(
        repo.attach_manifest("m", rec.generation + 1, &manifest),
        Err(RepoError::Deleted { .. })
    ));
    // A recorder finishing after the delete does not bring it back.
    repo.delete("m").unwrap();
    assert!(matches!(
        repo.attach_manifest("m", rec.generation, &manifest),
        Err(RepoError::Deleted { .. })
    ));
    assert!(!repo.snapshot_dir("m").exists());
    assert!(repo.check().unwrap().is_clean());
}

#[test]
fn corrupt_or_missing_manifest_is_an_error_to_fall_back_on() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let (mem, state) = sources(tmp.path(), "c", 4);
    let rec = repo.publish(request("c", &mem, &state)).unwrap();
    assert_eq!(repo.load_manifest(&rec).unwrap(), None, "none recorded yet");
    let manifest = Manifest::from_touch_order(4096, MEM, &[5, 6]);
    let rec = repo
        .attach_manifest("c", rec.generation, &manifest)
        .unwrap();
    let path = repo.snapshot_dir("c").join("startup.manifest");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[33] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    match repo.load_manifest(&rec) {
        Err(RepoError::Manifest {
            source: ManifestError::HashMismatch { .. },
            ..
        }) => {}
        other => panic!("expected a hash mismatch, got {other:?}"),
    }
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        repo.load_manifest(&rec),
        Err(RepoError::Io { .. })
    ));
}

#[test]
fn stale_lock_of_a_dead_holder_is_broken_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let (mem, state) = sources(tmp.path(), "s", 5);
    repo.publish(request("s", &mem, &state)).unwrap();
    // A holder that died: a finished child's pid.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let lock = repo.root().join("locks/s.lock");
    let owner = serde_json::json!({"pid": dead, "acquired_unix_ms": 1u64 << 50, "lease_ms": 60000, "token": 1});
    std::fs::write(&lock, owner.to_string()).unwrap();
    let report = repo.check().unwrap();
    assert!(report.issues.iter().any(|i| i.kind == IssueKind::StaleLock));
    repo.delete("s").unwrap();
    assert!(!lock.exists());
    assert!(repo.check().unwrap().is_clean());
}

#[test]
fn check_reports_and_repair_removes_leftovers() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let (mem, state) = sources(tmp.path(), "k", 6);
    let rec = repo.publish(request("k", &mem, &state)).unwrap();
    let root = repo.root();
    std::fs::create_dir(root.join("snapshots/half")).unwrap();
    std::fs::write(root.join("snapshots/half/record.json"), "{}").unwrap();
    std::fs::create_dir(root.join("staging/y.1234")).unwrap();
    std::fs::write(root.join("blobs/deadbeef"), "x").unwrap();
    std::fs::write(root.join("tmp/abc.1"), "x").unwrap();
    std::fs::write(root.join("aliases/template:gone"), "nothing").unwrap();
    let report = repo.check().unwrap();
    let kinds: Vec<IssueKind> = report.issues.iter().map(|i| i.kind).collect();
    for k in [
        IssueKind::HalfPublished,
        IssueKind::StaleStaging,
        IssueKind::OrphanBlob,
        IssueKind::TempFile,
        IssueKind::DanglingAlias,
    ] {
        assert!(kinds.contains(&k), "{k:?} not in {kinds:?}");
    }
    assert_eq!(report.snapshots, 1);
    let repaired = repo.repair(Duration::from_secs(5)).unwrap();
    assert_eq!(repaired.issues.len(), 5);
    assert!(repo.check().unwrap().is_clean());
    assert_eq!(repo.get("k").unwrap(), rec, "the good snapshot survives");
    assert!(repo.file_path(&rec, "memory").unwrap().exists());
}

/// A paused sandbox's disk: hard-linked in at publication (the source stays
/// whole if the publication fails), then taken out by its resume and given
/// back if that resume fails.
#[test]
fn linked_private_file_is_taken_and_returned() {
    use siesta_snapshot::repo::{Placement, PublishFile};
    use std::os::unix::fs::MetadataExt;

    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let (mem, state) = sources(tmp.path(), "p", 3);
    let disk = tmp.path().join("disk.qcow2");
    std::fs::write(&disk, b"written blocks").unwrap();
    let mut req = request("p", &mem, &state);
    req.files.push(PublishFile {
        role: "disk".into(),
        source: disk.clone(),
        placement: Placement::LocalLink,
        sha256: None,
    });
    let p = repo.publish(req).unwrap();
    let in_repo = repo.file_path(&p, "disk").unwrap();
    assert_eq!(
        std::fs::metadata(&in_repo).unwrap().ino(),
        std::fs::metadata(&disk).unwrap().ino(),
        "linked, not copied"
    );
    std::fs::remove_file(&disk).unwrap();

    repo.take_file("p", "disk", &disk).unwrap();
    assert!(!in_repo.exists());
    assert_eq!(std::fs::read(&disk).unwrap(), b"written blocks");
    let report = repo.check().unwrap();
    assert!(report
        .issues
        .iter()
        .any(|i| i.kind == IssueKind::MissingFile));
    repo.return_file("p", "disk", &disk).unwrap();
    assert!(!disk.exists());
    assert!(repo.check().unwrap().is_clean());

    // Shared blobs and unknown roles cannot be taken; neither can a
    // deleted snapshot's files.
    let elsewhere = tmp.path().join("x");
    assert!(matches!(
        repo.take_file("p", "memory", &elsewhere),
        Err(RepoError::Shared { .. })
    ));
    assert!(matches!(
        repo.take_file("p", "nothing", &elsewhere),
        Err(RepoError::NoFile { .. })
    ));
    repo.delete("p").unwrap();
    assert!(matches!(
        repo.take_file("p", "disk", &elsewhere),
        Err(RepoError::NotFound(_))
    ));
}

#[test]
fn verify_file_checks_size_and_the_digest_the_record_keeps() {
    use siesta_snapshot::repo::sha256_file;

    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let (mem, state) = sources(tmp.path(), "v", 5);
    let mut req = request("v", &mem, &state);
    req.files[1].sha256 = Some(sha256_file(&state).unwrap());
    let v = repo.publish(req).unwrap();
    let again = repo.get("v").unwrap();
    assert_eq!(again.files["state"].digest(), v.files["state"].digest());
    assert!(
        v.files["state"].digest().is_some(),
        "a private file keeps its digest"
    );
    repo.verify_file(&v, "state").unwrap();
    repo.verify_file(&v, "memory").unwrap();

    let path = repo.file_path(&v, "state").unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let e = repo.verify_file(&v, "state").unwrap_err();
    assert!(matches!(e, RepoError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("SHA-256"), "{e}");
    bytes.pop();
    std::fs::write(&path, &bytes).unwrap();
    let e = repo.verify_file(&v, "state").unwrap_err();
    assert!(e.to_string().contains("bytes, the record says"), "{e}");
}
