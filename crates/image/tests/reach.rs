//! SSRF through a pull (M7): a pull with a public reach, as an API build
//! gets, must not connect to loopback or private addresses, whether the
//! image names them, a name resolves to them, the registry's token
//! service (`Bearer realm=...`) points there, or a blob redirects there.
//! Each target here is a listener that counts connections: a refused pull
//! must leave it at zero, and the same pull with reach `Anywhere` (the
//! operator's builds) shows the listener would have been reached.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sha2::Digest;
use siesta_image::{fetch, BlobStore, FetchOptions, ImageError, ImageSource, ProgressEvent, Reach};

const CONFIG: &[u8] = br#"{"architecture":"amd64","os":"linux","config":{}}"#;
const LAYER: &[u8] = b"not really a layer";

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

fn manifest() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha256(CONFIG), "size": CONFIG.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": sha256(LAYER), "size": LAYER.len(),
        }],
    }))
    .unwrap()
}

/// A listener on `ip` that counts the connections it accepts and answers
/// each with a token (so a pull that does reach it goes on).
fn counting_listener(ip: &str) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            seen.fetch_add(1, Ordering::SeqCst);
            if request_path(&mut conn).is_some() {
                respond(&mut conn, "200 OK", &[], br#"{"token":"t"}"#);
            }
        }
    });
    (port, count)
}

/// How the registry misbehaves.
#[derive(Clone)]
enum Registry {
    /// `/v2/` asks for a token from `realm`.
    TokenFrom(String),
    /// The layer blob redirects to `location`.
    LayerAt(String),
}

fn start_registry(kind: Registry) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let kind = kind.clone();
            std::thread::spawn(move || serve(conn, &kind));
        }
    });
    port
}

fn serve(mut conn: TcpStream, kind: &Registry) {
    let Some(path) = request_path(&mut conn) else {
        return;
    };
    match kind {
        Registry::TokenFrom(realm) if path == "/v2/" => {
            let challenge = format!("WWW-Authenticate: Bearer realm=\"{realm}\",service=\"x\"");
            respond(&mut conn, "401 Unauthorized", &[&challenge], b"{}");
        }
        _ if path == "/v2/" => respond(&mut conn, "200 OK", &[], b"{}"),
        _ if path.contains("/manifests/") => respond(&mut conn, "200 OK", &[], &manifest()),
        _ if path.ends_with(&sha256(CONFIG)) => respond(&mut conn, "200 OK", &[], CONFIG),
        Registry::LayerAt(location) => {
            let header = format!("Location: {location}");
            respond(&mut conn, "302 Found", &[&header], b"");
        }
        _ => respond(&mut conn, "404 Not Found", &[], b""),
    }
}

fn respond(conn: &mut TcpStream, status: &str, headers: &[&str], body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
}

fn request_path(conn: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&head).lines().next()?.to_string();
    line.split(' ').nth(1).map(str::to_string)
}

fn quiet(_: ProgressEvent<'_>) {}

fn with(reach: Reach) -> FetchOptions {
    FetchOptions {
        reach,
        ..Default::default()
    }
}

/// Only 127.0.0.1 opened, as the test suites open it.
fn loopback_one() -> Reach {
    Reach::public(vec!["127.0.0.1/32".parse().unwrap()]).unwrap()
}

fn refused(e: &ImageError) -> &siesta_image::AddressRefused {
    match e {
        ImageError::Forbidden { refused, .. } => refused,
        other => panic!("not refused for its address: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_on_loopback_is_refused_by_address_and_by_name_without_a_connection() {
    let (port, count) = counting_listener("127.0.0.1");
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let closed = with(Reach::public(vec![]).unwrap());
    for image in [
        format!("127.0.0.1:{port}/v3/kv:x"),
        format!("localhost:{port}/v3/kv:x"),
    ] {
        let src = ImageSource::parse(&image).unwrap();
        let e = fetch(&src, &closed, &store, &quiet).await.unwrap_err();
        let r = refused(&e);
        assert_eq!(r.addr.to_string(), "127.0.0.1", "{e}");
        let text = e.to_string();
        assert!(
            text.contains("image_registry_private_allow") && text.contains(&image),
            "{text}"
        );
        // The check before a build says the same.
        let early = src.check_reach(&closed.reach).await.unwrap_err();
        assert!(matches!(early, ImageError::Forbidden { .. }), "{early}");
    }
    assert_eq!(count.load(Ordering::SeqCst), 0, "a refused pull connected");

    // Opened, the same pull connects (the listener is no registry).
    let opened = with(loopback_one());
    let src = ImageSource::parse(&format!("127.0.0.1:{port}/v3/kv:x")).unwrap();
    let e = fetch(&src, &opened, &store, &quiet).await.unwrap_err();
    assert!(!matches!(e, ImageError::Forbidden { .. }), "{e}");
    assert!(count.load(Ordering::SeqCst) > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_service_on_a_closed_address_is_never_asked() {
    let (token_port, count) = counting_listener("127.0.0.2");
    let realm = format!("http://127.0.0.2:{token_port}/token");
    let port = start_registry(Registry::TokenFrom(realm));
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let src = ImageSource::parse(&format!("127.0.0.1:{port}/evil/img:t")).unwrap();

    let e = fetch(&src, &with(loopback_one()), &store, &quiet)
        .await
        .unwrap_err();
    assert_eq!(refused(&e).addr.to_string(), "127.0.0.2", "{e}");
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "the token service was asked"
    );

    let metadata = start_registry(Registry::TokenFrom(
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/".into(),
    ));
    let src = ImageSource::parse(&format!("127.0.0.1:{metadata}/evil/img:t")).unwrap();
    let e = fetch(&src, &with(loopback_one()), &store, &quiet)
        .await
        .unwrap_err();
    assert!(refused(&e).range.contains("link-local"), "{e}");

    // The operator's own pull does ask it.
    let src = ImageSource::parse(&format!("127.0.0.1:{port}/evil/img:t")).unwrap();
    let _ = fetch(&src, &with(Reach::Anywhere), &store, &quiet).await;
    assert!(count.load(Ordering::SeqCst) > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_redirected_to_a_closed_address_is_not_followed() {
    let (target_port, count) = counting_listener("127.0.0.2");
    let port = start_registry(Registry::LayerAt(format!(
        "http://127.0.0.2:{target_port}/blob"
    )));
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let src = ImageSource::parse(&format!("127.0.0.1:{port}/evil/img:t")).unwrap();

    let e = fetch(&src, &with(loopback_one()), &store, &quiet)
        .await
        .unwrap_err();
    assert_eq!(refused(&e).addr.to_string(), "127.0.0.2", "{e}");
    assert_eq!(count.load(Ordering::SeqCst), 0, "the redirect was followed");
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0,
        "the refused download was left behind"
    );

    let _ = fetch(&src, &with(Reach::Anywhere), &store, &quiet).await;
    assert!(count.load(Ordering::SeqCst) > 0);
}
