//! The agent's `/files`, `/init`, `/envs`, `/health` endpoints over real HTTP
//! on a loopback socket, and the filesystem service on a real directory
//! tree (including inotify watchers).

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use siesta_agent::filesystem::{xattr, FilesystemService};
use siesta_agent::rpc::{Code, RequestContext};
use siesta_agent::state::AgentState;
use siesta_agent::users::UserDb;
use siesta_envd_proto::filesystem::*;

/// A temporary guest: a passwd with `user` (the test's own uid, so chown
/// works unprivileged) and `other` (a stranger), homes under a temp dir.
struct Guest {
    dir: tempfile::TempDir,
    state: AgentState,
    base: String,
    http: reqwest::Client,
}

impl Guest {
    async fn start() -> Guest {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let uid = unsafe { libc::getuid() };
        let gid = unsafe { libc::getgid() };
        let home = root.join("home/user");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(root.join("home/other")).unwrap();
        let passwd = root.join("passwd");
        let group = root.join("group");
        std::fs::write(
            &passwd,
            format!(
                "root:x:0:0:root:/root:/bin/sh\nuser:x:{uid}:{gid}::{}:/bin/sh\nother:x:54321:54321::{}:/bin/sh\n",
                home.display(),
                root.join("home/other").display()
            ),
        )
        .unwrap();
        std::fs::write(
            &group,
            format!("root:x:0:\nusers:x:{gid}:\nother:x:54321:\n"),
        )
        .unwrap();
        let state = AgentState::new(UserDb { passwd, group });
        // What `/init defaultUser` sets in a sandbox: the SDK sends no user.
        state.defaults.write().await.user = Some("user".into());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(siesta_agent::serve(listener, state.clone()));
        Guest {
            dir,
            state,
            base,
            http: reqwest::Client::new(),
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home/user")
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn files_url(&self, path: &str) -> String {
        let mut u = reqwest::Url::parse(&self.url("/files")).unwrap();
        u.query_pairs_mut().append_pair("path", path);
        u.to_string()
    }
}

fn ctx(user: &str) -> RequestContext {
    RequestContext {
        user: user.to_string(),
        timeout: None,
        keepalive: None,
    }
}

async fn error_json(resp: reqwest::Response, status: u16) -> String {
    assert_eq!(resp.status().as_u16(), status);
    let v: serde_json::Value = resp.json().await.expect("error body is JSON");
    assert_eq!(v["code"], status);
    v["message"].as_str().expect("message").to_string()
}

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

#[tokio::test]
async fn filesystem_rpcs() {
    let g = Guest::start().await;
    let fs = &g.state.filesystem;
    let c = ctx("user");
    let home = g.home();

    // MakeDir: parents created; a second call is already_exists.
    let made = fs
        .make_dir(
            &c,
            MakeDirRequest {
                path: "a/b/c".into(),
            },
        )
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(made.path, home.join("a/b/c").to_str().unwrap());
    assert_eq!(made.r#type, FileType::Directory as i32);
    // `user` shares the test's uid; as root, the passwd's first entry wins.
    let me = if unsafe { libc::getuid() } == 0 {
        "root"
    } else {
        "user"
    };
    assert_eq!(made.owner, me);
    assert!(made.permissions.starts_with('d'));
    let err = fs
        .make_dir(
            &c,
            MakeDirRequest {
                path: "a/b/c".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::AlreadyExists);

    std::fs::write(home.join("a/f.txt"), b"12345").unwrap();
    std::fs::write(home.join("a/b/g.txt"), b"").unwrap();
    std::os::unix::fs::symlink(home.join("a/b"), home.join("a/link")).unwrap();

    // Stat.
    let st = fs
        .stat(
            &c,
            StatRequest {
                path: "~/a/f.txt".into(),
            },
        )
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(
        (st.name.as_str(), st.size, st.r#type),
        ("f.txt", 5, FileType::File as i32)
    );
    assert_eq!(
        st.mode,
        std::fs::metadata(home.join("a/f.txt")).unwrap().mode() & 0o777
    );
    let err = fs
        .stat(
            &c,
            StatRequest {
                path: "missing".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);

    // ListDir: depth 0 and 1 are the children; 2 goes one level deeper.
    let names = |entries: &[EntryInfo]| -> Vec<String> {
        entries
            .iter()
            .map(|e| {
                e.path
                    .trim_start_matches(home.to_str().unwrap())
                    .to_string()
            })
            .collect()
    };
    for depth in [0, 1] {
        let l = fs
            .list_dir(
                &c,
                ListDirRequest {
                    path: "a".into(),
                    depth,
                },
            )
            .await
            .unwrap();
        assert_eq!(names(&l.entries), ["/a/b", "/a/f.txt", "/a/link"]);
    }
    let l = fs
        .list_dir(
            &c,
            ListDirRequest {
                path: "a".into(),
                depth: 2,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        names(&l.entries),
        ["/a/b", "/a/b/c", "/a/b/g.txt", "/a/f.txt", "/a/link"]
    );
    let link = l.entries.iter().find(|e| e.name == "link").unwrap();
    assert!(link.is_symlink);
    assert_eq!(link.r#type, FileType::Directory as i32);
    let err = fs
        .list_dir(
            &c,
            ListDirRequest {
                path: "nowhere".into(),
                depth: 1,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);
    let err = fs
        .list_dir(
            &c,
            ListDirRequest {
                path: "a/f.txt".into(),
                depth: 1,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);

    // Move (into a directory that does not exist yet) and Remove.
    let moved = fs
        .move_(
            &c,
            MoveRequest {
                source: "a/f.txt".into(),
                destination: "z/renamed.txt".into(),
            },
        )
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(moved.name, "renamed.txt");
    assert!(!home.join("a/f.txt").exists());
    let err = fs
        .move_(
            &c,
            MoveRequest {
                source: "a/f.txt".into(),
                destination: "x".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);
    fs.remove(&c, RemoveRequest { path: "a".into() })
        .await
        .unwrap();
    assert!(!home.join("a").exists());
    fs.remove(
        &c,
        RemoveRequest {
            path: "z/renamed.txt".into(),
        },
    )
    .await
    .unwrap();
    let err = fs
        .remove(&c, RemoveRequest { path: "a".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);
}

/// Polls GetWatcherEvents until `pred` holds for the collected events.
async fn poll_until(
    fs: &FilesystemService,
    id: &str,
    pred: impl Fn(&[FilesystemEvent]) -> bool,
) -> Vec<FilesystemEvent> {
    let mut all = Vec::new();
    for _ in 0..100 {
        let r = fs
            .get_watcher_events(
                &ctx("user"),
                GetWatcherEventsRequest {
                    watcher_id: id.into(),
                },
            )
            .await
            .unwrap();
        all.extend(r.events);
        if pred(&all) {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("events never matched: {all:?}");
}

fn has(events: &[FilesystemEvent], name: &str, ty: EventType) -> bool {
    events
        .iter()
        .any(|e| e.name == name && e.r#type == ty as i32)
}

#[tokio::test]
async fn polled_watcher_sees_create_write_remove_recursively() {
    let g = Guest::start().await;
    let fs = &g.state.filesystem;
    let dir = g.home().join("w");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let id = fs
        .create_watcher(
            &ctx("user"),
            CreateWatcherRequest {
                path: "w".into(),
                recursive: true,
                include_entry: true,
                allow_network_mounts: false,
            },
        )
        .await
        .unwrap()
        .watcher_id;

    write_then_remove(&dir.join("f.txt"));
    // A directory created after the watch started is watched too.
    std::fs::create_dir(dir.join("new")).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(dir.join("new/inner.txt"), b"x").unwrap();
    std::fs::write(dir.join("sub/deep.txt"), b"x").unwrap();

    let events = poll_until(fs, &id, |ev| {
        has(ev, "f.txt", EventType::Remove)
            && has(ev, "new/inner.txt", EventType::Create)
            && has(ev, "sub/deep.txt", EventType::Create)
    })
    .await;
    assert!(has(&events, "f.txt", EventType::Create), "{events:?}");
    assert!(has(&events, "f.txt", EventType::Write), "{events:?}");
    assert!(has(&events, "new", EventType::Create), "{events:?}");
    let created = events.iter().find(|e| e.name == "sub/deep.txt").unwrap();
    assert_eq!(
        created.entry.as_ref().map(|e| e.name.as_str()),
        Some("deep.txt")
    );

    // Polling drained the buffer.
    let r = fs
        .get_watcher_events(
            &ctx("user"),
            GetWatcherEventsRequest {
                watcher_id: id.clone(),
            },
        )
        .await
        .unwrap();
    assert!(r.events.iter().all(|e| e.name != "f.txt"));

    fs.remove_watcher(
        &ctx("user"),
        RemoveWatcherRequest {
            watcher_id: id.clone(),
        },
    )
    .await
    .unwrap();
    let err = fs
        .get_watcher_events(
            &ctx("user"),
            GetWatcherEventsRequest {
                watcher_id: id.clone(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);
    let err = fs
        .remove_watcher(&ctx("user"), RemoveWatcherRequest { watcher_id: id })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);
    let err = fs
        .create_watcher(
            &ctx("user"),
            CreateWatcherRequest {
                path: "absent".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);
}

fn write_then_remove(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(b"data").unwrap();
    drop(f);
    std::fs::remove_file(path).unwrap();
}

#[tokio::test]
async fn watch_dir_stream_starts_then_streams_events_and_keepalives() {
    let g = Guest::start().await;
    let dir = g.home().join("s");
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = ctx("user");
    c.keepalive = Some(Duration::from_millis(200));
    let mut stream = g
        .state
        .filesystem
        .watch_dir(
            &c,
            WatchDirRequest {
                path: "s".into(),
                recursive: false,
                include_entry: false,
                allow_network_mounts: false,
            },
        )
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert!(matches!(
        first.event,
        Some(watch_dir_response::Event::Start(_))
    ));

    write_then_remove(&dir.join("x.txt"));
    let mut seen = Vec::new();
    let mut keepalive = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !(keepalive && has(&seen, "x.txt", EventType::Remove)) {
        let item = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("stream stalled")
            .unwrap()
            .unwrap();
        match item.event {
            Some(watch_dir_response::Event::Filesystem(ev)) => seen.push(ev),
            Some(watch_dir_response::Event::Keepalive(_)) => keepalive = true,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        has(&seen, "x.txt", EventType::Create) && has(&seen, "x.txt", EventType::Write),
        "{seen:?}"
    );

    let err = g
        .state
        .filesystem
        .watch_dir(
            &c,
            WatchDirRequest {
                path: "s/../nope".into(),
                ..Default::default()
            },
        )
        .await
        .err()
        .unwrap();
    assert_eq!(err.code, Code::NotFound);
}
