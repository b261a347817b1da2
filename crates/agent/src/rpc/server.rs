//! The HTTP side of Connect: turning a request into a decoded message (or a
//! stream of them) and a handler's result into a unary or streaming response.

use std::convert::Infallible;
use std::future::Future;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http::{header, HeaderMap, HeaderValue, StatusCode};

use super::codec::{Codec, Framing, Message};
use super::envelope::{self, EnvelopeReader};
use super::{Code, RequestContext, RpcError};

/// A server stream as handlers return it.
pub type RpcStream<T> = BoxStream<'static, Result<T, RpcError>>;

/// A request whose method has been found but whose body is still unread.
pub struct Incoming {
    pub ctx: RequestContext,
    pub codec: Codec,
    pub body: Body,
}

/// The messages of a client stream, decoded as they arrive.
pub struct RequestStream<M> {
    reader: EnvelopeReader<axum::body::BodyDataStream>,
    codec: Codec,
    _msg: std::marker::PhantomData<fn() -> M>,
}

impl<M: Message> RequestStream<M> {
    /// The next message, or `None` once the client closed its side.
    pub async fn message(&mut self) -> Result<Option<M>, RpcError> {
        match self.reader.next().await? {
            Some(payload) => self.codec.decode(&payload).map(Some),
            None => Ok(None),
        }
    }
}

impl Incoming {
    /// Checks the content type and encodings; `framing` is the method's kind.
    pub fn new(
        ctx: RequestContext,
        headers: &HeaderMap,
        body: Body,
        want: Framing,
    ) -> Result<Self, Box<Response>> {
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let Some((codec, framing)) = Codec::from_content_type(ct) else {
            return Err(Box::new(unsupported_media(format!(
                "unsupported content type {ct:?}"
            ))));
        };
        if framing != want {
            return Err(Box::new(unsupported_media(format!(
                "content type {ct:?} does not fit a {} method",
                if want == Framing::Unary {
                    "unary"
                } else {
                    "streaming"
                }
            ))));
        }
        // The agent negotiates no compression, so anything but identity is
        // refused rather than misread as a message.
        let enc_header = match framing {
            Framing::Unary => "content-encoding",
            Framing::Stream => "connect-content-encoding",
        };
        if let Some(enc) = headers.get(enc_header).and_then(|v| v.to_str().ok()) {
            if !enc.trim().eq_ignore_ascii_case("identity") {
                return Err(Box::new(error_response(&RpcError::new(
                    Code::Unimplemented,
                    format!("unsupported compression {enc:?}; supported: identity"),
                ))));
            }
        }
        Ok(Self { ctx, codec, body })
    }

    /// A unary call: one message in, one out. `connect-timeout-ms` bounds it.
    pub async fn unary<Req, Resp, F, Fut>(self, handler: F) -> Response
    where
        Req: Message,
        Resp: Message,
        F: FnOnce(RequestContext, Req) -> Fut,
        Fut: Future<Output = Result<Resp, RpcError>>,
    {
        let codec = self.codec;
        let result = async {
            let bytes = axum::body::to_bytes(self.body, envelope::MAX_MESSAGE)
                .await
                .map_err(|e| RpcError::invalid_argument(format!("reading request body: {e}")))?;
            let req: Req = codec.decode(&bytes)?;
            let timeout = self.ctx.timeout;
            let fut = handler(self.ctx, req);
            match timeout {
                Some(t) => tokio::time::timeout(t, fut)
                    .await
                    .map_err(|_| RpcError::new(Code::DeadlineExceeded, "the call timed out"))?,
                None => fut.await,
            }
        }
        .await;
        match result.and_then(|resp| codec.encode(&resp)) {
            Ok(body) => response(
                StatusCode::OK,
                codec.content_type(Framing::Unary),
                Body::from(body),
            ),
            Err(e) => error_response(&e),
        }
    }

    /// A server stream: one message in, a stream out. Errors before the
    /// stream exists are answered unary-style; later ones in the end envelope.
    /// With `deadline`, `connect-timeout-ms` ends the stream
    /// (`deadline_exceeded`, as envd); for `process.Start` the process is
    /// also killed, just after (see `process::run::supervise`).
    pub async fn server_stream<Req, Resp, F, Fut>(self, deadline: bool, handler: F) -> Response
    where
        Req: Message,
        Resp: Message,
        F: FnOnce(RequestContext, Req) -> Fut,
        Fut: Future<Output = Result<RpcStream<Resp>, RpcError>>,
    {
        let codec = self.codec;
        let mut reader = EnvelopeReader::new(self.body.into_data_stream());
        let started = async {
            let payload = reader.next().await?.ok_or_else(|| {
                RpcError::invalid_argument("the request stream carried no message")
            })?;
            let req: Req = codec.decode(&payload)?;
            let ends_at = deadline
                .then_some(self.ctx.timeout)
                .flatten()
                .map(|t| tokio::time::Instant::now() + t);
            Ok::<_, RpcError>((handler(self.ctx, req).await?, ends_at))
        }
        .await;
        match started {
            Ok((stream, ends_at)) => stream_response(codec, frame(codec, stream, ends_at)),
            Err(e) => error_response(&e),
        }
    }

    /// A client stream: messages in until EOF, one message out.
    pub async fn client_stream<Req, Resp, F, Fut>(self, handler: F) -> Response
    where
        Req: Message,
        Resp: Message,
        F: FnOnce(RequestContext, RequestStream<Req>) -> Fut,
        Fut: Future<Output = Result<Resp, RpcError>>,
    {
        let codec = self.codec;
        let messages = RequestStream {
            reader: EnvelopeReader::new(self.body.into_data_stream()),
            codec,
            _msg: std::marker::PhantomData,
        };
        let result = handler(self.ctx, messages).await;
        // Exactly one message then the end envelope: the SDK raises on zero
        // or two (connectrpc `_consume_single_response`).
        let one: RpcStream<Resp> = futures::stream::iter([result]).boxed();
        stream_response(codec, frame(codec, one, None))
    }
}

/// Frames a message stream into envelopes, ending with the end-of-stream
/// envelope. Each envelope is yielded on its own so hyper writes (and, as the
/// next poll is pending, flushes) it at once.
fn frame<Resp: Message>(
    codec: Codec,
    stream: RpcStream<Resp>,
    ends_at: Option<tokio::time::Instant>,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    futures::stream::unfold(Some(stream), move |state| async move {
        let mut stream = state?;
        let next = match ends_at {
            Some(at) => tokio::time::timeout_at(at, stream.next())
                .await
                .unwrap_or_else(|_| {
                    Some(Err(RpcError::new(
                        Code::DeadlineExceeded,
                        "the stream timed out",
                    )))
                }),
            None => stream.next().await,
        };
        let (bytes, more) = match next.map(|r| r.and_then(|m| codec.encode(&m))) {
            Some(Ok(payload)) => (envelope::encode(0, &payload), Some(stream)),
            Some(Err(e)) => (envelope::end_stream(Some(&e)), None),
            None => (envelope::end_stream(None), None),
        };
        Some((Ok(bytes), more))
    })
}

fn stream_response(
    codec: Codec,
    body: impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    response(
        StatusCode::OK,
        codec.content_type(Framing::Stream),
        Body::from_stream(body),
    )
}

fn response(status: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A unary-style Connect error: JSON `{"code","message"}` with the code's
/// HTTP status. Connect errors are JSON in both codecs.
pub fn error_response(e: &RpcError) -> Response {
    let status =
        StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({"code": e.code.as_str(), "message": e.message}).to_string();
    response(status, "application/json", Body::from(body))
}

fn unsupported_media(message: String) -> Response {
    let mut r = error_response(&RpcError::new(Code::Unknown, message));
    *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    r
}
