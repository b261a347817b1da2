//! The registry and the file operations of volumes, on a real file system
//! (a temporary directory). Owners are set with chown, so these run as root.

use std::io::Write;

use siesta_volume::content::Attrs;
use siesta_volume::{EntryKind, VolumeError, VolumePath, Volumes};

fn p(raw: &str) -> VolumePath {
    VolumePath::parse(raw).unwrap()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Chown needs root; under `make test` (SIESTA_TESTS_MUST_RUN) or CI a
/// non-root run fails rather than passing without checking.
fn need_root() -> bool {
    if is_root() {
        return true;
    }
    if std::env::var_os("SIESTA_TESTS_MUST_RUN").is_some() || std::env::var_os("CI").is_some() {
        panic!("these tests set owners with chown: run them as root");
    }
    eprintln!("skipped: not root");
    false
}

fn write(
    fs: &siesta_volume::VolumeFs,
    path: &str,
    data: &[u8],
    force: bool,
) -> Result<siesta_volume::EntryStat, VolumeError> {
    let mut pending = fs.begin_write(&p(path), force)?;
    if data.len() as u64 > pending.budget {
        return Err(fs.full(data.len() as u64));
    }
    pending.file.write_all(data).unwrap();
    fs.commit(pending, Attrs::default())
}

#[test]
fn create_list_get_delete_and_names_stay_unique() {
    if !need_root() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let vols = Volumes::open(home.path(), 64).unwrap();
    let a = vols.create("data", None).unwrap();
    assert!(a.id.starts_with("vol-"));
    assert_eq!(a.size_limit_bytes, 64 << 20);
    assert!(matches!(
        vols.create("data", None),
        Err(VolumeError::NameTaken(_))
    ));
    let b = vols.create("other", Some(2)).unwrap();
    assert_eq!(b.size_limit_bytes, 2 << 20);
    assert_ne!(a.token, b.token);
    assert!(a.token_matches(&a.token) && !a.token_matches(&b.token));
    assert_eq!(vols.get("data").unwrap(), a);
    assert_eq!(vols.get(&a.id).unwrap(), a);
    let names: Vec<String> = vols.list().unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["data", "other"]);
    let data_dir = vols.data_dir(&a);
    let meta = std::fs::metadata(&data_dir).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));

    // Records survive a reopen; a directory without a record does not.
    drop(vols);
    std::fs::create_dir_all(home.path().join("vol-stale/data")).unwrap();
    let vols = Volumes::open(home.path(), 64).unwrap();
    assert!(!home.path().join("vol-stale").exists());
    assert_eq!(vols.get("other").unwrap(), b);

    vols.delete("data").unwrap();
    assert!(!data_dir.exists());
    assert!(matches!(vols.get("data"), Err(VolumeError::NotFound(_))));
    assert!(matches!(vols.delete("data"), Err(VolumeError::NotFound(_))));
    assert!(matches!(
        vols.create("bad name", None),
        Err(VolumeError::BadName { .. })
    ));
    assert!(matches!(
        vols.create("zero", Some(0)),
        Err(VolumeError::BadLimit(_))
    ));
}

#[test]
fn files_and_directories_as_the_content_api_uses_them() {
    if !need_root() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let vols = Volumes::open(home.path(), 64).unwrap();
    let rec = vols.create("files", None).unwrap();
    let fs = vols.content(&rec).unwrap();

    let stat = write(&fs, "/hello.txt", b"hello", false).unwrap();
    assert_eq!(
        (stat.kind, stat.size, stat.mode),
        (EntryKind::File, 5, 0o644)
    );
    assert_eq!(
        (stat.uid, stat.gid, stat.path.as_str(), stat.name.as_str()),
        (1000, 1000, "/hello.txt", "hello.txt")
    );
    assert!(matches!(
        write(&fs, "hello.txt", b"again", false),
        Err(VolumeError::Exists(_))
    ));
    write(&fs, "hello.txt", b"replaced", true).unwrap();
    let (mut file, len) = fs.open_read(&p("/hello.txt")).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).unwrap();
    assert_eq!((text.as_str(), len), ("replaced", 8));

    // Parents: missing without force, made with it.
    assert!(matches!(
        write(&fs, "/a/b/c.txt", b"x", false),
        Err(VolumeError::PathNotFound(_))
    ));
    assert!(matches!(
        fs.make_dir(&p("/a/b"), Attrs::default(), false),
        Err(VolumeError::PathNotFound(_))
    ));
    let dir = fs
        .make_dir(
            &p("/a/b"),
            Attrs {
                uid: Some(1001),
                gid: Some(1002),
                mode: Some(0o750),
            },
            true,
        )
        .unwrap();
    assert_eq!(
        (dir.kind, dir.uid, dir.gid, dir.mode),
        (EntryKind::Directory, 1001, 1002, 0o750)
    );
    assert!(matches!(
        fs.make_dir(&p("/a/b"), Attrs::default(), false),
        Err(VolumeError::Exists(_))
    ));
    fs.make_dir(&p("/a/b"), Attrs::default(), true).unwrap();
    write(&fs, "/a/b/c.txt", b"x", false).unwrap();
    assert!(matches!(
        write(&fs, "/a", b"x", true),
        Err(VolumeError::IsDirectory(_))
    ));
    assert!(matches!(
        write(&fs, "/hello.txt/x", b"x", true),
        Err(VolumeError::NotDirectory(_))
    ));

    let top: Vec<String> = fs
        .list(&VolumePath::root(), 1)
        .unwrap()
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(top, ["/a", "/hello.txt"]);
    let deep: Vec<String> = fs
        .list(&p("/"), 3)
        .unwrap()
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(deep, ["/a", "/a/b", "/a/b/c.txt", "/hello.txt"]);
    assert!(matches!(
        fs.list(&p("/missing"), 1),
        Err(VolumeError::PathNotFound(_))
    ));

    let changed = fs
        .set_attrs(
            &p("/hello.txt"),
            Attrs {
                uid: Some(1001),
                gid: None,
                mode: Some(0o600),
            },
        )
        .unwrap();
    assert_eq!(
        (changed.uid, changed.gid, changed.mode),
        (1001, 1000, 0o600)
    );

    assert!(matches!(
        fs.remove(&VolumePath::root()),
        Err(VolumeError::RemoveRoot)
    ));
    fs.remove(&p("/a")).unwrap();
    assert!(matches!(
        fs.stat(&p("/a/b/c.txt")),
        Err(VolumeError::PathNotFound(_))
    ));
    assert!(matches!(
        fs.remove(&p("/a")),
        Err(VolumeError::PathNotFound(_))
    ));
    // Nothing of the uploads is left beside the data.
    assert_eq!(
        std::fs::read_dir(home.path().join(&rec.id).join("tmp"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn links_out_of_the_volume_are_refused() {
    if !need_root() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let vols = Volumes::open(home.path(), 64).unwrap();
    let rec = vols.create("links", None).unwrap();
    let outside = home.path().join("secret.txt");
    std::fs::write(&outside, "host file").unwrap();
    let data = vols.data_dir(&rec);
    // What a sandbox could plant through its mount.
    std::os::unix::fs::symlink(&outside, data.join("abs")).unwrap();
    std::os::unix::fs::symlink("../../secret.txt", data.join("rel")).unwrap();
    std::os::unix::fs::symlink("/", data.join("rootdir")).unwrap();
    std::fs::write(data.join("inside.txt"), "in").unwrap();
    std::os::unix::fs::symlink("inside.txt", data.join("ok")).unwrap();

    let fs = vols.content(&rec).unwrap();
    for link in ["/abs", "/rel"] {
        let err = fs.open_read(&p(link)).unwrap_err();
        assert!(matches!(err, VolumeError::Escapes { .. }), "{link}: {err}");
        // The link itself is listed and stat'ed as a link.
        let stat = fs.stat(&p(link)).unwrap();
        assert_eq!(stat.kind, EntryKind::Symlink);
    }
    let err = write(&fs, "/rootdir/etc/evil", b"x", true).unwrap_err();
    assert!(matches!(err, VolumeError::Escapes { .. }), "{err}");
    let err = fs.list(&p("/rootdir"), 1).unwrap_err();
    assert!(matches!(err, VolumeError::Escapes { .. }), "{err}");
    assert!(fs.open_read(&p("/ok")).is_ok());
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "host file");
    // Removing a link removes the link, not what it points at.
    fs.remove(&p("/abs")).unwrap();
    assert!(outside.exists());
}

#[test]
fn a_volume_never_holds_more_than_its_limit() {
    if !need_root() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let vols = Volumes::open(home.path(), 64).unwrap();
    let rec = vols.create("small", Some(1)).unwrap();
    let fs = vols.content(&rec).unwrap();
    let mib = vec![7u8; 1 << 20];
    write(&fs, "/full.bin", &mib[..(1 << 20) - 10], false).unwrap();
    let err = write(&fs, "/more.bin", &mib[..100], false).unwrap_err();
    assert!(matches!(err, VolumeError::Full { .. }), "{err}");
    assert!(err.to_string().contains("larger size limit"), "{err}");
    // Replacing a file counts only the difference.
    write(&fs, "/full.bin", &mib, true).unwrap();
    assert_eq!(fs.usage().unwrap(), 1 << 20);
}
