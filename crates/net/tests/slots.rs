//! Real namespaces, veths, taps and nftables: needs root (skips otherwise).
//! Each test uses its own tag and subnet so it never touches a running
//! server's slots, and a Drop guard removes everything by exact name even
//! when an assertion fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::{must_run, ok, sh, skip_reason, test_subnet, unique_tag, Guard};
use siesta_net::layout::{GUEST_ADDR, GUEST_MAC, NS_VETH_MAC, TAP_MAC};
use siesta_net::{
    spawn_in_netns, EgressPolicy, GuestLink, NetConfig, NetError, PolicyUpdate, Slot, SlotPool, Tag,
};

/// Asserts nothing of this tag is left: namespaces, host veths, root table.
fn assert_nothing_left(tag: &Tag) {
    let netns = ok(&["ip", "netns", "list"]);
    for line in netns.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        assert!(tag.parse_netns(name).is_none(), "namespace {name} left");
    }
    let links = ok(&["ip", "-o", "link", "show"]);
    for line in links.lines() {
        let name = line.split(": ").nth(1).unwrap_or("");
        let name = name.split('@').next().unwrap_or(name);
        assert!(tag.parse_host_veth(name).is_none(), "veth {name} left");
    }
    let (exists, _) = sh(&["nft", "list", "table", "ip", &tag.root_table()]);
    assert!(!exists, "root table {} left", tag.root_table());
}

fn assert_slot_plumbing(slot: &Slot) {
    let ns = &slot.netns_name;
    assert!(
        slot.netns_path().exists(),
        "{}",
        slot.netns_path().display()
    );
    let host = ok(&["ip", "-o", "-4", "addr", "show", "dev", slot.host_veth()]);
    assert!(
        host.contains(&format!("inet {}/30", slot.host_addr)),
        "{host}"
    );
    // The slot address is a permanent neighbour: the host never ARPs for
    // it (an unanswered request would hold packets for a second).
    let slot_addr = slot.slot_addr.to_string();
    let neigh = ok(&["ip", "neigh", "show", &slot_addr, "dev", slot.host_veth()]);
    assert!(
        neigh.contains(NS_VETH_MAC) && neigh.contains("PERMANENT"),
        "{neigh}"
    );
    let veth = ok(&["ip", "-n", ns, "link", "show", "dev", "veth0"]);
    assert!(veth.contains(NS_VETH_MAC), "{veth}");
    let inner = ok(&["ip", "-n", ns, "-o", "-4", "addr", "show", "dev", "veth0"]);
    assert!(
        inner.contains(&format!("inet {}/30", slot.slot_addr)),
        "{inner}"
    );
    let tap = ok(&[
        "ip",
        "-n",
        ns,
        "-o",
        "-4",
        "addr",
        "show",
        "dev",
        &slot.tap_name,
    ]);
    assert!(tap.contains("inet 169.254.0.22/30"), "{tap}");
    let link = ok(&["ip", "-n", ns, "link", "show", "dev", &slot.tap_name]);
    assert!(link.contains(TAP_MAC), "{link}");
    let route = ok(&["ip", "-n", ns, "route", "show", "default"]);
    assert!(
        route.contains(&format!("via {}", slot.host_addr)),
        "{route}"
    );
    let neigh = ok(&["ip", "-n", ns, "neigh", "show", "dev", &slot.tap_name]);
    assert!(
        neigh.contains(&format!("{GUEST_ADDR} lladdr {GUEST_MAC} PERMANENT")),
        "{neigh}"
    );
    let rules = ok(&[
        "ip", "netns", "exec", ns, "nft", "list", "table", "ip", "siesta",
    ]);
    assert!(
        rules.contains(&format!("ip daddr {} dnat to {GUEST_ADDR}", slot.slot_addr)),
        "{rules}"
    );
    assert!(
        rules.contains(&format!("snat to {}", slot.slot_addr)),
        "{rules}"
    );
}

async fn wait_warm(pool: &SlotPool, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while pool.stats().await.warm < n {
        assert!(Instant::now() < deadline, "warm set never refilled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tap_slots_pool_reuse_and_policy() {
    if let Some(reason) = skip_reason() {
        assert!(
            !must_run(),
            "tap_slots_pool_reuse_and_policy cannot run: {reason}"
        );
        eprintln!("skipping tap_slots_pool_reuse_and_policy: {reason}");
        return;
    }
    let tag_str = unique_tag(1);
    let tag = Tag::new(&tag_str).unwrap();
    // A leftover of "this tag" from a crashed run, and a name of another tag
    // that merely starts with this one: start() removes only the first.
    let other_tag_ns = format!("siesta-{tag_str}x-0");
    let _guard = Guard {
        tag: tag.clone(),
        capacity: 8,
        extra_netns: vec![other_tag_ns.clone()],
    };
    ok(&["ip", "netns", "add", &tag.netns_name(7)]);
    ok(&["ip", "netns", "add", &other_tag_ns]);

    let pool = SlotPool::new(NetConfig {
        tag: tag_str.clone(),
        subnet: test_subnet(&tag_str, 1),
        capacity: 2,
        warm: 1,
        guest_link: GuestLink::Tap,
        ..NetConfig::default()
    })
    .unwrap();
    pool.start().await.unwrap();
    assert!(!std::path::Path::new("/run/netns")
        .join(tag.netns_name(7))
        .exists());
    assert!(std::path::Path::new("/run/netns")
        .join(&other_tag_ns)
        .exists());
    ok(&["ip", "netns", "del", &other_tag_ns]);
    assert_eq!(pool.stats().await.warm, 1);
    assert_eq!(pool.capacity(), 2);
    assert_eq!(pool.room().await, 2, "a warm slot is room");

    let a = pool.acquire().await.unwrap();
    wait_warm(&pool, 1).await;
    assert_eq!(pool.room().await, 1, "one handed out");
    let b = pool.acquire().await.unwrap();
    assert_eq!(pool.room().await, 0);
    assert_ne!(a.index, b.index);
    assert_ne!(a.slot_addr, b.slot_addr);
    for s in [&a, &b] {
        assert_slot_plumbing(s);
        let d = ok(&[
            "ip",
            "-n",
            &s.netns_name,
            "-d",
            "link",
            "show",
            "dev",
            "tap0",
        ]);
        assert!(d.contains("tun type tap"), "tap0 is not a tap: {d}");
    }
    assert!(matches!(
        pool.acquire().await,
        Err(NetError::Exhausted { capacity: 2, .. })
    ));

    // Redundant policy updates are skipped.
    let deny = EgressPolicy::internet(false);
    assert_eq!(
        b.apply_policy(&EgressPolicy::default()).await.unwrap(),
        PolicyUpdate::Skipped
    );
    assert_eq!(b.apply_policy(&deny).await.unwrap(), PolicyUpdate::Applied);
    assert_eq!(b.apply_policy(&deny).await.unwrap(), PolicyUpdate::Skipped);
    // A forgotten policy is written again (the pool does this when asked
    // not to trust a reused slot's rules).
    b.forget_policy().await;
    assert_eq!(b.apply_policy(&deny).await.unwrap(), PolicyUpdate::Applied);
    let chain = ok(&[
        "ip",
        "netns",
        "exec",
        &b.netns_name,
        "nft",
        "list",
        "chain",
        "ip",
        "siesta",
        "egress",
    ]);
    assert!(chain.contains("iifname \"tap0\" drop"), "{chain}");

    // Released into the empty warm set: kept, and its policy remembered.
    let b_index = b.index;
    pool.release(b).await.unwrap();
    assert_eq!(pool.stats().await.reused, 1);
    let again = pool.acquire().await.unwrap();
    assert_eq!(again.index, b_index);
    assert_eq!(again.applied_policy().await, Some(deny.clone()));
    assert_eq!(
        again.apply_policy(&deny).await.unwrap(),
        PolicyUpdate::Skipped
    );
    assert_eq!(
        again.apply_policy(&EgressPolicy::default()).await.unwrap(),
        PolicyUpdate::Applied
    );

    pool.release(a).await.unwrap();
    // A holder dropped without releasing its slot (a task cancelled or
    // panicking mid-resume): the pool destroys the slot and its room
    // comes back, instead of the namespace leaking until restart.
    let destroyed = pool.stats().await.destroyed;
    let orphan = pool.acquire().await.unwrap();
    assert_eq!(pool.room().await, 0);
    drop(orphan);
    let deadline = Instant::now() + Duration::from_secs(20);
    while pool.stats().await.destroyed == destroyed || pool.room().await != 1 {
        assert!(Instant::now() < deadline, "dropped slot never reclaimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool.release(again).await.unwrap();
    pool.shutdown().await.unwrap();
    assert_nothing_left(&tag);
    assert!(pool.acquire().await.is_err());
}

/// Echo server "as the guest": listens on 169.254.0.21:49983 inside the fake
/// guest namespace, reports each peer address, echoes each connection.
fn start_fake_guest(slot: &Slot) -> mpsc::Receiver<SocketAddr> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (peer_tx, peer_rx) = mpsc::channel();
    let path = slot.guest_netns_path().expect("veth guest link");
    let port = slot.agent_addr().port();
    let _server = spawn_in_netns(&path, move || {
        let listener = match TcpListener::bind((GUEST_ADDR, port)) {
            Ok(l) => l,
            Err(e) => {
                let _ = ready_tx.send(Err(e.to_string()));
                return;
            }
        };
        let _ = ready_tx.send(Ok(()));
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            if let Ok(peer) = conn.peer_addr() {
                let _ = peer_tx.send(peer);
            }
            let mut buf = [0u8; 64];
            if let Ok(n) = conn.read(&mut buf) {
                let _ = conn.write_all(&buf[..n]);
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("fake guest thread answered")
        .expect("fake guest listening");
    peer_rx
}

fn echo(slot: &Slot, msg: &[u8]) -> Vec<u8> {
    let addr = SocketAddr::from(slot.agent_addr());
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(msg).unwrap();
    let mut got = vec![0u8; msg.len()];
    conn.read_exact(&mut got).unwrap();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_reaches_guest_agent_through_slot_address() {
    if let Some(reason) = skip_reason() {
        assert!(
            !must_run(),
            "host_reaches_guest_agent_through_slot_address cannot run: {reason}"
        );
        eprintln!("skipping host_reaches_guest_agent_through_slot_address: {reason}");
        return;
    }
    let tag_str = unique_tag(2);
    let tag = Tag::new(&tag_str).unwrap();
    let _guard = Guard {
        tag: tag.clone(),
        capacity: 4,
        extra_netns: Vec::new(),
    };
    let pool = SlotPool::new(NetConfig {
        tag: tag_str.clone(),
        subnet: test_subnet(&tag_str, 2),
        capacity: 4,
        warm: 1,
        guest_link: GuestLink::Veth,
        ..NetConfig::default()
    })
    .unwrap();
    pool.start().await.unwrap();
    let a = pool.acquire().await.unwrap();
    let b = pool.acquire().await.unwrap();
    assert_slot_plumbing(&a);
    assert_slot_plumbing(&b);

    // Host -> slot address:49983 -> DNAT -> guest 169.254.0.21, no SNAT on
    // the way in: the guest sees the host veth address as the peer.
    let peers = start_fake_guest(&b);
    assert_eq!(echo(&b, b"ping"), b"ping");
    let peer = peers.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(peer.ip(), std::net::IpAddr::V4(b.host_addr));

    // Denying egress keeps replies to host-initiated connections.
    let deny = EgressPolicy::internet(false);
    assert_eq!(b.apply_policy(&deny).await.unwrap(), PolicyUpdate::Applied);
    assert_eq!(echo(&b, b"again"), b"again");

    // The slot without a guest listener refuses (nothing leaks to b's guest).
    let a_addr = SocketAddr::from(a.agent_addr());
    assert!(TcpStream::connect_timeout(&a_addr, Duration::from_secs(2)).is_err());

    // A guest cannot open connections to the host itself (root input chain).
    let host_listener = TcpListener::bind((b.host_addr, 0)).unwrap();
    let host_port = host_listener.local_addr().unwrap().port();
    let target = SocketAddr::from((b.host_addr, host_port));
    let guest_path = b.guest_netns_path().unwrap();
    let attempt = spawn_in_netns(&guest_path, move || {
        TcpStream::connect_timeout(&target, Duration::from_millis(700)).map(drop)
    })
    .join()
    .unwrap()
    .unwrap();
    assert!(attempt.is_err(), "guest reached a host socket");

    pool.release(a).await.unwrap();
    pool.release(b).await.unwrap();
    pool.shutdown().await.unwrap();
    assert_nothing_left(&tag);
}
