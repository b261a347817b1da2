//! A node creates sandboxes of templates and snapshots it does not have,
//! fetched from the object store on first use (issue 13, item 2), against
//! a real S3 server (SeaweedFS on 127.0.0.1) and real VMs:
//!
//! - node A builds template `base`, pushes it with its alias;
//! - node B (another home: empty repository) creates from `base`: fetched,
//!   resumed, commands run; its repository now holds A's snapshot under
//!   the same alias, and the next create is local;
//! - B snapshots a sandbox that wrote a file under a name: B shares it
//!   through the store by itself; node C (another empty home) creates by
//!   that name: the snapshot and the template it was taken over (by id)
//!   are fetched, its disk is re-pointed at C's copy of the template disk,
//!   and the file is there; C deletes it, and it is gone from the store;
//! - C's fetched snapshots under a bound of 0: what its paused sandbox
//!   needs stays, the rest is deleted locally, and fetched again by the
//!   next create that names it;
//! - a name in neither place is `TemplateNotFound`; an unreachable store
//!   is a `Remote` error naming what was asked for, and installs nothing.
//!
//! Needs root, QEMU, the guest assets and `weed` (`make s3-venv`).

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;

mod common;
#[path = "../../snapshot/tests/weed/mod.rs"]
mod weed;

use common::{assets_dir, can_run_vms, exec_ok, netns_names, new_namespaces, node_config};
use futures::FutureExt;
use siesta_sandbox::{CreateRequest, Error, Node, SandboxManager};
use siesta_snapshot::remote::{RemoteRepo, S3Config};
use siesta_snapshot::Repository;
use siesta_template::{build_template, BuildOptions};
use siesta_tier::lazy::LazyTier;
use siesta_tier::RemoteTier;
use weed::{weed_binary, Weed};

fn home(prefix: &str) -> tempfile::TempDir {
    let home = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .unwrap();
    std::os::unix::fs::symlink(assets_dir(), home.path().join("assets")).unwrap();
    home
}

fn create(template: &str) -> CreateRequest {
    CreateRequest {
        template: template.into(),
        ..Default::default()
    }
}

/// Runs `scenario` with a node in `home` (network tag suffix `suffix`)
/// whose manager has the object store `remote`, then shuts it down and
/// checks that it left no namespace behind.
async fn with_node<F, Fut>(home: &Path, suffix: char, remote: Option<RemoteTier>, scenario: F)
where
    F: FnOnce(Arc<Node>, Arc<SandboxManager>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let config = node_config(home, suffix);
    let ours = format!("siesta-{}-", config.net_tag);
    let before = netns_names();
    let node = Node::start(config).await.expect("node starts");
    let mut builder = SandboxManager::builder(node.clone());
    if let Some(remote) = remote {
        builder = builder.remote(remote);
    }
    let manager = builder.ephemeral().expect("manager");
    let outcome = AssertUnwindSafe(scenario(node.clone(), manager.clone()))
        .catch_unwind()
        .await;
    manager.shutdown().await;
    node.shutdown().await;
    let leftover = new_namespaces(&before, &ours);
    assert!(leftover.is_empty(), "namespaces left behind: {leftover:?}");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_creates_from_what_only_the_object_store_has() {
    if !can_run_vms() {
        return;
    }
    let Some(bin) = weed_binary() else { return };
    let weed = Weed::start(&bin);
    let remote = RemoteRepo::open(&weed.config()).expect("client");

    let a = home("siesta-remote-a");
    with_node(a.path(), 'a', None, |node, _| async move {
        let opts = BuildOptions {
            name: "base".into(),
            image: "base".into(),
            force: false,
        };
        build_template(&node, &opts).await.expect("template builds");
    })
    .await;
    let repo_a = Repository::open(a.path().join("repo")).unwrap();
    let base_id = repo_a.resolve("template:base").unwrap().id;
    remote.push(&repo_a, &base_id).await.expect("push");
    remote
        .set_alias("template:base", &base_id)
        .await
        .expect("alias");
    drop(a);

    let b = home("siesta-remote-b");
    let repo_b = Repository::open(b.path().join("repo")).unwrap();
    assert!(repo_b.resolve("template:base").is_err(), "B starts empty");
    let config = weed.config();
    let store = remote.clone();
    let (fill, gate) = tokio::sync::watch::channel(false);
    let lazy = LazyTier::mount(&b.path().join("lazy")).expect("FUSE mount");
    let lazy_tier = RemoteTier::new(store.clone()).with_lazy(lazy.with_fill_gate(gate));
    with_node(b.path(), 'b', Some(lazy_tier), |node, m| {
        Box::pin(async move {
            from_the_store(&m, &repo_b, &base_id, fill).await;
            snapshot_shared(&m, &store).await;
            unreachable_store(&node, &repo_b, &config).await;
        })
    })
    .await;
    no_sandbox_dirs(b.path());
    drop(b);

    let c = home("siesta-remote-c");
    let tier_c = RemoteTier::new(remote.clone());
    with_node(c.path(), 'c', Some(tier_c), |_, m| {
        Box::pin(async move {
            let child = m
                .create(create("stored"))
                .await
                .expect("create fetches it")
                .id;
            let note = exec_ok(&m, &child, "cat /home/user/note").await;
            assert_eq!(note.trim(), "kept-in-the-store");
            evicted_and_fetched_again(&m, &child).await;
            let id = m.delete_snapshot("stored").unwrap().expect("C has it now");
            m.unshare_snapshot(&id).await;
            assert!(
                !remote.contains(&id).await.unwrap(),
                "deleted from the store"
            );
            assert!(remote.alias_target("snapshot:stored").await.is_err());
        })
    })
    .await;
    no_sandbox_dirs(c.path());
}

/// Node C's fetched snapshots (`stored` and `base`) under a bound of 0:
/// what its paused sandbox needs stays (`base`, its pause's parent), the
/// rest goes; with the sandbox gone `base` goes too; a create fetches both
/// again. `child` is running on entry and killed on return.
async fn evicted_and_fetched_again(m: &Arc<SandboxManager>, child: &str) {
    use std::time::Duration;
    let repo = Repository::open(m.node().config.layout().repo()).unwrap();
    let stored = repo.resolve("snapshot:stored").unwrap();
    let (stored, base) = (stored.id, stored.parent.expect("taken over base"));
    m.pause(child).await.expect("pause");
    let ids = |ev: Vec<siesta_tier::fetch_cache::Evicted>| -> Vec<String> {
        ev.into_iter().map(|e| e.id).collect()
    };
    let evicted = m.prune_fetched(Some(0), Duration::ZERO).await.unwrap();
    assert_eq!(
        ids(evicted),
        vec![stored.clone()],
        "only what nothing needs"
    );
    assert!(repo.resolve("snapshot:stored").is_err(), "alias left");
    let kept = m.prune_fetched(None, Duration::ZERO).await.unwrap();
    assert!(kept.is_empty(), "within the configured bound");
    m.connect(child, None)
        .await
        .expect("the paused sandbox resumes");
    let note = exec_ok(m, child, "cat /home/user/note").await;
    assert_eq!(note.trim(), "kept-in-the-store");
    m.kill(child).await.unwrap();
    let evicted = m.prune_fetched(Some(0), Duration::ZERO).await.unwrap();
    assert_eq!(ids(evicted), vec![base.clone()]);
    assert!(repo.get(&base).is_err() && repo.get(&stored).is_err());
    assert!(repo.check().unwrap().issues.is_empty(), "repository clean");
    let again = m.create(create("stored")).await.expect("fetched again").id;
    let note = exec_ok(m, &again, "cat /home/user/note").await;
    assert_eq!(note.trim(), "kept-in-the-store");
    repo.get(&base).expect("its template fetched again");
    m.kill(&again).await.unwrap();
}

fn no_sandbox_dirs(home: &Path) {
    let dirs = std::fs::read_dir(home.join("sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(dirs, 0, "sandbox directories left behind");
}

/// `base` served lazily on the first create (its background fill held:
/// the sandbox runs on what it touched), imported once the fill runs; a
/// pause waits for that, and the paused sandbox resumes over the imported
/// disk once the FUSE paths are gone; the next create is local.
async fn from_the_store(
    m: &Arc<SandboxManager>,
    repo_b: &Repository,
    base_id: &str,
    fill: tokio::sync::watch::Sender<bool>,
) {
    let err = m.create(create("nowhere")).await.unwrap_err();
    assert!(
        matches!(err, Error::TemplateNotFound { .. }),
        "a name in neither place: {err}"
    );
    let sb = m
        .create(create("base"))
        .await
        .expect("create serves base lazily")
        .id;
    assert_eq!(
        exec_ok(
            m,
            &sb,
            "echo fetched-$((6*7)) > /home/user/f && cat /home/user/f"
        )
        .await
        .trim(),
        "fetched-42"
    );
    let lazy = m.remote().and_then(|r| r.lazy()).expect("lazy tier");
    let (fetched, total) = lazy.view(base_id).expect("served lazily").fetched();
    eprintln!(
        "lazy create: {} of {} MiB fetched",
        fetched >> 20,
        total >> 20
    );
    assert!(fetched > 0 && fetched < total, "{fetched} of {total} bytes");
    assert!(
        repo_b.resolve("template:base").is_err(),
        "not imported while its fill is held"
    );
    fill.send(true).unwrap();
    m.pause(&sb).await.expect("pause waits for the import");
    assert_eq!(repo_b.resolve("template:base").unwrap().id, base_id);
    let disk = m
        .node()
        .config
        .layout()
        .sandboxes()
        .join(&sb)
        .join("disk.qcow2");
    let fuse_backing = siesta_host::disk::backing_file(&disk).ok().flatten();
    // The disk is in the repository while paused: read it there.
    let paused_disk = fuse_backing.or_else(|| {
        let snap = repo_b.resolve(&format!("sandbox:{sb}")).ok()?;
        let path = repo_b.file_path(&snap, "disk").ok()?;
        siesta_host::disk::backing_file(&path).ok().flatten()
    });
    assert!(
        paused_disk.is_some_and(|b| b.starts_with(lazy.mount_dir())),
        "the paused disk is over the FUSE file"
    );
    lazy.detach();
    m.connect(&sb, None)
        .await
        .expect("resumes over the imported disk");
    assert_eq!(
        exec_ok(
            m,
            &sb,
            "cat /home/user/f && md5sum /usr/bin/* > /dev/null && echo read"
        )
        .await
        .trim(),
        "fetched-42\nread"
    );
    m.kill(&sb).await.unwrap();
    let again = m.create(create("base")).await.expect("local create").id;
    m.kill(&again).await.unwrap();
}

/// A named user snapshot of a sandbox that wrote a file: the manager puts
/// it in the store by itself (in the background: waited for, at most 5 min).
async fn snapshot_shared(m: &Arc<SandboxManager>, remote: &RemoteRepo) {
    let sb = m.create(create("base")).await.unwrap().id;
    exec_ok(m, &sb, "echo kept-in-the-store > /home/user/note && sync").await;
    let snap = m
        .snapshot_with(&sb, Some("stored".into()), true)
        .await
        .expect("snapshot");
    m.kill(&sb).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while remote.alias_target("snapshot:stored").await.ok().as_deref() != Some(&snap.id) {
        assert!(
            std::time::Instant::now() < deadline,
            "snapshot {} was not shared through the store",
            snap.id
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// A store that does not answer: a `Remote` error naming the template,
/// nothing installed.
async fn unreachable_store(node: &Arc<Node>, repo_b: &Repository, config: &S3Config) {
    let mut dead = config.clone();
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    dead.endpoint = format!("http://127.0.0.1:{port}");
    let m = SandboxManager::builder(node.clone())
        .remote(RemoteTier::new(RemoteRepo::open(&dead).unwrap()))
        .ephemeral()
        .expect("manager");
    let before = repo_b.list().unwrap().len();
    let err = m.create(create("elsewhere")).await.unwrap_err();
    m.shutdown().await;
    assert!(
        matches!(&err, Error::Remote { name, .. } if name == "elsewhere"),
        "unreachable store: {err}"
    );
    assert_eq!(repo_b.list().unwrap().len(), before, "nothing installed");
}
