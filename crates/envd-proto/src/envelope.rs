//! Connect streaming envelopes, one implementation for both ends: the
//! agent reads requests and writes responses with it, the host's envd
//! client writes requests and reads responses.
//!
//! An envelope is `[flags u8][length u32 big-endian][payload]`. The last one
//! of a response stream has [`FLAG_END_STREAM`] and a JSON end message.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Flag bit: the payload is compressed (siesta negotiates none).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit: the end-of-stream message (JSON, even in the proto codec).
pub const FLAG_END_STREAM: u8 = 0x02;

/// Bytes before the payload.
pub const HEADER_LEN: usize = 5;

/// The largest message either end accepts: a bigger frame is refused from
/// its header, before anything is buffered, so a bogus length cannot make
/// a reader allocate gigabytes.
pub const MAX_MESSAGE: usize = 64 << 20;

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    pub payload: Bytes,
}

impl Frame {
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// Why a frame's header was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Compressed, but no compression was negotiated.
    Compressed,
    /// Flag bits this protocol does not define.
    UnknownFlags(u8),
    /// A payload over [`MAX_MESSAGE`].
    TooLarge(usize),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Compressed => {
                write!(f, "compressed message but no compression was negotiated")
            }
            FrameError::UnknownFlags(flags) => write!(f, "unknown envelope flags {flags:#04x}"),
            FrameError::TooLarge(len) => write!(
                f,
                "message of {len} bytes exceeds the {MAX_MESSAGE}-byte limit"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

/// Frames `payload` as one envelope.
pub fn encode(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER_LEN + payload.len());
    b.put_u8(flags);
    // MAX_MESSAGE keeps every payload we produce far below u32::MAX.
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// Takes one complete envelope off the front of `buf`: `Ok(None)` while it
/// is incomplete (the partial one stays for the next read). The header is
/// checked as soon as it is there.
pub fn take_frame(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let flags = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(FrameError::Compressed);
    }
    if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
        return Err(FrameError::UnknownFlags(flags));
    }
    if len > MAX_MESSAGE {
        return Err(FrameError::TooLarge(len));
    }
    if buf.len() < HEADER_LEN + len {
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    Ok(Some(Frame {
        flags,
        payload: buf.split_to(len).freeze(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_across_split_reads() {
        let mut wire = encode(0, b"{\"a\":1}").to_vec();
        wire.extend_from_slice(&encode(FLAG_END_STREAM, b"{}"));
        let mut buf = BytesMut::from(&wire[..7]);
        assert_eq!(take_frame(&mut buf), Ok(None));
        buf.extend_from_slice(&wire[7..]);
        let first = take_frame(&mut buf).unwrap().unwrap();
        assert_eq!(&first.payload[..], b"{\"a\":1}");
        let last = take_frame(&mut buf).unwrap().unwrap();
        assert!(last.is_end_stream());
        assert!(buf.is_empty());
    }

    #[test]
    fn refuses_compressed_unknown_flags_and_huge_frames_from_the_header() {
        let mut b = BytesMut::from(&[1u8, 0, 0, 0, 1, b'x'][..]);
        assert_eq!(take_frame(&mut b), Err(FrameError::Compressed));
        let mut b = BytesMut::from(&[0x10u8, 0, 0, 0, 0][..]);
        assert_eq!(take_frame(&mut b), Err(FrameError::UnknownFlags(0x10)));
        let mut b = BytesMut::from(&[0u8, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(take_frame(&mut b), Err(FrameError::TooLarge(_))));
    }
}

/// Hostile input: bounded property tests.
#[cfg(test)]
mod hostile {
    use super::*;
    use proptest::prelude::*;

    /// Every frame `buf` holds now, until an incomplete one or an error.
    fn drain(buf: &mut BytesMut) -> Vec<Frame> {
        let mut out = Vec::new();
        while let Ok(Some(frame)) = take_frame(buf) {
            out.push(frame);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Envelopes split across reads anywhere decode as if read at once.
        #[test]
        fn split_reads_decode_the_same(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let wire: Vec<u8> = payloads.iter().flat_map(|p| encode(0, p).to_vec()).collect();
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
            points.sort_unstable();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut from = 0;
            for at in points.into_iter().chain([wire.len()]) {
                buf.extend_from_slice(&wire[from..at]);
                got.extend(drain(&mut buf).into_iter().map(|f| f.payload.to_vec()));
                from = at;
            }
            prop_assert_eq!(got, payloads);
            prop_assert!(buf.is_empty());
        }

        /// Any bytes: whole envelopes come off, or an error, never a panic;
        /// nothing is lost or invented.
        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let taken: usize = drain(&mut buf).iter().map(|f| f.payload.len() + HEADER_LEN).sum();
            prop_assert_eq!(taken + buf.len(), bytes.len());
        }
    }
}
