//! Forwarding one request to a sandbox port over a fresh HTTP/1.1
//! connection, streaming both bodies frame by frame.
//!
//! No connection pool: a paused sandbox's slot (and so its address) can go
//! to another sandbox, and a pooled connection would then reach the wrong
//! guest or break mid-request. A connection on the host's own veth costs
//! far less than anything the guest does with the request.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Request, Response, StatusCode, Uri, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::error::ProxyError;
use super::upgrade;

/// How long the guest may take to accept a connection. A closed port is
/// refused at once; this bounds a guest that does not answer at all.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `req` to `addr` and returns the guest's response, whose body
/// streams from the guest as it arrives. Nothing here times out once the
/// guest has answered: Connect streams live as long as their process.
pub async fn forward(
    id: &str,
    addr: SocketAddr,
    mut req: Request<Body>,
) -> Result<Response<Body>, ProxyError> {
    let client_upgrade = req.extensions_mut().remove::<OnUpgrade>();
    let upgrading = wants_upgrade(req.headers());
    prepare_request(&mut req, addr, upgrading).map_err(|detail| ProxyError::BadRequest {
        id: id.to_string(),
        detail,
    })?;

    let port_not_open = |detail: String| ProxyError::PortNotOpen {
        id: id.to_string(),
        port: addr.port(),
        detail,
    };
    let stream =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(port_not_open(e.to_string())),
            Err(_) => {
                return Err(port_not_open(format!(
                    "no answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )))
            }
        };
    // Small envelopes (start{pid}, keystrokes) must not wait for Nagle.
    let _ = stream.set_nodelay(true);
    let upstream = |e: hyper::Error| ProxyError::Upstream {
        id: id.to_string(),
        port: addr.port(),
        detail: e.to_string(),
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(upstream)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(%addr, "proxied connection ended: {e}");
        }
    });
    let mut resp = sender.send_request(req).await.map_err(upstream)?;

    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if switching {
        upgrade::splice(id, client_upgrade, &mut resp);
    }
    strip_hop_by_hop(resp.headers_mut(), switching);
    Ok(resp.map(Body::new))
}

/// Cuts `resp`'s body off with an error when sandbox `id` stops (its id
/// arrives on `stopped`) and resets the client's connection (`conn`): it
/// breaks mid-stream, as it would had it talked to the guest directly,
/// instead of hanging on a VM that is gone. The SDK then probes the
/// sandbox and reports it killed.
pub fn end_when_stopped(
    resp: Response<Body>,
    id: String,
    mut stopped: tokio::sync::broadcast::Receiver<String>,
    conn: Option<crate::conn::ConnHandle>,
) -> Response<Body> {
    use futures::StreamExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    // A response of known length is not a stream left hanging; keep it as
    // it is (its Content-Length, a body-less 204 or 304).
    if resp.headers().contains_key(header::CONTENT_LENGTH)
        || matches!(
            resp.status(),
            StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED | StatusCode::SWITCHING_PROTOCOLS
        )
    {
        return resp;
    }
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    let stop = async move {
        wait_stopped(&mut stopped, &id).await;
        flag.store(true, Ordering::SeqCst);
        // The client sees the connection reset (crate::conn), not a body
        // that merely ends early.
        if let Some(conn) = conn {
            conn.reset();
        }
    };
    let (parts, body) = resp.into_parts();
    let data = body
        .into_data_stream()
        .map(|r| r.map_err(std::io::Error::other))
        .take_until(Box::pin(stop));
    let cut = futures::stream::once(async move { fired.load(Ordering::SeqCst) }).filter_map(
        |fired| async move {
            fired.then(|| Err(std::io::Error::other("the sandbox stopped while streaming")))
        },
    );
    Response::from_parts(parts, Body::from_stream(data.chain(cut)))
}

/// Returns when sandbox `id` is announced stopped on `stopped`; never if
/// nothing announces (the sender is gone).
pub async fn wait_stopped(stopped: &mut tokio::sync::broadcast::Receiver<String>, id: &str) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match stopped.recv().await {
            Ok(s) if s == id => return,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => futures::future::pending::<()>().await,
        }
    }
}

/// Makes a server-side request fit to send to the guest: origin-form URI,
/// HTTP/1.1, a Host header, no hop-by-hop headers.
fn prepare_request(
    req: &mut Request<Body>,
    addr: SocketAddr,
    upgrading: bool,
) -> Result<(), String> {
    if !req.headers().contains_key(header::HOST) {
        // HTTP/2 carries the host in the URI; the guest speaks HTTP/1.1.
        let host = req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_else(|| addr.to_string());
        let value = HeaderValue::from_str(&host).map_err(|e| format!("host {host:?}: {e}"))?;
        req.headers_mut().insert(header::HOST, value);
    }
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    *req.uri_mut() = Uri::try_from(path.as_str()).map_err(|e| format!("path {path:?}: {e}"))?;
    *req.version_mut() = Version::HTTP_11;
    strip_hop_by_hop(req.headers_mut(), upgrading);
    Ok(())
}

/// Removes the node's own credentials from a request bound for a guest:
/// an `X-API-KEY`, or an `Authorization: Bearer`, whose value is one of
/// the node's API keys (`is_key`). Whoever runs code in the sandbox must not
/// learn the node's key from a client that sends one header set everywhere.
/// Other values stay: an app in the sandbox may take its own API keys or
/// bearer tokens that way, and envd needs `Authorization: Basic <user>:`.
pub fn strip_control_credentials(headers: &mut HeaderMap, is_key: impl Fn(&str) -> bool) {
    let is_control = |name: &HeaderName, value: &HeaderValue| {
        let Ok(text) = value.to_str() else {
            return false;
        };
        let text = text.trim();
        if name == "x-api-key" {
            return is_key(text);
        }
        text.split_once(' ').is_some_and(|(scheme, token)| {
            scheme.eq_ignore_ascii_case("bearer") && is_key(token.trim())
        })
    };
    for name in [HeaderName::from_static("x-api-key"), header::AUTHORIZATION] {
        if !headers.get_all(&name).iter().any(|v| is_control(&name, v)) {
            continue;
        }
        let kept: Vec<HeaderValue> = headers
            .get_all(&name)
            .iter()
            .filter(|v| !is_control(&name, v))
            .cloned()
            .collect();
        headers.remove(&name);
        for value in kept {
            headers.append(name.clone(), value);
        }
    }
}

fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_tokens(headers).any(|t| t == "upgrade")
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
}

/// Removes the headers that describe one connection rather than the
/// message (RFC 9110 §7.6.1), including those the Connection header names.
/// An upgrade keeps `Connection: upgrade` and `Upgrade`, which it needs.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter(|t| !(keep_upgrade && t == "upgrade"))
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
    ] {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_end_to_end_ones_stay() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, X-Private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-access-token", HeaderValue::from_static("secret"));
        h.insert(
            "content-type",
            HeaderValue::from_static("application/connect+json"),
        );
        strip_hop_by_hop(&mut h, false);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["content-type", "x-access-token"]);
    }

    #[test]
    fn the_nodes_keys_are_taken_out_others_stay() {
        let key = "e2b_0123";
        let mut h = HeaderMap::new();
        h.append("x-api-key", HeaderValue::from_static("e2b_0123"));
        h.append("x-api-key", HeaderValue::from_static("the-apps-own"));
        h.append(
            "authorization",
            HeaderValue::from_static("bearer  e2b_0123"),
        );
        h.append("authorization", HeaderValue::from_static("Basic dXNlcjo="));
        h.append(
            "authorization",
            HeaderValue::from_static("Bearer app-token"),
        );
        h.insert("cookie", HeaderValue::from_static("session=1"));
        strip_control_credentials(&mut h, |k| k == key);
        let all = |name| {
            h.get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(all("x-api-key"), ["the-apps-own"]);
        assert_eq!(all("authorization"), ["Basic dXNlcjo=", "Bearer app-token"]);
        assert_eq!(all("cookie"), ["session=1"]);
        let mut only = HeaderMap::new();
        only.insert("x-api-key", HeaderValue::from_static("e2b_0123"));
        strip_control_credentials(&mut only, |k| k == key);
        assert!(only.is_empty());
    }

    #[test]
    fn upgrades_keep_their_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
    }

    #[test]
    fn requests_become_origin_form_http11_with_a_host() {
        let addr: SocketAddr = "10.0.0.2:49983".parse().unwrap();
        let mut req = Request::builder()
            .uri("http://8080-abc.example.com/files?path=%2Ftmp")
            .version(Version::HTTP_2)
            .body(Body::empty())
            .unwrap();
        prepare_request(&mut req, addr, false).unwrap();
        assert_eq!(req.uri(), "/files?path=%2Ftmp");
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(req.headers()["host"], "8080-abc.example.com");
    }
}
