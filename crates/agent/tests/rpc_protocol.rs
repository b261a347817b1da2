//! Connect protocol edge cases against an in-process agent: unknown methods,
//! malformed frames and JSON, compression, content types, the access token,
//! and HTTP/2 without TLS.

mod common;
#[path = "common/connect.rs"]
mod connect;

use connect::{envelope, Client, Codec, ConnectError};
use siesta_envd_proto::process::*;

async fn guest() -> (common::Guest, Client) {
    let g = common::Guest::start().await;
    let c = Client::new(&g.base);
    (g, c)
}

async fn error_of(resp: reqwest::Response) -> ConnectError {
    let status = resp.status().as_u16();
    let v: serde_json::Value = resp.json().await.expect("JSON error body");
    ConnectError {
        status,
        code: v["code"].as_str().unwrap().into(),
        message: v["message"].as_str().unwrap_or_default().into(),
    }
}

#[tokio::test]
async fn unknown_methods_are_unimplemented() {
    let (_g, c) = guest().await;
    for path in ["/process.Process/Nope", "/nope.Service/List"] {
        let e = error_of(c.raw(path, "application/json", b"{}".to_vec(), &[]).await).await;
        assert_eq!(
            (e.status, e.code.as_str()),
            (501, "unimplemented"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument() {
    let (_g, c) = guest().await;
    let list = "/process.Process/List";
    let start = "/process.Process/Start";
    // Unary JSON that does not parse.
    let e = error_of(
        c.raw(list, "application/json", b"{\"oops".to_vec(), &[])
            .await,
    )
    .await;
    assert_eq!((e.status, e.code.as_str()), (400, "invalid_argument"));
    // Unary proto that does not parse.
    let e = error_of(
        c.raw(list, "application/proto", vec![0xff, 0xff, 0xff], &[])
            .await,
    )
    .await;
    assert_eq!(e.code, "invalid_argument");
    // A truncated envelope, an empty stream, and a frame of bad JSON.
    for body in [
        vec![0, 0, 0, 0, 50, b'{'],
        vec![],
        envelope(0, b"{\"process\":"),
    ] {
        let e = error_of(c.raw(start, "application/connect+json", body, &[]).await).await;
        assert_eq!(e.code, "invalid_argument", "{}", e.message);
    }
    // A compressed frame when no compression was negotiated.
    let e = error_of(
        c.raw(start, "application/connect+json", envelope(1, b"{}"), &[])
            .await,
    )
    .await;
    assert_eq!(e.code, "internal");
    // An unsupported encoding.
    let e = error_of(
        c.raw(
            list,
            "application/json",
            b"{}".to_vec(),
            &[("content-encoding", "gzip")],
        )
        .await,
    )
    .await;
    assert_eq!(e.code, "unimplemented");
    // Unary content type on a streaming method and vice versa.
    let r = c.raw(start, "application/json", b"{}".to_vec(), &[]).await;
    assert_eq!(r.status().as_u16(), 415);
    let r = c
        .raw(list, "application/connect+json", envelope(0, b"{}"), &[])
        .await;
    assert_eq!(r.status().as_u16(), 415);
    let r = c.raw(list, "text/plain", b"{}".to_vec(), &[]).await;
    assert_eq!(r.status().as_u16(), 415);
    // Unknown JSON fields are ignored, like the SDK does.
    let r = c
        .raw(list, "application/json", br#"{"future":1}"#.to_vec(), &[])
        .await;
    assert_eq!(r.status().as_u16(), 200);
    // After all that the agent still serves.
    let r = c.raw(list, "application/json", b"{}".to_vec(), &[]).await;
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test]
async fn access_token_is_required_once_set() {
    let (g, mut c) = guest().await;
    g.state.defaults.write().await.access_token = Some("tok-123".into());
    let list = "/process.Process/List";
    let e = c
        .unary::<_, ListResponse>(Codec::Json, list, &ListRequest {}, &[])
        .await
        .unwrap_err();
    assert_eq!((e.status, e.code.as_str()), (401, "unauthenticated"));
    let e = c
        .unary::<_, ListResponse>(
            Codec::Json,
            list,
            &ListRequest {},
            &[("x-access-token", "tok-124")],
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "unauthenticated");
    // Streams are refused before anything starts.
    let start = StartRequest {
        process: Some(ProcessConfig {
            cmd: "true".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = c
        .stream::<_, StartResponse>(Codec::Json, "/process.Process/Start", &start, &[])
        .await
        .err()
        .unwrap();
    assert_eq!(e.code, "unauthenticated");

    c.headers.push(("X-Access-Token".into(), "tok-123".into()));
    let _: ListResponse = c
        .unary(Codec::Json, list, &ListRequest {}, &[])
        .await
        .unwrap();
}

/// Connect over HTTP/2 with prior knowledge (h2c), as gRPC-style clients use.
#[tokio::test]
async fn serves_h2c() {
    use http_body_util::{BodyExt, Full};
    let (g, _c) = guest().await;
    let addr = g.base.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post(format!("{}/process.Process/List", g.base))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let _: ListResponse = serde_json::from_slice(&body).unwrap();
}
