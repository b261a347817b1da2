//! A registry that lies: it sends a manifest without end, and a layer
//! longer than its manifest declares (without end too). A pull must stop at
//! the limits, say which, and keep nothing. The registry is a few lines of
//! HTTP/1.1 on 127.0.0.1 (plain HTTP, as loopback registries are).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::Digest;
use siesta_image::{fetch, BlobStore, FetchOptions, ImageError, ImageSource, ProgressEvent};

const CONFIG: &[u8] = br#"{"architecture":"amd64","os":"linux","config":{}}"#;
/// What the layer's manifest entry claims; the registry sends far more.
const DECLARED: u64 = 1024;

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
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": sha256(b"endless"), "size": DECLARED,
        }],
    }))
    .unwrap()
}

/// Serves connections until the test ends; counts the bytes of endless
/// bodies it managed to send.
fn start(sent: Arc<AtomicU64>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let sent = sent.clone();
            std::thread::spawn(move || serve(conn, &sent));
        }
    });
    port
}

fn serve(mut conn: TcpStream, sent: &AtomicU64) {
    let Some(path) = request_path(&mut conn) else {
        return;
    };
    let head = |len: Option<usize>| {
        format!(
            "HTTP/1.1 200 OK\r\nConnection: close\r\n{}\r\n",
            len.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"))
        )
    };
    let whole = |conn: &mut TcpStream, body: &[u8]| {
        let _ = conn.write_all(head(Some(body.len())).as_bytes());
        let _ = conn.write_all(body);
    };
    if path == "/v2/" {
        whole(&mut conn, b"{}");
    } else if path.ends_with("/manifests/liar") {
        whole(&mut conn, &manifest());
    } else if path.ends_with(&sha256(CONFIG)) {
        whole(&mut conn, CONFIG);
    } else if path.ends_with("/manifests/endless") {
        let _ = conn.write_all(head(None).as_bytes());
        let _ = conn.write_all(br#"{"schemaVersion":2,"pad":""#);
        endless(&mut conn, b'a', sent);
    } else {
        // The layer: no length, and no end.
        let _ = conn.write_all(head(None).as_bytes());
        endless(&mut conn, 0, sent);
    }
}

/// Writes `byte` until the client hangs up.
fn endless(conn: &mut TcpStream, byte: u8, sent: &AtomicU64) {
    let chunk = vec![byte; 64 << 10];
    while conn.write_all(&chunk).is_ok() {
        sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
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

#[tokio::test(flavor = "multi_thread")]
async fn endless_manifests_and_layers_longer_than_declared_are_cut_off() {
    let sent = Arc::new(AtomicU64::new(0));
    let port = start(sent.clone());
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let opts = FetchOptions::default();

    let endless = ImageSource::parse(&format!("127.0.0.1:{port}/evil/img:endless")).unwrap();
    let e = fetch(&endless, &opts, &store, &quiet).await.unwrap_err();
    assert!(matches!(e, ImageError::TooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("manifest is over the limit of 4.0 MiB"),
        "{e}"
    );

    let liar = ImageSource::parse(&format!("127.0.0.1:{port}/evil/img:liar")).unwrap();
    let e = fetch(&liar, &opts, &store, &quiet).await.unwrap_err();
    assert!(matches!(e, ImageError::TooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("longer than the 1024 bytes its manifest declares"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0,
        "the cut-off download was left behind"
    );
    assert_eq!(
        std::fs::read_dir(store.dir().join("sha256"))
            .unwrap()
            .count(),
        0
    );
    // Socket buffers let the server get ahead of the client, but not by
    // much: the client stopped reading.
    assert!(
        sent.load(Ordering::Relaxed) < 256 << 20,
        "{} bytes were sent",
        sent.load(Ordering::Relaxed)
    );
}
