//! Connect streaming envelopes: `[flags u8][length u32 big-endian][payload]`.
//!
//! Requests are parsed incrementally from the HTTP body so a client stream
//! (`StreamInput`) is handled message by message as it arrives, not after EOF.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};

use super::{Code, RpcError};

/// Flag bit: the payload is compressed (we negotiate none, so it is refused).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit: the end-of-stream message (JSON, even in the proto codec).
pub const FLAG_END_STREAM: u8 = 0x02;

const HEADER_LEN: usize = 5;

/// The largest message the agent accepts; bigger frames are refused rather
/// than buffered, so a bogus length cannot make the agent allocate gigabytes.
pub const MAX_MESSAGE: usize = 64 << 20;

/// Frames `payload` as one envelope.
pub fn encode(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER_LEN + payload.len());
    b.put_u8(flags);
    // MAX_MESSAGE keeps every payload we produce far below u32::MAX.
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// The end-of-stream envelope: `{}` on success, `{"error":{...}}` on failure.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({"error": {"code": e.code.as_str(), "message": e.message}}),
    };
    encode(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Pulls envelopes out of a byte stream (the request body).
pub struct EnvelopeReader<S> {
    body: S,
    buf: BytesMut,
    eof: bool,
}

impl<S, E> EnvelopeReader<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub fn new(body: S) -> Self {
        Self {
            body,
            buf: BytesMut::new(),
            eof: false,
        }
    }

    /// The next message payload; `None` at a clean end of the body (or at an
    /// end-of-stream envelope). A truncated frame is `invalid_argument`.
    pub async fn next(&mut self) -> Result<Option<Bytes>, RpcError> {
        loop {
            if let Some(frame) = self.take_frame()? {
                return Ok(frame);
            }
            if self.eof {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(RpcError::invalid_argument(format!(
                        "request body ends inside an envelope ({} stray bytes)",
                        self.buf.len()
                    )))
                };
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(RpcError::new(
                        Code::Canceled,
                        format!("reading request body: {e}"),
                    ))
                }
                None => self.eof = true,
            }
        }
    }

    /// One complete frame from the buffer, if there is one. `Some(None)`
    /// means an end-of-stream envelope: clients do not send those, but one
    /// ends the stream cleanly if they do.
    #[allow(clippy::option_option)]
    fn take_frame(&mut self) -> Result<Option<Option<Bytes>>, RpcError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if flags & FLAG_COMPRESSED != 0 {
            return Err(RpcError::new(
                Code::Internal,
                "protocol error: compressed message but no compression was negotiated",
            ));
        }
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(RpcError::invalid_argument(format!(
                "unknown envelope flags {flags:#04x}"
            )));
        }
        if len > MAX_MESSAGE {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("message of {len} bytes exceeds the {MAX_MESSAGE}-byte limit"),
            ));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(len).freeze();
        if flags & FLAG_END_STREAM != 0 {
            self.eof = true;
            self.buf.clear();
            return Ok(Some(None));
        }
        Ok(Some(Some(payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    fn reader(
        chunks: Vec<&'static [u8]>,
    ) -> EnvelopeReader<impl Stream<Item = Result<Bytes, String>> + Unpin> {
        EnvelopeReader::new(stream::iter(
            chunks.into_iter().map(|c| Ok(Bytes::from_static(c))),
        ))
    }

    #[tokio::test]
    async fn splits_frames_across_chunks() {
        let mut all = encode(0, b"hello").to_vec();
        all.extend_from_slice(&encode(0, b""));
        let leaked: &'static [u8] = Box::leak(all.into_boxed_slice());
        let (a, b) = leaked.split_at(3);
        let mut r = reader(vec![a, b]);
        assert_eq!(
            r.next().await.unwrap().unwrap(),
            Bytes::from_static(b"hello")
        );
        assert_eq!(r.next().await.unwrap().unwrap(), Bytes::new());
        assert_eq!(r.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn refuses_truncated_and_compressed() {
        let mut r = reader(vec![&[0, 0, 0, 0, 9, b'x']]);
        assert_eq!(r.next().await.unwrap_err().code, Code::InvalidArgument);
        let mut r = reader(vec![&[1, 0, 0, 0, 1, b'x']]);
        assert_eq!(r.next().await.unwrap_err().code, Code::Internal);
        let mut r = reader(vec![&[0, 0xff, 0xff, 0xff, 0xff]]);
        assert_eq!(r.next().await.unwrap_err().code, Code::ResourceExhausted);
    }
}
