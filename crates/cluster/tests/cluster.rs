//! The cluster state against a real 3-member etcd: registration, leases
//! that expire when a node dies, sandbox rows written from a node's store
//! in order, ownership that only its owner's writes change, takeover by
//! compare-and-swap, and a member of etcd killed underneath.

mod etcd_server;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use siesta_cluster::{Cluster, ClusterConfig, ClusterKey, Error, EtcdConfig, Location};
use siesta_sandbox::sandbox::{GuestDefaults, Lifecycle, SandboxRecord, SandboxState};
use siesta_sandbox::store::{RowObserver, Store};

/// The key the test's nodes share.
const SECRET: &[u8] = b"the test cluster's 32-byte secret";

/// Node `id`, reaching etcd through `urls` (a subset of the members).
fn config(etcd: &EtcdConfig, urls: &[String], id: &str, ttl_secs: u64) -> ClusterConfig {
    ClusterConfig {
        etcd: EtcdConfig {
            endpoints: urls.to_vec(),
            ..etcd.clone()
        },
        key: Arc::new(ClusterKey::from_secret(SECRET)),
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
    let secure = etcd.node_config();
    let config = |urls: &[String], id: &str, ttl| config(&secure, urls, id, ttl);

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
        Location::Elsewhere(node, _) => assert_eq!(node.id, "a"),
        other => panic!("sb-paused should be on a, got {other:?}"),
    }
    assert!(matches!(
        b.locate("sb-run").await.unwrap(),
        Location::Elsewhere(..)
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
        Location::Elsewhere(..)
    ));

    // One etcd member dies: the other two keep answering.
    etcd.kill(0);
    assert!(matches!(
        b.locate("sb-run").await.unwrap(),
        Location::Elsewhere(..)
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
        Location::Elsewhere(node, _) => assert_eq!(node.id, "b"),
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

/// What someone who reads or writes etcd (but holds no cluster key) gets:
/// no token, env var or node address in the clear, and no forged, moved
/// or foreign record believed. And etcd's own doors: a wrong password or
/// no client certificate keeps a node out, with an error that says so.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_holds_no_secret_and_forged_records_are_not_believed() {
    let Some(bin) = etcd_server::etcd_binary() else {
        return;
    };
    let etcd = etcd_server::EtcdCluster::start(&bin);
    let urls = etcd.client_urls.clone();
    let secure = etcd.node_config();
    let a = Cluster::join(config(&secure, &urls, "a", 5)).await.unwrap();
    let b = Cluster::join(config(&secure, &urls, "b", 5)).await.unwrap();
    let store = Store::in_memory().unwrap();
    store.set_observer(a.row_writer()).unwrap();
    let mut secret = row("sb-secret", SandboxState::Paused);
    secret.access_token = "envd-token-never-in-etcd".into();
    secret.traffic_token = Some("traffic-token-never-in-etcd".into());
    secret.env_vars = HashMap::from([("KEY".into(), "env-value-never-in-etcd".into())]);
    store.put(&secret).unwrap();
    a.row_writer()
        .pause_stored("sb-secret", Some("pause-id-never-in-etcd"));
    a.row_writer().flush().await;

    // Read: nothing secret, nor any node's address, is in the clear.
    let dump = etcd.dump();
    assert!(
        dump.len() >= 5,
        "keys: {:?}",
        dump.iter().map(|kv| &kv.0).collect::<Vec<_>>()
    );
    for (key, value) in &dump {
        let text = String::from_utf8_lossy(value);
        for needle in ["never-in-etcd", "127.0.0.1"] {
            assert!(
                !text.contains(needle),
                "{key} holds {needle:?} in the clear: {text}"
            );
        }
    }
    match b.locate("sb-secret").await.unwrap() {
        Location::Elsewhere(node, owned) => {
            assert_eq!(node.id, "a");
            let row = owned.row.expect("row");
            assert_eq!(row.access_token, "envd-token-never-in-etcd");
            assert_eq!(owned.stored.as_deref(), Some("pause-id-never-in-etcd"));
        }
        other => panic!("sb-secret should be on a, got {other:?}"),
    }

    // Write: a node registered by hand is no node; a row written by hand,
    // or a real sealed row copied under another sandbox's key, is refused.
    etcd.put_as_root(
        "/siesta/nodes/evil",
        br#"{"id":"evil","api":"10.9.9.9:80"}"#,
    );
    let nodes: Vec<String> = b.nodes().await.unwrap().into_iter().map(|n| n.id).collect();
    assert!(!nodes.contains(&"evil".to_string()), "{nodes:?}");
    etcd.put_as_root("/siesta/owners/sb-forged", b"evil");
    let forged = serde_json::to_vec(&row("sb-forged", SandboxState::Paused)).unwrap();
    etcd.put_as_root("/siesta/sandboxes/sb-forged", &forged);
    let got = b.locate("sb-forged").await;
    assert!(
        matches!(got, Err(Error::Unsealed { .. })),
        "forged: {got:?}"
    );
    let sealed = dump
        .iter()
        .find(|(k, _)| k == "/siesta/sandboxes/sb-secret")
        .map(|(_, v)| v.clone())
        .expect("sb-secret's row");
    etcd.put_as_root("/siesta/owners/sb-moved", b"a");
    etcd.put_as_root("/siesta/sandboxes/sb-moved", &sealed);
    let got = b.locate("sb-moved").await;
    assert!(matches!(got, Err(Error::Unsealed { .. })), "moved: {got:?}");
    let listed: Vec<String> = b
        .rows()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.row.id)
        .collect();
    assert_eq!(listed, ["sb-secret"], "only the real row is listed");

    // A node with another cluster key learns nothing from the rows.
    let mut stranger = config(&secure, &urls, "stranger", 5);
    stranger.key = Arc::new(ClusterKey::from_secret(b"some other cluster's 32-byte key"));
    let stranger = Cluster::join(stranger).await.unwrap();
    let got = stranger.locate("sb-secret").await;
    assert!(
        matches!(got, Err(Error::Unsealed { .. })),
        "stranger: {got:?}"
    );
    stranger.leave().await;

    // etcd's doors: a wrong password, no client certificate, plain HTTP.
    let pw = etcd.dir.path().join("wrong.pw");
    std::fs::write(&pw, "not-the-password\n").unwrap();
    let mut wrong = config(&secure, &urls, "w", 5);
    wrong.etcd.user = Some((etcd_server::SIESTA_USER.into(), pw));
    let err = Cluster::join(wrong)
        .await
        .err()
        .expect("joined with a wrong password");
    assert!(err.to_string().contains("etcd refused user"), "{err}");
    let mut no_cert = config(&secure, &urls, "n", 5);
    no_cert.etcd.client_cert = None;
    let err = Cluster::join(no_cert)
        .await
        .err()
        .expect("joined without a client certificate");
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    let plain: Vec<String> = urls
        .iter()
        .map(|u| u.replace("https://", "http://"))
        .collect();
    let err = Cluster::join(config(&secure, &plain, "p", 5))
        .await
        .err()
        .expect("joined over plain HTTP");
    assert!(err.to_string().contains("--insecure-etcd"), "{err}");
    a.leave().await;
    b.leave().await;
}
