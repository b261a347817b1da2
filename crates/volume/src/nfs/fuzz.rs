//! Hostile bytes into the record framing and the call checks: nothing
//! panics, and what is allocated follows the bytes that arrived, never a
//! length they claim. And for every call the checks let through,
//! `nfsserve`'s own XDR decoders (its public ones, for the same fields)
//! allocate no more than the message holds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Cursor;

use nfsserve::nfs::{diropargs3, nfs_fh3, symlinkdata3};
use nfsserve::xdr::XDR;
use proptest::prelude::*;

use super::call::{check_call, Call};
use super::record::{mark, read_record, MAX_RECORD};

/// Counts heap bytes per thread, so that a test (on a thread of its own)
/// can bound what one call allocated.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(n: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + n;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(n: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(n)));
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// counters only read sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        shrank(layout.size());
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, size);
        if !q.is_null() {
            shrank(layout.size());
            grew(size);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `f`'s result and the most it had allocated at once on this thread.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

/// A word that is often a length no message could hold.
fn word() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..64,
        0u32..2048,
        Just(0xffff_ffff),
        Just(0x7fff_ffff),
        Just(0x8000_0000),
        any::<u32>(),
    ]
}

/// A field of a message: a word, or an opaque whose length may lie.
#[derive(Debug, Clone)]
enum Field {
    Word(u32),
    Opaque(Option<u32>, Vec<u8>),
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        word().prop_map(Field::Word),
        (
            proptest::option::weighted(0.3, word()),
            proptest::collection::vec(any::<u8>(), 0..80)
        )
            .prop_map(|(len, data)| Field::Opaque(len, data)),
    ]
}

fn encode(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        match f {
            Field::Word(w) => out.extend_from_slice(&w.to_be_bytes()),
            Field::Opaque(len, data) => {
                let len = len.unwrap_or(data.len() as u32);
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(data);
                out.resize(out.len().next_multiple_of(4), 0);
            }
        }
    }
}

/// A call, mostly well formed where it matters: known programs and
/// procedures, AUTH_UNIX credentials, lengths that are often true.
fn call_message() -> impl Strategy<Value = Vec<u8>> {
    let head = (
        any::<u32>(),
        prop_oneof![Just(0u32), word()],
        prop_oneof![Just(2u32), word()],
        prop_oneof![Just(100_003u32), Just(100_005), Just(100_000), word()],
        prop_oneof![Just(3u32), word()],
        prop_oneof![0u32..23, word()],
    );
    let cred = (
        prop_oneof![Just(1u32), Just(0), word()],
        proptest::option::weighted(0.2, word()),
        proptest::collection::vec(field(), 0..8),
    );
    let args = proptest::collection::vec(field(), 0..12);
    (head, cred, args).prop_map(|(h, (flavor, body_len, body), args)| {
        let mut out = Vec::new();
        for w in [h.0, h.1, h.2, h.3, h.4, h.5, flavor] {
            out.extend_from_slice(&w.to_be_bytes());
        }
        let mut cred = Vec::new();
        encode(&body, &mut cred);
        encode(&[Field::Opaque(body_len, cred)], &mut out);
        out.extend_from_slice(&[0; 8]);
        encode(&args, &mut out);
        out
    })
}

/// Decodes `msg` (which [`check_call`] let through as `call`) with
/// nfsserve's own decoders for the fields it would read.
fn decode_as_nfsserve(msg: &[u8], call: &Call) {
    let mut r = Cursor::new(msg);
    r.set_position(24);
    let (mut flavor, mut body) = (0u32, Vec::<u8>::new());
    flavor.deserialize(&mut r).unwrap();
    body.deserialize(&mut r).unwrap();
    if flavor == 1 {
        // auth_unix: stamp, machine name, uid, gid, gids.
        let mut b = Cursor::new(&body[..]);
        let (mut w, mut name, mut gids) = (0u32, Vec::<u8>::new(), Vec::<u32>::new());
        let _ = w
            .deserialize(&mut b)
            .and_then(|_| name.deserialize(&mut b))
            .and_then(|_| w.deserialize(&mut b))
            .and_then(|_| w.deserialize(&mut b))
            .and_then(|_| gids.deserialize(&mut b));
    }
    let (mut verf_flavor, mut verf) = (0u32, Vec::<u8>::new());
    verf_flavor.deserialize(&mut r).unwrap();
    verf.deserialize(&mut r).unwrap();
    assert_eq!(
        r.position() as usize,
        call.args,
        "arguments start where checked"
    );
    // nfsserve reads no arguments of another RPC or NFS version.
    let rpcvers = u32::from_be_bytes([msg[8], msg[9], msg[10], msg[11]]);
    if rpcvers != 2 || (call.prog == 100_003 && call.vers != 3) {
        return;
    }
    // Errors are fine (a short message); allocations are what is bounded.
    let _ = match (call.prog, call.proc) {
        (100_003, 1 | 2 | 4 | 5 | 6 | 18 | 19 | 20) => nfs_fh3::default().deserialize(&mut r),
        (100_003, 3 | 8 | 9 | 12 | 13) => diropargs3::default().deserialize(&mut r),
        (100_003, 14) => diropargs3::default()
            .deserialize(&mut r)
            .and_then(|_| diropargs3::default().deserialize(&mut r)),
        (100_003, 10) => diropargs3::default()
            .deserialize(&mut r)
            .and_then(|_| symlinkdata3::default().deserialize(&mut r)),
        (100_003, 7) => {
            let (mut fh, mut fixed, mut data) = (nfs_fh3::default(), [0u8; 16], Vec::<u8>::new());
            fh.deserialize(&mut r)
                .and_then(|_| fixed.deserialize(&mut r))
                .and_then(|_| data.deserialize(&mut r))
        }
        (100_005, 1 | 3) => Vec::<u8>::new().deserialize(&mut r),
        _ => Ok(()),
    };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Records of any marks and bytes: each read allocates at most about
    /// twice what arrived, and a record read whole is within the bound.
    #[test]
    fn framing_allocates_what_arrived(
        parts in proptest::collection::vec((word(), proptest::collection::vec(any::<u8>(), 0..300)), 0..12),
        tail in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut input = Vec::new();
        for (m, data) in &parts {
            input.extend_from_slice(&m.to_be_bytes());
            input.extend_from_slice(data);
        }
        input.extend_from_slice(&tail);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        // The runtime's own first allocations are not the framing's.
        rt.block_on(async {});
        let mut src = &input[..];
        let mut buf = Vec::new();
        loop {
            let before = src.len();
            let (result, peak) = peak_of(|| rt.block_on(read_record(&mut src, &mut buf)));
            let arrived = before - src.len();
            // Twice what arrived (a Vec doubles) and a little: never the
            // up to 2 GiB the marks announce.
            prop_assert!(peak <= 2 * (arrived + 4) + 1024, "{peak} bytes for {arrived}");
            match result {
                Ok(true) => {
                    let len = buf.len() - 4;
                    prop_assert!(len <= MAX_RECORD);
                    prop_assert_eq!(&buf[..4], &mark(len as u32)[..]);
                }
                Ok(false) | Err(_) => break,
            }
        }
    }

    /// Any bytes at all: the checks neither panic nor allocate.
    #[test]
    fn checks_take_any_bytes(mut msg in proptest::collection::vec(any::<u8>(), 0..512)) {
        let (_, peak) = peak_of(|| check_call(&mut msg));
        prop_assert_eq!(peak, 0);
    }

    /// Calls shaped like real ones: those let through decode in nfsserve
    /// within the message's own size.
    #[test]
    fn what_passes_decodes_within_its_size(mut msg in call_message()) {
        let (checked, peak) = peak_of(|| check_call(&mut msg));
        prop_assert_eq!(peak, 0);
        if let Ok(call) = checked {
            let ((), peak) = peak_of(|| decode_as_nfsserve(&msg, &call));
            prop_assert!(peak <= msg.len() + 64, "{peak} bytes for a {}-byte call", msg.len());
        }
    }
}
