//! Slow disk work never holds the async threads: a pause or a snapshot
//! whose publication is stalled (as by a slow fsync) leaves the runtime
//! free to serve everything else, because the repository and SQLite run on
//! blocking threads.
//!
//! The runtime has one worker. The publication's hook stalls at its
//! `FilesWritten` step until a probe task, spawned onto that worker while
//! it stalls, has listed the sandboxes and let it go. Had the publication
//! run on the worker, the probe could not run: the hook gives up after
//! 60 s and the operation fails, and so does this test. No timing is
//! asserted, only that the probe ran while the publication waited.
//!
//! Needs root, QEMU and the guest assets, as the other VM tests.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;
use common::{assets_dir, can_run_vms, netns_names, new_namespaces, node_config};

use futures::FutureExt;
use siesta_sandbox::{CreateRequest, Node, SandboxManager};
use siesta_snapshot::repo::{PublishHook, PublishStep};
use siesta_snapshot::RepoError;
use siesta_template::{build_template, BuildOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stalled_publication_leaves_the_async_threads_free() {
    if !can_run_vms() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("siesta-offasync")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::os::unix::fs::symlink(assets_dir(), home.path().join("assets")).unwrap();
    let config = node_config(home.path(), 'b');
    // Only this test's namespaces: other suites may run beside it.
    let ours = format!("siesta-{}-", config.net_tag);
    let netns_before = netns_names();
    let node = Node::start(config).await.expect("node starts");
    let (stall, hook) = Stall::new();
    let manager = SandboxManager::builder(node.clone())
        .publish_hook(hook)
        .ephemeral()
        .expect("manager");

    let outcome = AssertUnwindSafe(scenario(&node, &manager, &stall))
        .catch_unwind()
        .await;
    manager.shutdown().await;
    node.shutdown().await;

    let leftover = new_namespaces(&netns_before, &ours);
    assert!(leftover.is_empty(), "namespaces left behind: {leftover:?}");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    let dirs = std::fs::read_dir(home.path().join("sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(dirs, 0, "sandbox directories left behind");
}

async fn scenario(node: &Arc<Node>, m: &Arc<SandboxManager>, stall: &Stall) {
    let opts = BuildOptions {
        name: "base".into(),
        image: "base".into(),
        force: false,
    };
    build_template(node, &opts).await.expect("template builds");
    let req = CreateRequest {
        template: "base".into(),
        ..Default::default()
    };
    let sb = m.create(req).await.expect("create").id;

    // A user snapshot (its publication ran on the async thread before).
    stall.arm();
    let (mm, id) = (m.clone(), sb.clone());
    let snapshot = tokio::spawn(async move { mm.snapshot(&id, None).await });
    stall.probe_while_stalled(m).await;
    let snap = snapshot.await.expect("snapshot task");
    let snap = snap.expect("the snapshot completes once the probe let it go");
    assert!(m
        .delete_snapshot(&snap.id)
        .expect("delete snapshot")
        .is_some());

    // A pause (its record, unlink and repository calls).
    stall.arm();
    let (mm, id) = (m.clone(), sb.clone());
    let pause = tokio::spawn(async move { mm.pause(&id).await });
    stall.probe_while_stalled(m).await;
    pause
        .await
        .expect("pause task")
        .expect("the pause completes once the probe let it go");
    m.kill(&sb).await.expect("kill");
}

/// Stalls the next publication at `FilesWritten` until released.
struct Stall {
    armed: Arc<Mutex<bool>>,
    entered: Mutex<mpsc::Receiver<()>>,
    release: mpsc::Sender<()>,
}

impl Stall {
    /// The stall, and the hook that makes a publication wait on it.
    fn new() -> (Self, PublishHook) {
        let armed = Arc::new(Mutex::new(false));
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (entered_tx, release_rx) = (Mutex::new(entered_tx), Mutex::new(release_rx));
        let flag = armed.clone();
        let hook: PublishHook = Arc::new(move |step| {
            if step != PublishStep::FilesWritten || !std::mem::take(&mut *flag.lock().unwrap()) {
                return Ok(());
            }
            let _ = entered_tx.lock().unwrap().send(());
            match release_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60))
            {
                Ok(()) => Ok(()),
                // Nobody could run the probe: the worker was held.
                Err(_) => Err(RepoError::Hook(step)),
            }
        });
        let stall = Self {
            armed,
            entered: Mutex::new(entered_rx),
            release: release_tx,
        };
        (stall, hook)
    }

    fn arm(&self) {
        *self.armed.lock().unwrap() = true;
    }

    /// Waits (on this test's own thread, not the worker) until the
    /// publication stalls, then has a task on the worker list the
    /// sandboxes (SQLite, too) and release it.
    async fn probe_while_stalled(&self, m: &Arc<SandboxManager>) {
        self.entered
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(600))
            .expect("the publication reached its stall");
        let (mm, release) = (m.clone(), self.release.clone());
        let probe = tokio::spawn(async move {
            let listed = mm.list().await.len();
            let _ = release.send(());
            listed
        });
        assert!(probe.await.expect("probe task") >= 1);
    }
}
