use super::*;

const PS: u32 = 4096;
const MEM: u64 = 64 * 4096;

fn sample() -> Manifest {
    // Touch order: 10, 11, 3, 12, 4, 40 -> runs [10-11], [3], [12], [4], [40]
    Manifest::from_touch_order(PS, MEM, &[10, 11, 3, 12, 4, 40, 11])
}

fn encoded() -> (Manifest, Vec<u8>, ManifestDescriptor) {
    let m = sample();
    let bytes = m.encode();
    let d = m.descriptor(&bytes);
    (m, bytes, d)
}

/// Re-hashes `bytes` so that only the intended defect is seen.
fn descriptor_for(bytes: &[u8]) -> ManifestDescriptor {
    ManifestDescriptor {
        version: VERSION,
        size: bytes.len() as u64,
        guest_memory_size: MEM,
        sha256: hex::encode(Sha256::digest(bytes)),
    }
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn touch_order_builds_runs_and_merged_ranges() {
    let m = sample();
    let r = |p: u64, n: u64| Range {
        offset: p * 4096,
        len: n * 4096,
    };
    assert_eq!(m.ranges, vec![r(3, 2), r(10, 3), r(40, 1)]);
    assert_eq!(m.runs, vec![r(10, 2), r(3, 1), r(12, 1), r(4, 1), r(40, 1)]);
    assert_eq!(m.total_bytes(), 6 * 4096);
}

#[test]
fn round_trip_and_verify() {
    let (m, bytes, d) = encoded();
    assert_eq!(Manifest::decode(&bytes).unwrap(), m);
    assert_eq!(Manifest::verify(&bytes, &d, MEM).unwrap(), m);
    let empty = Manifest::from_touch_order(PS, MEM, &[]);
    assert_eq!(Manifest::decode(&empty.encode()).unwrap(), empty);
}

#[test]
fn descriptor_failures() {
    let (_, bytes, d) = encoded();
    let big = vec![0u8; MAX_MANIFEST_BYTES as usize + 1];
    assert!(matches!(
        Manifest::verify(&big, &d, MEM),
        Err(ManifestError::TooLarge { .. })
    ));
    assert!(matches!(
        Manifest::verify(&bytes[..bytes.len() - 1], &d, MEM),
        Err(ManifestError::SizeMismatch { .. })
    ));
    let mut flipped = bytes.clone();
    flipped[40] ^= 1;
    assert!(matches!(
        Manifest::verify(&flipped, &d, MEM),
        Err(ManifestError::HashMismatch { .. })
    ));
    let mut dv = d.clone();
    dv.version = 9;
    assert!(matches!(
        Manifest::verify(&bytes, &dv, MEM),
        Err(ManifestError::DescriptorVersion { .. })
    ));
    assert!(matches!(
        Manifest::verify(&bytes, &d, MEM * 2),
        Err(ManifestError::MemorySizeMismatch { .. })
    ));
    let mut dm = d.clone();
    dm.guest_memory_size = MEM * 2;
    assert!(matches!(
        Manifest::verify(&bytes, &dm, MEM),
        Err(ManifestError::MemorySizeMismatch { .. })
    ));
}

#[test]
fn header_failures() {
    let (_, bytes, _) = encoded();
    let check = |b: &[u8], want: fn(&ManifestError) -> bool| {
        let err = Manifest::verify(b, &descriptor_for(b), MEM).unwrap_err();
        assert!(want(&err), "unexpected {err:?}");
    };
    check(&bytes[..20], |e| {
        matches!(e, ManifestError::Truncated { .. })
    });
    let mut b = bytes.clone();
    b[0] = b'X';
    check(&b, |e| matches!(e, ManifestError::BadMagic));
    let mut b = bytes.clone();
    b[8] = 2;
    check(&b, |e| matches!(e, ManifestError::UnsupportedVersion(2)));
    let mut b = bytes.clone();
    b[10] = 1;
    check(&b, |e| matches!(e, ManifestError::UnsupportedFlags(1)));
    let mut b = bytes.clone();
    b[12..16].copy_from_slice(&3000u32.to_le_bytes());
    check(&b, |e| matches!(e, ManifestError::BadPageSize(3000)));
    let mut b = bytes.clone();
    put_u64(&mut b, 16, MEM + 1);
    check(&b, |e| matches!(e, ManifestError::BadMemorySize { .. }));
    let mut b = bytes.clone();
    b.extend_from_slice(&[0u8; 16]);
    check(&b, |e| matches!(e, ManifestError::LengthMismatch { .. }));
    let mut b = bytes.clone();
    b[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    check(&b, |e| matches!(e, ManifestError::LengthMismatch { .. }));
}

#[test]
fn body_failures() {
    let (_, bytes, _) = encoded();
    let check = |b: &[u8], want: fn(&ManifestError) -> bool| {
        let err = Manifest::verify(b, &descriptor_for(b), MEM).unwrap_err();
        assert!(want(&err), "unexpected {err:?}");
    };
    // Range 0 starts at 3 pages; move it off page alignment.
    let mut b = bytes.clone();
    put_u64(&mut b, 32, 3 * 4096 + 1);
    check(&b, |e| {
        matches!(e, ManifestError::Unaligned { what: "range", .. })
    });
    // An empty run.
    let mut b = bytes.clone();
    put_u64(&mut b, 32 + 16 * 3 + 8, 0);
    check(&b, |e| {
        matches!(e, ManifestError::Unaligned { what: "run", .. })
    });
    // Last range beyond guest memory.
    let mut b = bytes.clone();
    put_u64(&mut b, 32 + 16 * 2, MEM);
    check(&b, |e| matches!(e, ManifestError::OutOfBounds { .. }));
    // Overflowing end.
    let mut b = bytes.clone();
    put_u64(&mut b, 32 + 16 * 2 + 8, u64::MAX - 4095);
    check(&b, |e| matches!(e, ManifestError::OutOfBounds { .. }));
    // Ranges out of order: swap range 0 and 1.
    let mut b = bytes.clone();
    let (r0, r1) = (b[32..48].to_vec(), b[48..64].to_vec());
    b[32..48].copy_from_slice(&r1);
    b[48..64].copy_from_slice(&r0);
    check(&b, |e| matches!(e, ManifestError::RangesNotMerged(1)));
    // A run that names a page no range has (page 41 instead of 40).
    let mut b = bytes.clone();
    put_u64(&mut b, 32 + 16 * 7, 41 * 4096);
    check(&b, |e| matches!(e, ManifestError::RunsMismatch));
    // Two runs naming the same page.
    let mut b = bytes.clone();
    put_u64(&mut b, 32 + 16 * 6, 3 * 4096);
    check(&b, |e| matches!(e, ManifestError::RunsMismatch));
}
