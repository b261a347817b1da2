//! Hostile input for the snapshot decoders (issue 12): whatever bytes a
//! manifest file or a record file holds, decoding returns an error or a
//! valid value; it never panics. Bounded: a fixed number of cases per
//! property (proptest's failures are kept in `proptest-regressions/`).

use proptest::prelude::*;
use siesta_snapshot::manifest::Manifest;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    }
}

fn valid_manifest(pages: Vec<u64>) -> Vec<u8> {
    let pages: Vec<u64> = pages.into_iter().map(|p| p % 4096).collect();
    Manifest::from_touch_order(4096, 4096 * 4096, &pages).encode()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(m) = Manifest::decode(&bytes) {
            prop_assert!(m.validate().is_ok());
        }
    }

    #[test]
    fn a_valid_manifest_survives_the_round_trip(pages in proptest::collection::vec(any::<u64>(), 0..64)) {
        let encoded = valid_manifest(pages);
        let decoded = Manifest::decode(&encoded).expect("an encoded manifest decodes");
        prop_assert_eq!(decoded.encode(), encoded);
    }

    #[test]
    fn a_changed_or_cut_manifest_never_panics(
        pages in proptest::collection::vec(any::<u64>(), 1..32),
        at in any::<usize>(),
        byte in any::<u8>(),
        cut in any::<bool>(),
    ) {
        let mut encoded = valid_manifest(pages);
        let at = at % encoded.len();
        if cut {
            encoded.truncate(at);
        } else {
            encoded[at] = byte;
        }
        if let Ok(m) = Manifest::decode(&encoded) {
            prop_assert!(m.validate().is_ok());
            for r in m.ranges.iter().chain(&m.runs) {
                prop_assert!(r.offset.checked_add(r.len).is_some());
            }
        }
    }

    #[test]
    fn any_json_is_a_record_or_an_error(text in "\\PC{0,300}") {
        let _ = serde_json::from_str::<siesta_snapshot::SnapshotRecord>(&text);
    }
}
