//! The server's listener against clients that hold connections without
//! sending requests (slowloris): they are closed after the header timeout,
//! while a response that streams for longer is not cut; and no more than
//! the connection cap are served at once, nor more than a client's share
//! from one address.
//!
//! No durations are asserted beyond "it happened before a generous bound"
//! (and, for the cap, "not while the slot was taken").

use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use siesta_server::conn::ConnHandle;
use siesta_server::HttpLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What any close must happen within, however slow the machine.
const BOUND: Duration = Duration::from_secs(30);

fn app() -> Router {
    Router::new()
        // Every request carries its connection's handle (the front door
        // resets connections through it).
        .route(
            "/",
            get(|ConnectInfo(_): ConnectInfo<ConnHandle>| async { "ok" }),
        )
        .route("/slow", get(slow))
}

/// Ten chunks, 300 ms apart: longer than the test's header timeout.
async fn slow() -> Body {
    let chunks = futures::stream::unfold(0u32, |n| async move {
        if n == 10 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        Some((Ok::<_, std::io::Error>(format!("chunk{n};")), n + 1))
    });
    Body::from_stream(chunks)
}

/// A server with `limits`; its address. It stops when the test ends.
async fn serve(limits: HttpLimits) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(siesta_server::listen::serve_app(
        listener,
        app(),
        limits,
        futures::future::pending(),
    ));
    addr
}

fn short(header_timeout: Duration) -> HttpLimits {
    HttpLimits {
        header_timeout,
        ..HttpLimits::default()
    }
}

/// Reads until the server closes the connection; what it sent.
async fn until_closed(conn: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(BOUND, conn.read_to_end(&mut got)).await;
    match read {
        Err(_) => panic!("still open after {BOUND:?}"),
        // A reset is as closed as a FIN.
        Ok(Ok(_)) | Ok(Err(_)) => String::from_utf8_lossy(&got).into_owned(),
    }
}

#[tokio::test]
async fn half_a_header_is_cut_off() {
    let addr = serve(short(Duration::from_secs(1))).await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let said = until_closed(&mut conn).await;
    assert!(!said.contains("200 OK"), "{said}");
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_cut_off() {
    let addr = serve(short(Duration::from_secs(1))).await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    assert_eq!(until_closed(&mut conn).await, "");
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_cut_off() {
    let addr = serve(short(Duration::from_secs(1))).await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let said = until_closed(&mut conn).await;
    assert!(said.starts_with("HTTP/1.1 200 OK"), "{said}");
    assert!(said.ends_with("ok"), "{said}");
}

#[tokio::test]
async fn a_response_streaming_past_the_header_timeout_is_not_cut() {
    let addr = serve(short(Duration::from_secs(1))).await;
    let body = tokio::time::timeout(BOUND, async {
        reqwest::get(format!("http://{addr}/slow"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
    .await
    .expect("the stream did not end");
    let want: String = (0..10).map(|n| format!("chunk{n};")).collect();
    assert_eq!(body, want);
}

#[tokio::test]
async fn no_more_than_the_cap_are_served_at_once() {
    let limits = HttpLimits {
        header_timeout: Duration::from_secs(120),
        max_connections: 1,
        ..HttpLimits::default()
    };
    let addr = serve(limits).await;
    let first = TcpStream::connect(addr).await.unwrap();
    // Connected in the kernel's queue, but not served while `first` holds
    // the only slot.
    let mut second = TcpStream::connect(addr).await.unwrap();
    second
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(500), second.read(&mut byte)).await;
    assert!(early.is_err(), "served past the cap: {early:?}");
    drop(first);
    let said = until_closed(&mut second).await;
    assert!(said.starts_with("HTTP/1.1 200 OK"), "{said}");
}

#[tokio::test]
async fn a_client_past_its_share_is_closed_while_others_are_served() {
    let limits = HttpLimits {
        header_timeout: Duration::from_secs(120),
        max_connections_per_ip: 2,
        ..HttpLimits::default()
    };
    let addr = serve(limits).await;
    // The attack: one host holds connections open without a request.
    let held = [
        TcpStream::connect(addr).await.unwrap(),
        TcpStream::connect(addr).await.unwrap(),
    ];
    let mut third = TcpStream::connect(addr).await.unwrap();
    let _ = third
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let said = until_closed(&mut third).await;
    assert_eq!(said, "", "a third connection from one address was served");
    // Another address (127.0.0.2 is loopback too) still gets in.
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = other.connect(addr).await.unwrap();
    other
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let said = until_closed(&mut other).await;
    assert!(said.starts_with("HTTP/1.1 200 OK"), "{said}");
    // A place given back is the client's again.
    drop(held);
    let body = tokio::time::timeout(BOUND, async {
        loop {
            // The server sees the close a moment after the client.
            match reqwest::get(format!("http://{addr}/")).await {
                Ok(r) => break r.text().await.unwrap(),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("never served again after its connections closed");
    assert_eq!(body, "ok");
}
