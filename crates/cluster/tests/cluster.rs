//! The cluster state against a real 3-member etcd: registration, leases
//! that expire when a node dies, sandbox rows written from a node's store
//! in order, ownership that only its owner's writes change, takeover by
//! compare-and-swap, and a member of etcd killed underneath.

mod etcd_server;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use siesta_cluster::{Cluster, ClusterConfig, Error, Location};
use siesta_sandbox::sandbox::{GuestDefaults, Lifecycle, SandboxRecord, SandboxState};
use siesta_sandbox::store::{RowObserver, Store};

fn config(urls: &[String], id: &str, ttl_secs: u64) -> ClusterConfig {
    ClusterConfig {
        endpoints: urls.to_vec(),
        node_id: id.into(),
        advertise: format!("127.0.0.1:{}", 3000 + id.len()),
        lease_ttl: Duration::from_secs(ttl_secs),
    }
}

fn row(id: &str, state: SandboxState) -> SandboxRecord {
    let now = chrono::Utc::now();
    SandboxRecord {
        id: id.into(),
        template: "base".into(),
        state,
        created_at: now,
        started_at: now,
        end_at: now,
        access_token: format!("tok-{id}"),
        env_vars: HashMap::new(),
        metadata: HashMap::from([("k".to_string(), "v".to_string())]),
        egress: Default::default(),
        traffic_token: None,
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 2048,
        lifecycle: Lifecycle::default(),
        agent_addr: None,
        vmm_pid: None,
        timings: None,
        dead_reason: None,
        guest_defaults: GuestDefaults {
            user: "user".into(),
            workdir: "/home/user".into(),
        },
        volume_mounts: Vec::new(),
        paused_disk_only: false,
    }
}

/// Joins in a runtime of its own, which the caller drops to make the node
/// die without leaving (its lease is then never revoked, only expires).
fn join_in_own_runtime(cfg: ClusterConfig) -> (tokio::runtime::Runtime, Arc<Cluster>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cluster = rt.block_on(Cluster::join(cfg)).unwrap();
    (rt, cluster)
}

async fn wait_for(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_own_sandboxes_and_take_over_those_of_a_dead_node() {
    let Some(bin) = etcd_server::etcd_binary() else {
        return;
    };
    let mut etcd = etcd_server::EtcdCluster::start(&bin);
    let urls = etcd.client_urls.clone();

    // Node a, in a runtime we can drop (its death); node b, here.
    let (rt_a, a) = tokio::task::block_in_place(|| join_in_own_runtime(config(&urls, "a", 2)));
    let b = Cluster::join(config(&urls, "b", 2)).await.unwrap();
    let mut ids: Vec<String> = b.nodes().await.unwrap().into_iter().map(|n| n.id).collect();
    ids.sort();
    assert_eq!(ids, ["a", "b"]);
    // A second live node with a's id is refused.
    match Cluster::join(config(&urls, "a", 2)).await {
        Err(Error::NodeIdTaken { id }) => assert_eq!(id, "a"),
        other => panic!("a duplicate node id joined: {:?}", other.map(|_| ())),
    }

    // a's store reports its rows: b sees a as their owner, with the row.
    let store_a = Store::in_memory().unwrap();
    store_a.put(&row("sb-run", SandboxState::Running)).unwrap();
    assert!(
        store_a.set_observer(a.row_writer()).unwrap(),
        "replays existing rows"
    );
    store_a
        .put(&row("sb-paused", SandboxState::Running))
        .unwrap();
    store_a
        .put(&row("sb-paused", SandboxState::Paused))
        .unwrap();
    a.row_writer().pause_stored("sb-paused", Some("paused-1"));
    a.row_writer().pause_stored("sb-run", Some("paused-0"));
    a.row_writer().pause_stored("sb-run", None);
    store_a.put(&row("sb-gone", SandboxState::Running)).unwrap();
    assert!(store_a.delete("sb-gone").unwrap());
    tokio::task::block_in_place(|| rt_a.block_on(a.row_writer().flush()));
    match b.locate("sb-paused").await.unwrap() {
        Location::Elsewhere(node) => assert_eq!(node.id, "a"),
        other => panic!("sb-paused should be on a, got {other:?}"),
    }
    assert!(matches!(
        b.locate("sb-run").await.unwrap(),
        Location::Elsewhere(_)
    ));
    assert!(matches!(
        b.locate("sb-gone").await.unwrap(),
        Location::Unknown
    ));
    assert!(matches!(
        b.locate("nowhere").await.unwrap(),
        Location::Unknown
    ));

    // b's writes of a row a owns are refused (ownership is a's).
    let store_b = Store::in_memory().unwrap();
    store_b.set_observer(b.row_writer()).unwrap();
    store_b.put(&row("sb-run", SandboxState::Dead)).unwrap();
    b.row_writer().flush().await;
    assert!(matches!(
        b.locate("sb-run").await.unwrap(),
        Location::Elsewhere(_)
    ));

    // One etcd member dies: the other two keep answering.
    etcd.kill(0);
    assert!(matches!(
        b.locate("sb-run").await.unwrap(),
        Location::Elsewhere(_)
    ));

    // a dies without leaving: after its lease (2 s) its sandboxes are
    // orphaned, with the row a last wrote.
    rt_a.shutdown_background();
    wait_for("a's lease to expire", Duration::from_secs(20), async || {
        matches!(b.locate("sb-paused").await, Ok(Location::Orphaned(_)))
    })
    .await;
    let Location::Orphaned(owned) = b.locate("sb-paused").await.unwrap() else {
        unreachable!()
    };
    assert_eq!(owned.node, "a");
    let last = owned.row.expect("the row a wrote");
    assert_eq!(last.state, SandboxState::Paused);
    assert_eq!(last.access_token, "tok-sb-paused");
    assert_eq!(last.metadata["k"], "v");
    assert_eq!(owned.stored.as_deref(), Some("paused-1"));
    match b.locate("sb-run").await.unwrap() {
        Location::Orphaned(run) => assert_eq!(run.stored, None, "cleared"),
        other => panic!("sb-run should be orphaned, got {other:?}"),
    }

    // Takeover is a compare-and-swap: the first claim wins, a second
    // node's claim (a is no longer the owner) does not; asking again is
    // harmless for the winner.
    let c = Cluster::join(config(&urls[1..], "c", 2)).await.unwrap();
    assert!(b.take_over("sb-paused", "a").await.unwrap());
    assert!(!c.take_over("sb-paused", "a").await.unwrap());
    assert!(b.take_over("sb-paused", "a").await.unwrap());
    assert!(matches!(
        b.locate("sb-paused").await.unwrap(),
        Location::Here
    ));
    match c.locate("sb-paused").await.unwrap() {
        Location::Elsewhere(node) => assert_eq!(node.id, "b"),
        other => panic!("sb-paused should be on b now, got {other:?}"),
    }
    // Now b's rows of it are written, and its delete removes it.
    store_b
        .put(&row("sb-paused", SandboxState::Running))
        .unwrap();
    store_b.delete("sb-paused").unwrap();
    b.row_writer().flush().await;
    assert!(matches!(
        b.locate("sb-paused").await.unwrap(),
        Location::Unknown
    ));

    // Leaving deregisters at once (no TTL to wait for).
    b.leave().await;
    let again = Cluster::join(config(&urls[1..], "b", 2)).await.unwrap();
    again.leave().await;
    c.leave().await;

    // A node that crashed and restarts at once finds its old registration
    // still there: it waits for it to expire instead of failing.
    let (rt_d, _d) =
        tokio::task::block_in_place(|| join_in_own_runtime(config(&urls[1..], "d", 2)));
    rt_d.shutdown_background();
    let d = Cluster::join(config(&urls[1..], "d", 2)).await.unwrap();
    d.leave().await;
}
