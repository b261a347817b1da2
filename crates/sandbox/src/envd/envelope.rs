//! Connect streaming envelopes: `[flags u8][length u32 BE][payload]`.

use bytes::{Buf, BytesMut};

/// Flag of the last envelope of a stream (its payload is the end message).
pub const END_STREAM: u8 = 0x02;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub payload: Vec<u8>,
}

pub fn encode_envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Takes every complete envelope off the front of `buf`, leaving a partial
/// one in place for the next read.
pub fn decode_envelopes(buf: &mut BytesMut) -> Vec<Envelope> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            break;
        }
        let flags = buf[0];
        buf.advance(5);
        out.push(Envelope {
            flags,
            payload: buf.split_to(len).to_vec(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_across_split_reads() {
        let mut wire = encode_envelope(0, b"{\"a\":1}");
        wire.extend(encode_envelope(END_STREAM, b"{}"));
        let mut buf = BytesMut::from(&wire[..7]);
        assert!(decode_envelopes(&mut buf).is_empty());
        buf.extend_from_slice(&wire[7..]);
        let got = decode_envelopes(&mut buf);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].payload, b"{\"a\":1}");
        assert_eq!(got[1].flags, END_STREAM);
        assert!(buf.is_empty());
    }
}

/// Hostile input (issue 12): bounded property tests.
#[cfg(test)]
mod hostile {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Envelopes split across reads anywhere decode as if read at once.
        #[test]
        fn split_reads_decode_the_same(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let wire: Vec<u8> = payloads.iter().flat_map(|p| encode_envelope(0, p)).collect();
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
            points.sort_unstable();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut from = 0;
            for at in points.into_iter().chain([wire.len()]) {
                buf.extend_from_slice(&wire[from..at]);
                got.extend(decode_envelopes(&mut buf).into_iter().map(|e| e.payload));
                from = at;
            }
            prop_assert_eq!(got, payloads);
            prop_assert!(buf.is_empty());
        }

        /// Any bytes: whole envelopes come off, a partial one stays.
        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let taken: usize = decode_envelopes(&mut buf).iter().map(|e| e.payload.len() + 5).sum();
            prop_assert_eq!(taken + buf.len(), bytes.len());
        }
    }
}
