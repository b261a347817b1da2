//! What a hostile guest can make the NFS server allocate: the attacks of
//! the security review's H3, sent over real TCP to a real export, with
//! this process's peak resident memory read around each (the export runs
//! in this process). After each, a well-formed call on a fresh connection
//! must still be answered.
//!
//! The tests take turns (one lock): they measure the same process.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::*;
use siesta_volume::nfs::NfsLimits;

/// What an attack may add to the peak: far below what any of them cost
/// before (2 GiB per record mark, 16 GiB per gid count, 4 GiB per READ).
const MODEST: u64 = 64 << 20;

static TURN: Mutex<()> = Mutex::new(());

/// Runs `attack` and returns how far it raised the resident peak.
fn peak_growth(attack: impl FnOnce()) -> u64 {
    reset_peak();
    let (before, _) = memory();
    attack();
    let (_, peak) = memory();
    let grew = peak.saturating_sub(before);
    eprintln!("resident peak grew by {} KiB", grew >> 10);
    grew
}

/// Fails unless `served` still answers a NULL and a GETATTR of its root on
/// a new connection. A connection refused for the cap may still be
/// closing: a few tries, within PATIENCE.
fn still_serves(served: &Served) {
    let give_up = std::time::Instant::now() + PATIENCE;
    loop {
        let mut c = served.client();
        if c.null_works() {
            let root = c.mount_root();
            assert_eq!(c.getattr(&root), (0, 2), "GETATTR of the root");
            return;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the export stopped answering"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn record_marks_of_2_gib_cost_nothing() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::new(64, NfsLimits::default());
    let grew = peak_growth(|| {
        let mut conns: Vec<Client> = (0..4).map(|_| served.client()).collect();
        for c in &mut conns {
            c.send(&[0x7f, 0xff, 0xff, 0xff]).unwrap();
        }
        for c in &mut conns {
            assert!(c.closed_by_server(), "a 2 GiB record is refused");
        }
        // The same, announced as the last fragment, after a little data.
        let mut c = served.client();
        c.send(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1]).unwrap();
        assert!(c.closed_by_server());
    });
    assert!(grew < MODEST, "peak grew by {grew} bytes");
    still_serves(&served);
}

#[test]
fn too_many_fragments_are_refused() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::new(64, NfsLimits::default());
    let mut c = served.client();
    // Empty fragments, none of them the last: no data, no end.
    for _ in 0..64 {
        if c.send(&[0, 0, 0, 0]).is_err() {
            break;
        }
    }
    assert!(c.closed_by_server());
    still_serves(&served);
}

#[test]
fn a_gid_count_of_4_billion_is_refused_as_bad_credentials() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::new(64, NfsLimits::default());
    let mut c = served.client();
    let grew = peak_growth(|| {
        c.send(&call(7, NFS, 3, 0, &auth_unix(0xffff_ffff, 0), &[]))
            .unwrap();
        match c.receive().unwrap() {
            // MSG_DENIED, AUTH_ERROR, AUTH_BADCRED.
            Reply::Denied {
                xid: 7,
                stat: 1,
                detail: 1,
            } => {}
            other => panic!("{other:?}"),
        }
        // RFC 5531's limit is 16; 17 is refused, 16 served.
        c.send(&call(8, NFS, 3, 0, &auth_unix(17, 17), &[]))
            .unwrap();
        assert!(matches!(c.receive().unwrap(), Reply::Denied { xid: 8, .. }));
        c.send(&call(9, NFS, 3, 0, &auth_unix(16, 16), &[]))
            .unwrap();
        assert!(matches!(
            c.receive().unwrap(),
            Reply::Accepted {
                xid: 9,
                stat: 0,
                ..
            }
        ));
    });
    assert!(grew < MODEST, "peak grew by {grew} bytes");
    // The connection that sent them is still served too.
    assert!(c.null_works());
    still_serves(&served);
}

#[test]
fn huge_opaque_lengths_are_garbage_args() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::new(64, NfsLimits::default());
    let mut c = served.client();
    let root = c.mount_root();
    let attacks: Vec<(u32, u32, Vec<u8>)> = vec![
        // GETATTR with a handle of 4 GiB.
        (NFS, 1, Xdr::default().u32(0xffff_ffff).0),
        // LOOKUP with a name of 4 GiB.
        (NFS, 3, Xdr::default().opaque(&root).u32(0xffff_fff0).0),
        // SYMLINK with a target of 2 GiB.
        (
            NFS,
            10,
            Xdr::default()
                .opaque(&root)
                .opaque(b"l")
                .bytes(&[0; 24])
                .u32(0x7fff_ffff)
                .0,
        ),
        // WRITE with 4 GiB of data.
        (
            NFS,
            7,
            Xdr::default()
                .opaque(&root)
                .u64(0)
                .u32(0xffff_ffff)
                .u32(2)
                .u32(0xffff_ffff)
                .0,
        ),
        // MOUNT with a path of 4 GiB.
        (MOUNT, 1, Xdr::default().u32(0xffff_ffff).0),
    ];
    let grew = peak_growth(|| {
        for (prog, proc, args) in &attacks {
            match c.call(*prog, 3, *proc, args) {
                // GARBAGE_ARGS.
                Reply::Accepted { stat: 4, .. } => {}
                other => panic!("program {prog} procedure {proc}: {other:?}"),
            }
        }
    });
    assert!(grew < MODEST, "peak grew by {grew} bytes");
    still_serves(&served);
}

#[test]
fn a_read_of_4_gib_gets_one_mib() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::new(64, NfsLimits::default());
    std::fs::write(served.data().join("big"), vec![7u8; 3 << 20]).unwrap();
    let mut c = served.client();
    let root = c.mount_root();
    let fh = c.lookup(&root, "big");
    let grew = peak_growth(|| {
        let args = Xdr::default().opaque(&fh).u64(0).u32(0xffff_ffff);
        let (status, rest) = c.nfs(6, &args.0);
        assert_eq!(status, 0);
        // post_op_attr (1 + 21 words of fattr3), count, eof, data.
        let count = u32::from_be_bytes(rest[88..92].try_into().unwrap());
        assert_eq!(count, 1 << 20);
    });
    assert!(grew < MODEST, "peak grew by {grew} bytes");
    still_serves(&served);
}

#[test]
fn reads_never_taken_are_not_queued_without_bound() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::new(64, NfsLimits::default());
    std::fs::write(served.data().join("big"), vec![7u8; 1 << 20]).unwrap();
    let mut c = served.client();
    let root = c.mount_root();
    let fh = c.lookup(&root, "big");
    const CALLS: u32 = 512;
    let grew = peak_growth(|| {
        // 512 reads of 1 MiB sent before any reply is read: the server may
        // hold a window of them, not 512 MiB of replies.
        let args = Xdr::default().opaque(&fh).u64(0).u32(1 << 20);
        let mut all = Vec::new();
        for xid in 0..CALLS {
            all.extend(call(1000 + xid, NFS, 3, 6, &auth_null(), &args.0));
        }
        c.send(&all).unwrap();
        for _ in 0..CALLS {
            assert!(matches!(
                c.receive().unwrap(),
                Reply::Accepted { stat: 0, .. }
            ));
        }
    });
    assert!(grew < MODEST, "peak grew by {grew} bytes");
    still_serves(&served);
}

#[test]
fn connections_past_the_cap_are_closed() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let limits = NfsLimits::default();
    let served = Served::new(64, limits.clone());
    let grew = peak_growth(|| {
        let mut conns: Vec<Client> = (0..limits.max_connections + 4)
            .map(|_| served.client())
            .collect();
        let answered = conns
            .iter_mut()
            .filter_map(|c| c.null_works().then_some(()))
            .count();
        assert_eq!(answered, limits.max_connections);
    });
    assert!(grew < MODEST, "peak grew by {grew} bytes");
    still_serves(&served);
}

#[test]
fn stalled_records_and_idle_connections_are_closed() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::new(
        64,
        NfsLimits {
            idle_timeout: Duration::from_secs(1),
            record_timeout: Duration::from_secs(1),
            ..NfsLimits::default()
        },
    );
    // A mark for 1 MiB, a few bytes of it, then nothing.
    let mut stalled = served.client();
    stalled.send(&[0x80, 0x10, 0, 0, 1, 2, 3]).unwrap();
    // Nothing at all.
    let mut idle = served.client();
    assert!(stalled.closed_by_server(), "a stalled record is dropped");
    assert!(idle.closed_by_server(), "an idle connection is closed");
    still_serves(&served);
}

#[test]
fn a_whole_session_works_through_the_guard() {
    if !need_root() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::new(64, NfsLimits::default());
    let mut c = served.client();
    let root = c.mount_root();
    assert_eq!(c.mkdir(&root, "dir"), 0);
    let dir = c.lookup(&root, "dir");
    assert_eq!(c.getattr(&dir), (0, 2));
    // CREATE (UNCHECKED, no attributes), WRITE, READ back.
    let args = Xdr::default()
        .opaque(&dir)
        .opaque(b"f")
        .u32(0)
        .bytes(&[0; 24]);
    assert_eq!(c.nfs(8, &args.0).0, 0);
    let f = c.lookup(&dir, "f");
    let data = vec![9u8; 300_000];
    let args = Xdr::default()
        .opaque(&f)
        .u64(0)
        .u32(data.len() as u32)
        .u32(2)
        .opaque(&data);
    assert_eq!(c.nfs(7, &args.0).0, 0);
    assert_eq!(
        std::fs::read(served.data().join("dir/f")).unwrap(),
        data,
        "written through the guard"
    );
    let (status, rest) = c.nfs(6, &Xdr::default().opaque(&f).u64(0).u32(1 << 20).0);
    assert_eq!(status, 0);
    // post_op_attr (88 bytes), count, eof, then the data opaque.
    assert_eq!(&rest[100..100 + data.len()], &data[..]);
}
