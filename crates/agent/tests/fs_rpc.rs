//! The filesystem service on a real directory tree, called directly:
//! Stat/MakeDir/Move/ListDir/Remove and inotify watchers (polled and
//! streamed).

mod common;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::{ctx, Guest};
use futures::StreamExt;
use siesta_agent::filesystem::FilesystemService;
use siesta_agent::rpc::Code;
use siesta_envd_proto::filesystem::*;

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
    // SAFETY: getuid has no preconditions and cannot fail.
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
    // Removing what is gone succeeds, as in envd.
    fs.remove(&c, RemoveRequest { path: "a".into() })
        .await
        .expect("removing a missing path succeeds");
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
