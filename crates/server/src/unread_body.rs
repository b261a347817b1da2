//! `Connection: close` on an HTTP/1 response sent before its request's
//! body was read to the end.
//!
//! hyper answers such a request and then closes the connection: it will not
//! read the unknown rest of a body to find the next request. But it wrote
//! the response head before it decided, so the head says keep-alive. A
//! client that pools connections (the E2B SDK shares one pool for the API
//! and every sandbox's envd) puts the connection back, sends its next
//! request on it while the server is closing it, and that request fails
//! with "connection closed before message completed". Saying `close` in the
//! head makes the client open a new connection instead.
//!
//! Early answers that leave a body unread: the front door's refusals (no
//! such sandbox, a missing traffic token) and an API key refused before the
//! JSON body is read. HTTP/2 is left alone: there a body left unread ends
//! one stream, not the connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode, Version};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};

/// Middleware: marks the response `Connection: close` when the request's
/// body was not read to its end by the time the response is ready.
pub async fn close_if_body_unread(req: Request, next: Next) -> Response {
    if !matches!(
        req.version(),
        Version::HTTP_09 | Version::HTTP_10 | Version::HTTP_11
    ) {
        return next.run(req).await;
    }
    // Kept for the log line; both clones share their bytes, no copy.
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let (parts, body) = req.into_parts();
    let read = Arc::new(AtomicBool::new(body.is_end_stream()));
    let body = Body::new(Watched {
        inner: body,
        read: read.clone(),
    });
    let mut resp = next.run(Request::from_parts(parts, body)).await;
    // An upgrade hands the connection over; its head is the upgrade's.
    if !read.load(Ordering::SeqCst) && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        tracing::debug!(%method, path = uri.path(), status = %resp.status(), "answered before the request body was read: closing the connection");
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A request body that notes when it has been read to its end.
struct Watched {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            self.read.store(true, Ordering::SeqCst);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A real server: `/ignore` answers without reading the body, `/read`
    /// reads it first.
    async fn server() -> std::net::SocketAddr {
        let app = Router::new()
            .route("/ignore", post(|| async { StatusCode::BAD_GATEWAY }))
            .route(
                "/read",
                post(|body: Bytes| async move { body.len().to_string() }),
            )
            .layer(axum::middleware::from_fn(close_if_body_unread));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    /// Sends `head` (and `body`), returns the response head, lowercased.
    async fn head_of(addr: std::net::SocketAddr, head: &str, body: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed before a response head");
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).to_lowercase()
    }

    #[tokio::test]
    async fn an_answer_before_the_body_was_read_closes_the_connection() {
        let addr = server().await;
        // The body's chunks have not been sent when the answer is ready.
        let chunked = "POST /ignore HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n";
        let head = head_of(addr, chunked, "").await;
        assert!(head.starts_with("http/1.1 502"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_keeps_the_connection() {
        let addr = server().await;
        let req = "POST /read HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n";
        let head = head_of(addr, req, "hello").await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        // No body at all: nothing was left unread.
        let empty = "POST /ignore HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
        let head = head_of(addr, empty, "").await;
        assert!(head.starts_with("http/1.1 502"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
    }
}
