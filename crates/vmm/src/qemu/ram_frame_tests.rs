use super::*;

const SID: u32 = 2;
const MEM_LEN: u64 = 8 * PAGE_SIZE as u64;
const ROM_LEN: u64 = 2 * PAGE_SIZE as u64;

fn name(v: &mut Vec<u8>, s: &str) {
    v.push(s.len() as u8);
    v.extend_from_slice(s.as_bytes());
}

fn be32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_be_bytes());
}

fn be64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_be_bytes());
}

fn footer(v: &mut Vec<u8>) {
    v.push(SECTION_FOOTER);
    be32(v, SID);
}

/// A template's stream as QEMU 7.2 writes it with x-ignore-shared: block
/// list, the ROM's pages (one named, one CONTINUE), device sections, EOF.
fn template_stream(caps: &[&str]) -> Vec<u8> {
    let mut v = b"QEVM\0\0\0\x03".to_vec();
    v.push(0x07);
    be32(&mut v, 10);
    v.extend_from_slice(b"pc-q35-7.2");
    v.push(0x05);
    name(&mut v, "configuration/capabilities");
    be32(&mut v, 1);
    be32(&mut v, caps.len() as u32);
    for c in caps {
        name(&mut v, c);
    }
    v.push(SECTION_START);
    be32(&mut v, SID);
    name(&mut v, "ram");
    be32(&mut v, 0);
    be32(&mut v, RAM_VERSION);
    be64(&mut v, (MEM_LEN + ROM_LEN) | FLAG_MEM_SIZE);
    for (block, len, gpa) in [("mem", MEM_LEN, 0u64), ("pc.rom", ROM_LEN, 0xc0000)] {
        name(&mut v, block);
        be64(&mut v, len);
        be64(&mut v, gpa);
    }
    be64(&mut v, FLAG_EOS);
    footer(&mut v);
    v.push(SECTION_PART);
    be32(&mut v, SID);
    be64(&mut v, FLAG_PAGE);
    name(&mut v, "pc.rom");
    v.extend_from_slice(&[0xab; PAGE_SIZE]);
    be64(&mut v, PAGE_SIZE as u64 | FLAG_ZERO | FLAG_CONTINUE);
    v.push(0);
    be64(&mut v, FLAG_EOS);
    footer(&mut v);
    v.push(SECTION_END);
    be32(&mut v, SID);
    be64(&mut v, FLAG_EOS);
    footer(&mut v);
    // A device section (not read) and EOF.
    v.extend_from_slice(&[0x04, 0, 0, 0, 3, 3, b'c', b'p', b'u', 0, 0, 0, 0]);
    v.push(VM_EOF);
    v
}

fn devices() -> Vec<u8> {
    let mut v = STREAM_OPENING.to_vec();
    v.extend_from_slice(&[
        0x04, 0, 0, 0, 3, 3, b'c', b'p', b'u', 0, 0, 0, 0, 0x7e, 0, 0, 0, 3,
    ]);
    v.push(VM_EOF);
    v
}

#[test]
fn reads_the_frame_of_a_template_stream() {
    let s = template_stream(&["x-ignore-shared"]);
    let f = RamFrame::parse(&s, "mem").unwrap();
    assert_eq!(f.memory_len(), MEM_LEN);
    assert_eq!(f.section_id, SID);
    assert_eq!(f.small_pages.len(), 2);
    assert_eq!(f.small_pages[1].block, "pc.rom", "CONTINUE keeps the block");
    assert_eq!(f.small_pages[1].data, PageData::Fill(0));
    assert!(f.prefix.ends_with(&[SECTION_FOOTER, 0, 0, 0, 2]));
}

#[test]
fn refuses_streams_that_are_not_a_templates() {
    let full = template_stream(&[]);
    assert!(RamFrame::parse(&full, "mem")
        .unwrap_err()
        .contains("x-ignore-shared"));
    let s = template_stream(&["x-ignore-shared"]);
    assert!(RamFrame::parse(&s, "ram0")
        .unwrap_err()
        .contains("no RAM block"));
    assert!(RamFrame::parse(&s[..s.len() / 2], "mem")
        .unwrap_err()
        .contains("truncated"));
}

#[test]
fn writes_changed_pages_then_the_frame_then_devices() {
    let s = template_stream(&["x-ignore-shared"]);
    let f = RamFrame::parse(&s, "mem").unwrap();
    let mut w = f.begin(Vec::new()).unwrap();
    w.append_pages(&[0, 3 * PAGE_SIZE as u64], |slots| {
        slots[0].fill(7);
        slots[1].fill(0);
        Ok(())
    })
    .unwrap();
    let none = |_: &mut [IoSliceMut<'_>]| -> io::Result<()> { panic!("no read for bad offsets") };
    let past = w.append_pages(&[MEM_LEN], none).unwrap_err();
    assert_eq!(past.kind(), io::ErrorKind::InvalidInput, "past the block");
    assert!(w.append_pages(&[1], none).is_err(), "unaligned");
    assert_eq!(w.pages(), 2);
    let out = w.finish(&devices()).unwrap();

    // Read it back as QEMU would: prefix, then PART with every page, END.
    assert!(out.starts_with(&f.prefix));
    let mut r = Reader::new(&out);
    r.pos = f.prefix.len();
    assert_eq!(r.u8().unwrap(), SECTION_PART);
    assert_eq!(r.be32().unwrap(), SID);
    let mut body = RamBody::default();
    body.read(&mut r).unwrap();
    read_footer(&mut r, SID).unwrap();
    let got: Vec<(&str, u64)> = body
        .pages
        .iter()
        .map(|p| (p.block.as_str(), p.offset))
        .collect();
    assert_eq!(
        got,
        [
            ("mem", 0),
            ("mem", 3 * PAGE_SIZE as u64),
            ("pc.rom", 0),
            ("pc.rom", PAGE_SIZE as u64)
        ]
    );
    assert_eq!(body.pages[0].data, PageData::Bytes(vec![7; PAGE_SIZE]));
    assert_eq!(body.pages[1].data, PageData::Fill(0), "zero page as ZERO");
    assert_eq!(r.u8().unwrap(), SECTION_END);
    assert_eq!(r.be32().unwrap(), SID);
    body.read(&mut r).unwrap();
    read_footer(&mut r, SID).unwrap();
    let rest = &out[r.pos..];
    assert_eq!(&rest[..rest.len() - 7], &devices()[8..]);
    assert_eq!(&rest[rest.len() - 7..], b"\x06\0\0\0\x02{}");
}

/// Batches in place give the same records as QEMU's layout: zero pages
/// anywhere in a batch (first, between, last) become ZERO records and the
/// pages after them move down intact; only the stream's first record names
/// the block, in any batch.
#[test]
fn batches_frame_zero_and_data_pages_in_place() {
    let s = template_stream(&["x-ignore-shared"]);
    let f = RamFrame::parse(&s, "mem").unwrap();
    let mut w = f.begin(Vec::new()).unwrap();
    let fills: [u8; 8] = [0, 5, 0, 0, 6, 7, 0, 8];
    let offsets: Vec<u64> = (0..8u64).map(|p| p * PAGE_SIZE as u64).collect();
    for (batch, fill) in offsets.chunks(3).zip(fills.chunks(3)) {
        w.append_pages(batch, |slots| {
            for (slot, &b) in slots.iter_mut().zip(fill) {
                slot.fill(b);
                // One byte set at the end, so a page moved by one byte short shows.
                slot[PAGE_SIZE - 1] = b;
            }
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(w.pages(), 8);
    let out = w.finish(&devices()).unwrap();
    let mut r = Reader::new(&out);
    r.pos = f.prefix.len() + 5;
    let mut body = RamBody::default();
    body.read(&mut r).unwrap();
    let mem: Vec<&PageRecord> = body.pages.iter().filter(|p| p.block == "mem").collect();
    assert_eq!(mem.len(), 8);
    for (i, (p, &b)) in mem.iter().zip(&fills).enumerate() {
        assert_eq!(p.offset, offsets[i]);
        let want = if b == 0 {
            PageData::Fill(0)
        } else {
            PageData::Bytes(vec![b; PAGE_SIZE])
        };
        assert_eq!(p.data, want, "page {i}");
    }
    let named = out[f.prefix.len()..]
        .windows(4)
        .filter(|w| w == b"\x03mem")
        .count();
    assert_eq!(named, 1, "the block is named once");
}

/// A read that fails writes nothing.
#[test]
fn a_failed_read_leaves_no_partial_records() {
    let s = template_stream(&["x-ignore-shared"]);
    let f = RamFrame::parse(&s, "mem").unwrap();
    let mut w = f.begin(Vec::new()).unwrap();
    let e = w
        .append_pages(&[0], |_| Err(io::Error::other("gone")))
        .unwrap_err();
    assert_eq!(e.to_string(), "gone");
    assert_eq!(w.pages(), 0);
    let out = w.finish(&devices()).unwrap();
    assert!(
        !out[f.prefix.len()..].windows(4).any(|w| w == b"\x03mem"),
        "no record of the failed batch"
    );
}

#[test]
fn refuses_device_state_that_is_not_a_stream() {
    let s = template_stream(&["x-ignore-shared"]);
    let f = RamFrame::parse(&s, "mem").unwrap();
    let w = f.begin(Vec::new()).unwrap();
    let e = w.finish(b"garbage").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    let mut cut = devices();
    cut.pop();
    let w = f.begin(Vec::new()).unwrap();
    assert!(w.finish(&cut).unwrap_err().to_string().contains("EOF"));
}

mod hostile {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// A template stream with any byte changed or cut is read or
        /// refused, never a panic.
        #[test]
        fn a_damaged_template_stream_never_panics(at in 0usize..4400, byte in any::<u8>(), cut in 0usize..4500) {
            let mut s = template_stream(&["x-ignore-shared"]);
            let at = at % s.len();
            s[at] = byte;
            s.truncate(cut.min(s.len()));
            let _ = RamFrame::parse(&s, "mem");
        }
    }
}
