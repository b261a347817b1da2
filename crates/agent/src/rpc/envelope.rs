//! Connect streaming envelopes on the agent's side. The framing itself is
//! shared with the host (`siesta_envd_proto::envelope`); here requests are
//! parsed incrementally from the HTTP body so a client stream
//! (`StreamInput`) is handled message by message as it arrives, not after EOF.

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
pub use siesta_envd_proto::envelope::{encode, FLAG_END_STREAM, MAX_MESSAGE};
use siesta_envd_proto::envelope::{take_frame, FrameError};

use super::{Code, RpcError};

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
        let frame = take_frame(&mut self.buf).map_err(|e| match e {
            FrameError::Compressed => RpcError::new(Code::Internal, format!("protocol error: {e}")),
            FrameError::UnknownFlags(_) => RpcError::invalid_argument(e.to_string()),
            FrameError::TooLarge(_) => RpcError::new(Code::ResourceExhausted, e.to_string()),
        })?;
        match frame {
            None => Ok(None),
            Some(f) if f.is_end_stream() => {
                self.eof = true;
                self.buf.clear();
                Ok(Some(None))
            }
            Some(f) => Ok(Some(Some(f.payload))),
        }
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
