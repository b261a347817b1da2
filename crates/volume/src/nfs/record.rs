//! RPC record marking over TCP (RFC 5531, section 11), bounded.
//!
//! A record is one or more fragments, each a 4-byte mark (top bit: last
//! fragment; the other 31: its length) and its bytes. A record is read
//! into a buffer that grows with the bytes that actually arrive, never
//! with the length a mark announces, and a record longer than
//! [`MAX_RECORD`] or split into more than [`MAX_FRAGMENTS`] is refused
//! before its bytes are read.

use tokio::io::{AsyncRead, AsyncReadExt};

use super::call::MAX_COUNT;

/// Largest record: a WRITE of [`MAX_COUNT`] bytes plus its headers (at
/// most 400-byte credentials and verifier, a 64-byte handle, ...).
pub const MAX_RECORD: usize = MAX_COUNT as usize + 4096;
/// Linux's client sends one fragment per record; a few are allowed.
pub const MAX_FRAGMENTS: usize = 8;
/// The mark's "last fragment" bit.
const LAST: u32 = 1 << 31;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("record of more than {MAX_RECORD} bytes")]
    TooLarge,
    #[error("record of more than {MAX_FRAGMENTS} fragments")]
    TooManyFragments,
    #[error("the connection closed in the middle of a record")]
    Truncated,
    #[error("reading a record: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one whole record from `src` into `buf`: four bytes left for its
/// record mark (see [`mark`]), then the message. `Ok(false)`: `src` ended
/// cleanly before a record began.
pub async fn read_record<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut Vec<u8>,
) -> Result<bool, FrameError> {
    buf.clear();
    buf.extend_from_slice(&[0; 4]);
    for fragment in 0..MAX_FRAGMENTS {
        let mut header = [0u8; 4];
        if let Err(e) = src.read_exact(&mut header).await {
            return match e.kind() {
                std::io::ErrorKind::UnexpectedEof if fragment == 0 => Ok(false),
                std::io::ErrorKind::UnexpectedEof => Err(FrameError::Truncated),
                _ => Err(e.into()),
            };
        }
        let header = u32::from_be_bytes(header);
        let len = (header & !LAST) as usize;
        if buf.len() - 4 + len > MAX_RECORD {
            return Err(FrameError::TooLarge);
        }
        let got = (&mut *src).take(len as u64).read_to_end(buf).await?;
        if got < len {
            return Err(FrameError::Truncated);
        }
        if header & LAST != 0 {
            let total = (buf.len() - 4) as u32;
            buf[..4].copy_from_slice(&mark(total));
            return Ok(true);
        }
    }
    Err(FrameError::TooManyFragments)
}

/// The mark of a record sent whole in one fragment of `len` bytes.
pub fn mark(len: u32) -> [u8; 4] {
    (len | LAST).to_be_bytes()
}

/// Parses a mark: the fragment's length and whether it is the last one.
pub fn parse_mark(mark: [u8; 4]) -> (usize, bool) {
    let word = u32::from_be_bytes(mark);
    ((word & !LAST) as usize, word & LAST != 0)
}
