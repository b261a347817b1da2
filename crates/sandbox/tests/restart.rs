//! Server stop and restart with real VMs: what survives a `kill -9` of the
//! server, a clean stop, and a sandbox's timeout.
//!
//! One scenario, because every VM costs seconds under TCG:
//! 1. sandboxes `a` (a file written, then paused), `b` (left running),
//!    `c` (timeout 2 s, pauses by itself) and `d` (timeout 1 s, onTimeout
//!    kill: disappears); list filters and the reported sizes;
//! 2. the manager is abandoned as a `kill -9` leaves it: `b`'s VMM lives on;
//! 3. a new manager on the same data directory kills that VMM, reports `b`
//!    dead with the reason, lists `a` and `c` paused, removes the pool's
//!    orphan directory, and resumes both with the file intact;
//! 4. a clean shutdown pauses running `a`; the next manager resumes it.
//!
//! Needs root, QEMU and the guest assets; skipped with a message where they
//! are missing, except under CI where that is a failure.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::{assets_dir, can_run_vms, exec_ok, netns_names};

use futures::FutureExt;
use siesta_sandbox::sandbox::{Lifecycle, OnTimeout, SandboxState};
use siesta_sandbox::{CreateRequest, Error, ListQuery, Node, NodeConfig, SandboxManager};
use siesta_template::{build_template, BuildOptions};

/// Running (not a zombie awaiting this process's wait).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
    })
}

fn config(home: &Path) -> NodeConfig {
    common::node_config(home, 'r')
}

/// Polls until `done` holds; the bound only keeps a broken reaper from
/// hanging the test (no timing is asserted).
async fn wait_until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_survive_server_crash_stop_and_timeout() {
    if !can_run_vms() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("siesta-restart")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::os::unix::fs::symlink(assets_dir(), home.path().join("assets")).unwrap();
    let netns_before = netns_names();

    let outcome = AssertUnwindSafe(Box::pin(scenario(home.path())))
        .catch_unwind()
        .await;

    // Whatever the scenario left (it may have panicked holding managers and
    // nodes): a new node clears the tag's namespaces, a new manager kills
    // leftover VMMs, then every sandbox is killed.
    let node = Node::start(config(home.path()))
        .await
        .expect("cleanup node");
    let m = SandboxManager::open(node.clone()).expect("cleanup manager");
    for s in m.list().await {
        let _ = m.kill(&s.id).await;
    }
    m.shutdown().await;
    drop(m);
    node.shutdown().await;

    let leftover: Vec<_> = netns_names().difference(&netns_before).cloned().collect();
    assert!(leftover.is_empty(), "namespaces left behind: {leftover:?}");
    let dirs = std::fs::read_dir(home.path().join("sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    assert_eq!(dirs, 0, "sandbox directories left behind");
}

async fn scenario(home: &Path) {
    let node = Node::start(config(home)).await.expect("node starts");
    let opts = BuildOptions {
        name: "base".into(),
        image: "base".into(),
        force: false,
    };
    let t = build_template(&node, &opts).await.expect("template builds");
    let m = SandboxManager::open(node.clone()).expect("manager opens");
    assert!(
        matches!(SandboxManager::open(node.clone()), Err(Error::Invalid(_))),
        "a second manager on the same data directory"
    );

    let req = |role: &str, timeout: Option<u64>, on_timeout| CreateRequest {
        template: "base".into(),
        metadata: HashMap::from([("role".to_string(), role.to_string())]),
        env_vars: HashMap::from([("GREETING".to_string(), "hi".to_string())]),
        timeout_secs: timeout,
        lifecycle: Lifecycle {
            on_timeout,
            auto_resume: false,
            filesystem_only: false,
        },
        ..Default::default()
    };
    let a = m
        .create(req("keep", None, OnTimeout::Pause))
        .await
        .expect("a");
    let b = m
        .create(req("lost", None, OnTimeout::Pause))
        .await
        .expect("b");
    let c = m
        .create(req("nap", Some(2), OnTimeout::Pause))
        .await
        .expect("c");
    let d = m
        .create(req("gone", Some(1), OnTimeout::Kill))
        .await
        .expect("d");

    // What the API reports comes from the template and the disk.
    assert_eq!(a.cpu_count, t.record.vcpus);
    assert_eq!(a.memory_mb, t.record.memory_mib);
    assert!(a.disk_size_mb > 0);
    assert_eq!((a.end_at - a.started_at).num_seconds(), 300);
    assert_eq!(a.env_vars.get("GREETING").map(String::as_str), Some("hi"));
    assert_eq!(exec_ok(&m, &a.id, "echo $GREETING").await.trim(), "hi");

    exec_ok(&m, &a.id, "echo persist-me > /home/user/state.txt; sync").await;
    m.pause(&a.id).await.expect("pause a");

    // Timeouts: c pauses by itself, d is killed.
    let (mm, cid, did) = (&m, &c.id, &d.id);
    wait_until("c paused by its timeout", || async move {
        mm.get(cid)
            .await
            .is_ok_and(|s| s.state == SandboxState::Paused)
    })
    .await;
    wait_until("d killed by its timeout", || async move {
        matches!(mm.get(did).await, Err(Error::SandboxNotFound { .. }))
    })
    .await;

    // Filters read the store.
    let paused = ListQuery {
        states: vec![SandboxState::Paused],
        ..Default::default()
    };
    let (rows, _) = m.list_page(&paused).await.expect("list");
    let mut ids: Vec<_> = rows.iter().map(|r| r.id.clone()).collect();
    ids.sort();
    let mut want = vec![a.id.clone(), c.id.clone()];
    want.sort();
    assert_eq!(ids, want);

    // kill -9 of the server: nothing stopped, b's VMM lives on.
    let b_pid = b.vmm_pid.expect("b's VMM");
    m.abandon_for_tests().await;
    drop(m);
    node.shutdown().await;
    assert!(process_alive(b_pid), "b's VMM should outlive the 'crash'");

    let node = Node::start(config(home)).await.expect("node restarts");
    let m = SandboxManager::open(node.clone()).expect("manager reopens");
    assert!(!process_alive(b_pid), "leftover VMM of b still runs");
    let b_now = m.get(&b.id).await.expect("b is reported");
    assert_eq!(b_now.state, SandboxState::Dead);
    assert!(b_now.dead_reason.is_some_and(|r| r.contains("kill -9")));
    let mut on_disk: Vec<String> = std::fs::read_dir(home.join("sandboxes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut rows: Vec<String> = m.list().await.into_iter().map(|s| s.id).collect();
    rows.sort();
    assert_eq!(on_disk, rows, "directories without a row were removed");

    let metadata = ListQuery {
        metadata: vec![("role".into(), "keep".into())],
        ..Default::default()
    };
    let (rows, _) = m.list_page(&metadata).await.expect("list by metadata");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, SandboxState::Paused);
    assert_eq!(rows[0].access_token, a.access_token);

    let (a_now, resumed) = m.connect(&a.id, Some(600)).await.expect("resume a");
    assert!(resumed);
    assert_eq!((a_now.end_at - a_now.started_at).num_seconds(), 600);
    assert_eq!(
        exec_ok(&m, &a.id, "cat /home/user/state.txt").await.trim(),
        "persist-me"
    );
    m.resume(&c.id).await.expect("resume c");
    exec_ok(&m, &c.id, "true").await;
    m.kill(&c.id).await.expect("kill c");
    m.kill(&b.id).await.expect("kill dead b");

    // A clean stop pauses what runs; the next start resumes it.
    exec_ok(&m, &a.id, "echo again >> /home/user/state.txt; sync").await;
    m.shutdown().await;
    assert_eq!(m.get(&a.id).await.unwrap().state, SandboxState::Paused);
    drop(m);
    node.shutdown().await;

    let node = Node::start(config(home))
        .await
        .expect("node restarts again");
    let m = SandboxManager::open(node.clone()).expect("manager reopens again");
    assert_eq!(m.list().await.len(), 1);
    m.resume(&a.id).await.expect("resume a after a clean stop");
    assert_eq!(
        exec_ok(&m, &a.id, "cat /home/user/state.txt").await,
        "persist-me\nagain\n"
    );
    m.kill(&a.id).await.expect("kill a");
    m.shutdown().await;
    drop(m);
    node.shutdown().await;
}
