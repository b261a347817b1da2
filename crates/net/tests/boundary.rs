//! The node's guest boundary, attacked with real packets (needs root).
//!
//! Two instances (two tags, two subnets) with fake guests in namespaces of
//! their own, and an "outside" namespace the test makes, routed from the
//! host: a fake cloud metadata service on 169.254.169.254, a LAN host in
//! private space, a CGNAT host, and a public-range host (198.19.N.2, the
//! benchmarking range) that stands for the internet and shows the method
//! works. A host port is published with DNAT to that public host, as
//! Docker's `-p` does. From instance A's guest every way out that the root
//! table must stop is tried at once: the metadata service, the LAN, CGNAT,
//! the DNATed port, the other instance's guest, A's own sibling, and
//! packets with a forged source address or MAC. Only the public host may
//! answer, and then only to the guest's own address.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use common::{must_run, ok, sh, skip_reason, test_subnet, unique_tag, Guard};
use siesta_net::layout::GUEST_ADDR;
use siesta_net::{spawn_in_netns, EgressPolicy, GuestLink, NetConfig, Slot, SlotPool, Tag};

const PORT: u16 = 8080;
/// The port the host publishes through DNAT.
const PUBLISHED: u16 = 18080;
const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// The outside world of this test, removed by exact names on drop.
struct Outside {
    ns: String,
    host_if: String,
    routes: Vec<String>,
    dnat_table: String,
    n: u8,
}

impl Outside {
    fn public(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.n, 2)
    }
    fn host_side(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.n, 1)
    }
    fn lan(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.n, 2)
    }
    fn cgnat(&self) -> Ipv4Addr {
        Ipv4Addr::new(100, 64, self.n, 2)
    }
    fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.ns)
    }

    fn create(n: u8, tag: &str) -> Self {
        Outside {
            ns: format!("siesta-out-{tag}"),
            host_if: format!("vout{tag}"),
            routes: Vec::new(),
            dnat_table: format!("siesta-dnat-{tag}"),
            n,
        }
    }

    fn build(&mut self) {
        let (ns, host_if) = (self.ns.clone(), self.host_if.clone());
        ok(&["ip", "netns", "add", &ns]);
        ok(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", "out0", "netns", &ns,
        ]);
        ok(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.host_side()),
            "dev",
            &host_if,
        ]);
        ok(&["ip", "link", "set", &host_if, "up"]);
        for a in [self.public(), self.lan(), self.cgnat(), METADATA] {
            ok(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{a}/32"),
                "dev",
                "out0",
            ]);
        }
        ok(&["ip", "-n", &ns, "link", "set", "out0", "up"]);
        ok(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        ok(&[
            "ip",
            "-n",
            &ns,
            "route",
            "add",
            &format!("{}/32", self.host_side()),
            "dev",
            "out0",
        ]);
        ok(&[
            "ip",
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &self.host_side().to_string(),
        ]);
        for a in [self.lan(), self.cgnat(), METADATA] {
            let route = format!("{a}/32");
            ok(&[
                "ip",
                "route",
                "add",
                &route,
                "via",
                &self.public().to_string(),
                "dev",
                &host_if,
            ]);
            self.routes.push(route);
            // Only addresses of this machine's own test hosts are tried.
            let via = ok(&["ip", "route", "get", &a.to_string()]);
            assert!(
                via.contains(&format!("dev {host_if}")),
                "{a} routes elsewhere: {via}"
            );
        }
        // A host port published to the public host, as `docker run -p` does.
        let script = format!(
            "table ip {t} {{\n chain prerouting {{\n  type nat hook prerouting priority dstnat;\n  \
             ip daddr {h} tcp dport {PUBLISHED} dnat to {p}:{PORT}\n }}\n}}\n",
            t = self.dnat_table,
            h = self.host_side(),
            p = self.public(),
        );
        nft(&script);
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        for r in &self.routes {
            sh(&["ip", "route", "del", r]);
        }
        sh(&["ip", "link", "del", &self.host_if]);
        if self.path().exists() {
            sh(&["ip", "netns", "del", &self.ns]);
        }
        nft(&format!(
            "table ip {t}\ndelete table ip {t}\n",
            t = self.dnat_table
        ));
    }
}

fn nft(script: &str) {
    use std::process::{Command, Stdio};
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft runs");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(script.as_bytes());
    }
    let _ = child.wait();
}

/// TCP listeners on every outside address, and a UDP socket on the public
/// one; every peer they see is reported.
fn start_outside_servers(o: &Outside) -> mpsc::Receiver<(String, SocketAddr)> {
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    for a in [o.public(), o.lan(), o.cgnat(), METADATA] {
        let (tx, ready_tx) = (tx.clone(), ready_tx.clone());
        let _detached = spawn_in_netns(&o.path(), move || {
            let l = TcpListener::bind((a, PORT)).expect("outside listener");
            let _ = ready_tx.send(());
            for conn in l.incoming().flatten() {
                if let Ok(peer) = conn.peer_addr() {
                    let _ = tx.send((format!("tcp {a}"), peer));
                }
            }
        });
    }
    let public = o.public();
    let _detached = spawn_in_netns(&o.path(), move || {
        let s = UdpSocket::bind((public, PORT)).expect("outside udp");
        let _ = ready_tx.send(());
        let mut buf = [0u8; 64];
        while let Ok((len, peer)) = s.recv_from(&mut buf) {
            let what = format!("udp {}", String::from_utf8_lossy(&buf[..len]));
            let _ = tx.send((what, peer));
        }
    });
    for _ in 0..5 {
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("outside servers listening");
    }
    rx
}

/// Connects from inside the guest namespace of `slot`; `Ok` if the peer
/// accepted within 2 s.
fn try_connect(slot: &Slot, to: SocketAddrV4) -> std::thread::JoinHandle<std::io::Result<bool>> {
    let path = slot.guest_netns_path().expect("veth guest");
    spawn_in_netns(&path, move || {
        TcpStream::connect_timeout(&to.into(), Duration::from_secs(2)).is_ok()
    })
}

/// A fake guest that answers on 169.254.0.21:PORT (the "other instance's
/// build VM").
fn start_guest_listener(slot: &Slot) {
    let path = slot.guest_netns_path().expect("veth guest");
    let (ready_tx, ready_rx) = mpsc::channel();
    let _detached = spawn_in_netns(&path, move || {
        let l = TcpListener::bind((GUEST_ADDR, PORT)).expect("guest listener");
        let _ = ready_tx.send(());
        for mut conn in l.incoming().flatten() {
            let _ = conn.write_all(b"agent");
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("guest listening");
}

fn pool(tag: &str, salt: u8) -> SlotPool {
    SlotPool::new(NetConfig {
        tag: tag.to_string(),
        subnet: test_subnet(tag, salt),
        // Room for a refill in flight beside the two slots handed out.
        capacity: 4,
        warm: 1,
        guest_link: GuestLink::Veth,
        ..NetConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_reaches_the_internet_and_nothing_of_the_node() {
    if let Some(reason) = skip_reason() {
        assert!(!must_run(), "boundary test cannot run: {reason}");
        eprintln!("skipping boundary test: {reason}");
        return;
    }
    let (ta, tb) = (unique_tag(11), unique_tag(12));
    let _guards = [&ta, &tb].map(|t| Guard {
        tag: Tag::new(t).unwrap(),
        capacity: 4,
        extra_netns: Vec::new(),
    });
    let n = 100 + (std::process::id() % 100) as u8;
    let mut outside = Outside::create(n, &ta);
    outside.build();
    let seen = start_outside_servers(&outside);

    let (a_pool, b_pool) = (pool(&ta, 3), pool(&tb, 0));
    a_pool.start().await.unwrap();
    b_pool.start().await.unwrap();
    let a = a_pool.acquire().await.unwrap();
    let sibling = a_pool.acquire().await.unwrap();
    let b = b_pool.acquire().await.unwrap();
    start_guest_listener(&b);
    start_guest_listener(&sibling);
    // The host reaches the other instance's guest, so it is there to reach.
    let mut conn = TcpStream::connect_timeout(
        &SocketAddrV4::new(b.slot_addr, PORT).into(),
        Duration::from_secs(5),
    )
    .expect("host reaches instance B's guest");
    let mut hello = [0u8; 5];
    conn.read_exact(&mut hello).unwrap();
    assert_eq!(&hello, b"agent");

    let control = try_connect(&a, SocketAddrV4::new(outside.public(), PORT));
    let attacks = [
        ("cloud metadata", SocketAddrV4::new(METADATA, PORT)),
        ("LAN host", SocketAddrV4::new(outside.lan(), PORT)),
        ("CGNAT host", SocketAddrV4::new(outside.cgnat(), PORT)),
        (
            "DNATed host port",
            SocketAddrV4::new(outside.host_side(), PUBLISHED),
        ),
        (
            "other instance's guest",
            SocketAddrV4::new(b.slot_addr, PORT),
        ),
        ("sibling slot", SocketAddrV4::new(sibling.slot_addr, PORT)),
    ];
    let tries: Vec<_> = attacks.iter().map(|(_, to)| try_connect(&a, *to)).collect();
    assert!(
        control.join().unwrap().unwrap(),
        "the guest could not reach the public host"
    );
    let got: Vec<&str> = attacks
        .iter()
        .zip(tries)
        .filter_map(|((what, _), t)| t.join().ok()?.ok()?.then_some(*what))
        .collect();
    assert!(got.is_empty(), "the guest reached: {got:?}");
    // Let anything that got through arrive; only the control connection did.
    std::thread::sleep(Duration::from_millis(300));
    only_the_guest_s_own_arrived(&seen, &outside, &a);

    spoofing_is_dropped(&a, &outside, &seen);
    // A guest's own rules cannot open the node: allowOut everything.
    let open_all = EgressPolicy {
        allow_out: vec!["0.0.0.0/0".parse().unwrap()],
        ..EgressPolicy::default()
    };
    a.apply_policy(&open_all).await.unwrap();
    let again = try_connect(&a, SocketAddrV4::new(METADATA, PORT));
    assert!(
        !again.join().unwrap().unwrap(),
        "allowOut 0.0.0.0/0 opened the metadata service"
    );

    only_the_guest_s_own_arrived(&seen, &outside, &a);
    assert!(ipv6_is_off(&a), "IPv6 is on in slot {}", a.netns_name);
    println!(
        "boundary: {} attacks tried, none got through",
        attacks.len() + 4
    );

    for (p, s) in [(&a_pool, a), (&a_pool, sibling), (&b_pool, b)] {
        p.release(s).await.unwrap();
    }
    a_pool.shutdown().await.unwrap();
    b_pool.shutdown().await.unwrap();
}

/// Everything the outside saw so far came to the public host, from A's
/// slot address.
fn only_the_guest_s_own_arrived(
    seen: &mpsc::Receiver<(String, SocketAddr)>,
    o: &Outside,
    a: &Slot,
) {
    for (what, peer) in seen.try_iter() {
        assert!(
            what == format!("tcp {}", o.public()) || what == "udp own",
            "something arrived at {what} from {peer}"
        );
        assert_eq!(
            peer.ip(),
            std::net::IpAddr::V4(a.slot_addr),
            "{what}: {peer}"
        );
    }
}

/// UDP datagrams from a forged source address and from a forged MAC:
/// neither leaves the slot; the guest's own datagram, sent last, does (so
/// the method works, and arrives after anything forged would have).
fn spoofing_is_dropped(a: &Slot, o: &Outside, seen: &mpsc::Receiver<(String, SocketAddr)>) {
    let gns = a.layout().guest_netns_name.clone();
    ok(&[
        "ip",
        "-n",
        &gns,
        "addr",
        "add",
        "169.254.0.25/32",
        "dev",
        "eth0",
    ]);
    send_udp(a, o, Ipv4Addr::new(169, 254, 0, 25), b"forged-address");
    ok(&[
        "ip",
        "-n",
        &gns,
        "link",
        "set",
        "eth0",
        "address",
        "02:fc:00:00:00:99",
    ]);
    send_udp(a, o, GUEST_ADDR, b"forged-mac");
    ok(&[
        "ip",
        "-n",
        &gns,
        "link",
        "set",
        "eth0",
        "address",
        "02:fc:00:00:00:15",
    ]);
    send_udp(a, o, GUEST_ADDR, b"own");
    let (what, peer) = seen
        .recv_timeout(Duration::from_secs(5))
        .expect("the guest's own datagram");
    assert_eq!(
        (what.as_str(), peer.ip()),
        ("udp own", std::net::IpAddr::V4(a.slot_addr)),
        "the first datagram to arrive"
    );
}

fn send_udp(a: &Slot, o: &Outside, from: Ipv4Addr, payload: &'static [u8]) {
    let to = SocketAddrV4::new(o.public(), PORT);
    let path = a.guest_netns_path().unwrap();
    spawn_in_netns(&path, move || {
        let s = UdpSocket::bind((from, 0)).expect("bind");
        s.send_to(payload, to).expect("send");
    })
    .join()
    .unwrap()
    .unwrap();
}

fn ipv6_is_off(slot: &Slot) -> bool {
    if !Path::new("/proc/sys/net/ipv6").exists() {
        return true; // a kernel without IPv6
    }
    let out = ok(&[
        "ip",
        "netns",
        "exec",
        &slot.netns_name,
        "cat",
        "/proc/sys/net/ipv6/conf/all/disable_ipv6",
    ]);
    let inner = ok(&["ip", "-n", &slot.netns_name, "-6", "addr", "show"]);
    out.trim() == "1" && inner.trim().is_empty()
}
