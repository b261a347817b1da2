//! The agent's `/files`, `/init`, `/envs`, `/health` endpoints over real HTTP
//! on a loopback socket, served by `siesta_agent::serve`.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::{ctx, error_json, Guest};
use siesta_agent::filesystem::xattr;
use siesta_agent::rpc::Code;
use siesta_envd_proto::filesystem::*;

#[tokio::test]
async fn health_init_token_and_envs() {
    let g = Guest::start().await;
    let r = g.http.get(g.url("/health")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 204);

    let body = serde_json::json!({
        "envVars": {"A": "1"},
        "accessToken": "secret",
        "defaultWorkdir": "/tmp",
        "volumeMounts": [],
    });
    let r = g
        .http
        .post(g.url("/init"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(
        g.state.defaults.read().await.workdir.as_deref(),
        Some("/tmp")
    );

    // Health needs no token; everything else now does.
    assert_eq!(
        g.http
            .get(g.url("/health"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        204
    );
    error_json(g.http.get(g.url("/envs")).send().await.unwrap(), 401).await;
    error_json(
        g.http
            .get(g.files_url("/etc/hostname"))
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    let wrong = g
        .http
        .post(g.url("/init"))
        .header("X-Access-Token", "nope")
        .json(&body)
        .send()
        .await
        .unwrap();
    error_json(wrong, 401).await;

    let envs: serde_json::Value = g
        .http
        .get(g.url("/envs"))
        .header("X-Access-Token", "secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(envs, serde_json::json!({"A": "1"}));

    // The token holder may re-init (a resume): env vars merge. A timestamp
    // equal to now leaves the clock alone.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let ts = pbjson_types::Timestamp {
        seconds: now.as_secs() as i64,
        nanos: 0,
    };
    let body =
        serde_json::json!({"envVars": {"B": "2"}, "timestamp": serde_json::to_value(ts).unwrap()});
    let r = g
        .http
        .post(g.url("/init"))
        .header("X-Access-Token", "secret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let d = g.state.defaults.read().await.clone();
    assert_eq!(d.env_vars.len(), 2);
    assert_eq!(d.access_token.as_deref(), Some("secret"));

    let bad = serde_json::json!({"entropy": "not base64!"});
    let r = g
        .http
        .post(g.url("/init"))
        .header("X-Access-Token", "secret")
        .json(&bad)
        .send()
        .await
        .unwrap();
    error_json(r, 400).await;
    let bad = serde_json::json!({"defaultUser": "ghost"});
    let r = g
        .http
        .post(g.url("/init"))
        .header("X-Access-Token", "secret")
        .json(&bad)
        .send()
        .await
        .unwrap();
    error_json(r, 400).await;

    // With a token, the SDK's signed URLs are accepted instead.
    let path = g.home().join("signed.txt");
    std::fs::write(&path, b"signed").unwrap();
    let p = path.to_str().unwrap();
    let sig = siesta_agent::http::signature(p, "read", "", "secret", None);
    let mut u = reqwest::Url::parse(&g.url("/files")).unwrap();
    u.query_pairs_mut()
        .append_pair("path", p)
        .append_pair("signature", &sig);
    let r = g.http.get(u).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"signed");
    let mut u = reqwest::Url::parse(&g.url("/files")).unwrap();
    u.query_pairs_mut()
        .append_pair("path", p)
        .append_pair("signature", "v1_bogus");
    error_json(g.http.get(u).send().await.unwrap(), 401).await;
}

#[tokio::test]
async fn upload_forms_and_download() {
    let g = Guest::start().await;
    let home = g.home();

    // Multipart, one file, `?path=` relative to the home, parents created.
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"persist-me".to_vec()).file_name("ignored-name"),
    );
    let r = g
        .http
        .post(g.files_url("deep/dir/state.txt"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let infos: serde_json::Value = r.json().await.unwrap();
    let dest = home.join("deep/dir/state.txt");
    assert_eq!(
        infos,
        serde_json::json!([{"name": "state.txt", "path": dest.to_str().unwrap(), "type": "file"}])
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"persist-me");
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    assert_eq!(std::fs::metadata(&dest).unwrap().uid(), uid);
    assert_eq!(std::fs::metadata(home.join("deep")).unwrap().uid(), uid);

    // Multipart, several files, no path: each part's filename is the target;
    // an existing file is overwritten.
    let a = home.join("multi/a.txt");
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"AAA".to_vec())
                .file_name(a.to_str().unwrap().to_string()),
        )
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"BBB".to_vec()).file_name("multi/b.txt"),
        )
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"new".to_vec()).file_name("deep/dir/state.txt"),
        );
    let r = g
        .http
        .post(g.url("/files"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let infos: Vec<serde_json::Value> = r.json().await.unwrap();
    assert_eq!(infos.len(), 3);
    assert_eq!(std::fs::read(&a).unwrap(), b"AAA");
    assert_eq!(std::fs::read(home.join("multi/b.txt")).unwrap(), b"BBB");
    assert_eq!(std::fs::read(&dest).unwrap(), b"new");

    // Octet-stream, streamed (chunked) body.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(65536).map(|c| Ok(c.to_vec())).collect();
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let r = g
        .http
        .post(g.files_url("big.bin"))
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(std::fs::read(home.join("big.bin")).unwrap(), big);

    // Octet-stream with a gzip request body.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(b"zipped text").unwrap();
    let r = g
        .http
        .post(g.files_url("z.txt"))
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(enc.finish().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(std::fs::read(home.join("z.txt")).unwrap(), b"zipped text");
    let r = g
        .http
        .post(g.files_url("bad.txt"))
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body("not gzip at all")
        .send()
        .await
        .unwrap();
    error_json(r, 400).await;

    // Download, plain and gzip.
    let r = g.http.get(g.files_url("big.bin")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.bytes().await.unwrap().as_ref(), big.as_slice());
    let r = g
        .http
        .get(g.files_url("big.bin"))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let zipped = r.bytes().await.unwrap();
    assert!(zipped.len() < big.len());
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(zipped.as_ref())
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, big);

    // Errors: missing file, directory, missing path, unknown user.
    let msg = error_json(
        g.http.get(g.files_url("nope.txt")).send().await.unwrap(),
        404,
    )
    .await;
    assert!(msg.contains("nope.txt"), "{msg}");
    error_json(g.http.get(g.files_url("multi")).send().await.unwrap(), 400).await;
    error_json(g.http.get(g.url("/files")).send().await.unwrap(), 400).await;
    let r = g
        .http
        .get(format!("{}&username=ghost", g.files_url("z.txt")))
        .send()
        .await
        .unwrap();
    error_json(r, 400).await;
    // Uploading onto a directory.
    let r = g
        .http
        .post(g.files_url("multi"))
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .unwrap();
    error_json(r, 400).await;
}

#[tokio::test]
async fn other_users_are_held_to_mode_bits() {
    let g = Guest::start().await;
    // SAFETY: getuid has no preconditions and cannot fail.
    if unsafe { libc::getuid() } == 54321 {
        return;
    }
    let secret = g.home().join("secret.txt");
    std::fs::write(&secret, b"s").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(g.home(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let url = format!("{}&username=other", g.files_url(secret.to_str().unwrap()));
    error_json(g.http.get(&url).send().await.unwrap(), 403).await;
    let url = format!(
        "{}&username=other",
        g.files_url(g.home().join("new.txt").to_str().unwrap())
    );
    let r = g
        .http
        .post(&url)
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .unwrap();
    error_json(r, 403).await;
    assert!(!g.home().join("new.txt").exists());

    // The same rules on the RPC side.
    let fs = &g.state.filesystem;
    let err = fs
        .make_dir(
            &ctx("other"),
            MakeDirRequest {
                path: g.home().join("d").to_string_lossy().into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::PermissionDenied);
    let err = fs
        .remove(
            &ctx("other"),
            RemoveRequest {
                path: secret.to_string_lossy().into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::PermissionDenied);
}

#[tokio::test]
async fn metadata_headers_become_xattrs() {
    let g = Guest::start().await;
    let probe = g.home().join("probe");
    std::fs::write(&probe, b"").unwrap();
    if let Err(e) = xattr::set(&probe, "probe", "1") {
        eprintln!("skipping: the temp filesystem has no user xattrs ({e})");
        return;
    }
    let r = g
        .http
        .post(g.files_url("meta.txt"))
        .header("content-type", "application/octet-stream")
        .header("X-Metadata-Owner", "alice")
        .header("X-Metadata-Purpose", "test")
        .body("m")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let entry = g
        .state
        .filesystem
        .stat(
            &ctx("user"),
            StatRequest {
                path: "meta.txt".into(),
            },
        )
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(
        entry.metadata.get("owner").map(String::as_str),
        Some("alice")
    );
    assert_eq!(
        entry.metadata.get("purpose").map(String::as_str),
        Some("test")
    );
}

/// The filesystem service through the Connect JSON codec, as the SDK calls it.
#[tokio::test]
async fn filesystem_rpcs_over_connect_json() {
    let g = Guest::start().await;
    std::fs::write(g.home().join("f.txt"), b"12345").unwrap();
    let call = |method: &str, body: serde_json::Value| {
        g.http
            .post(g.url(&format!("/filesystem.Filesystem/{method}")))
            .header("content-type", "application/json")
            .header("connect-protocol-version", "1")
            .json(&body)
            .send()
    };
    let r = call("Stat", serde_json::json!({"path": "f.txt"}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    let e = &v["entry"];
    assert_eq!(e["name"], "f.txt");
    assert_eq!(e["type"], "FILE_TYPE_FILE");
    assert_eq!(e["size"], "5");
    assert!(e["permissions"].as_str().unwrap().starts_with('-'));
    assert!(e["modifiedTime"].is_string());

    let r = call("MakeDir", serde_json::json!({"path": "d"}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = call("MakeDir", serde_json::json!({"path": "d"}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "already_exists");
    let r = call("Stat", serde_json::json!({"path": "missing"}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "not_found");
    let r = call("ListDir", serde_json::json!({"path": "", "depth": 1}))
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    let names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["d", "f.txt"]);
}
