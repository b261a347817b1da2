//! `prepare_guest` on trees as a hostile image leaves them: the files and
//! directories it edits are symbolic links, absolute and relative (`../..`
//! past the root), to canaries in a directory outside the root. Whatever
//! the build says, no canary may change by a byte, a mode or an owner, and
//! nothing may appear outside the root.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::*;

/// What a directory holds, recursively: path, kind, mode, owner, bytes.
type Snapshot = BTreeMap<PathBuf, (String, u32, u32, u32, Vec<u8>)>;

fn snapshot(dir: &Path, skip: Option<&Path>) -> Snapshot {
    let mut out = Snapshot::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if Some(p.as_path()) == skip {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let (kind, bytes) = if m.file_type().is_symlink() {
                (
                    "link",
                    std::fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                )
            } else if m.is_dir() {
                stack.push(p.clone());
                ("dir", Vec::new())
            } else {
                ("file", std::fs::read(&p).unwrap())
            };
            out.insert(p, (kind.into(), m.mode(), m.uid(), m.gid(), bytes));
        }
    }
    out
}

/// The canaries: files like the host's, one not UTF-8 (as a database is),
/// and directories with a file each.
fn canaries(outside: &Path) {
    std::fs::write(outside.join("passwd"), b"SQLite format 3\0\xff\xfe binary").unwrap();
    for name in [
        "group",
        "shadow",
        "resolv.conf",
        "machine-id",
        "hostname",
        "hosts",
        "agent",
        "bash",
    ] {
        std::fs::write(outside.join(name), format!("host {name}\n")).unwrap();
        std::fs::set_permissions(outside.join(name), std::fs::Permissions::from_mode(0o600))
            .unwrap();
    }
    for dir in ["sudoers.d", "home", "user", "etc"] {
        std::fs::create_dir(outside.join(dir)).unwrap();
        std::fs::write(outside.join(dir).join("keep"), b"keep").unwrap();
    }
    for name in ["passwd", "group", "shadow", "hosts"] {
        std::fs::write(outside.join("etc").join(name), format!("host etc/{name}\n")).unwrap();
    }
}

/// A small image: root's accounts (no `user`), a shell, a home.
fn image_tree(root: &Path) {
    for d in ["etc/sudoers.d", "bin", "home", "usr/local/bin"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
    std::fs::write(root.join("etc/shadow"), "root:*:19000:0:99999:7:::\n").unwrap();
    std::fs::write(root.join("bin/sh"), b"").unwrap();
}

/// `rel` in the tree replaced by a link to `target` (absolute, or as
/// `../` enough times to climb past `/` and down to it).
fn plant(root: &Path, rel: &str, target: &Path, relative: bool) {
    let at = root.join(rel);
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    match std::fs::symlink_metadata(&at) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&at).unwrap(),
        Ok(_) => std::fs::remove_file(&at).unwrap(),
        Err(_) => {}
    }
    let link = if relative {
        let up = "../".repeat(at.components().count() + 2);
        PathBuf::from(up).join(target.strip_prefix("/").unwrap())
    } else {
        target.to_path_buf()
    };
    std::os::unix::fs::symlink(link, &at).unwrap();
}

/// The tree's entry `rel` links to `canary`; `prepare_guest` runs. Returns
/// its error, if any, after checking that nothing outside changed.
fn attack(rel: &str, canary: &str, relative: bool) -> Option<String> {
    let work = tempfile::tempdir().unwrap();
    let outside_dir = tempfile::tempdir().unwrap();
    let outside = outside_dir.path();
    canaries(outside);
    let root = work.path().join("root");
    image_tree(&root);
    plant(&root, rel, &outside.join(canary), relative);
    let agent = work.path().join("agent");
    std::fs::write(&agent, b"\x7fELF").unwrap();
    let before = (snapshot(outside, None), snapshot(work.path(), Some(&root)));
    let result = prepare_guest(&root, &agent);
    let after = (snapshot(outside, None), snapshot(work.path(), Some(&root)));
    let how = if relative { "relative" } else { "absolute" };
    assert_eq!(
        before.0, after.0,
        "/{rel} -> {how} {canary}: a canary changed"
    );
    assert_eq!(
        before.1, after.1,
        "/{rel} -> {how} {canary}: a file appeared beside the root"
    );
    result.err().map(|e| e.to_string())
}

#[test]
fn links_to_host_files_and_directories_never_reach_them() {
    // (entry, canary, what the build does): an error naming the entry, or
    // success where siesta replaces the entry or skips it.
    let cases: &[(&str, &str, Option<&str>)] = &[
        (
            "etc/passwd",
            "passwd",
            Some("/etc/passwd is a symbolic link"),
        ),
        ("etc/group", "group", Some("/etc/group is a symbolic link")),
        // A shadow file that is not in the image is not written.
        ("etc/shadow", "shadow", None),
        (
            "etc/sudoers.d",
            "sudoers.d",
            Some("/etc/sudoers.d is a symbolic link"),
        ),
        ("home", "home", Some("/home is a symbolic link")),
        ("home/user", "user", Some("/home/user is a symbolic link")),
        ("etc", "etc", Some("/etc is a symbolic link")),
        // Files siesta owns: the link is replaced.
        ("etc/resolv.conf", "resolv.conf", None),
        ("etc/machine-id", "machine-id", None),
        ("etc/hostname", "hostname", None),
        ("etc/hosts", "hosts", None),
        ("usr/local/bin/siesta-agent", "agent", None),
        ("bin/bash", "bash", None),
    ];
    for relative in [false, true] {
        for (rel, canary, expect) in cases {
            let got = attack(rel, canary, relative);
            match (expect, &got) {
                (None, None) => {}
                (Some(want), Some(e)) => assert!(e.contains(want), "/{rel}: {e}"),
                _ => panic!("/{rel} (relative: {relative}): expected {expect:?}, got {got:?}"),
            }
        }
    }
}

#[test]
fn replaced_links_become_the_guests_own_files() {
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    canaries(outside.path());
    let root = work.path().join("root");
    image_tree(&root);
    plant(
        &root,
        "etc/resolv.conf",
        &outside.path().join("resolv.conf"),
        false,
    );
    plant(
        &root,
        "etc/machine-id",
        &outside.path().join("machine-id"),
        true,
    );
    let agent = work.path().join("agent");
    std::fs::write(&agent, b"\x7fELF").unwrap();
    prepare_guest(&root, &agent).unwrap();
    for (rel, mode) in [("etc/resolv.conf", 0o644), ("etc/machine-id", 0o444)] {
        let m = std::fs::symlink_metadata(root.join(rel)).unwrap();
        assert!(m.is_file(), "/{rel} is still a link");
        assert_eq!(
            (m.len(), m.mode() & 0o7777, m.uid()),
            (0, mode, 0),
            "/{rel}"
        );
    }
}

#[test]
fn links_inside_the_image_resolve_as_the_guest_sees_them() {
    let work = tempfile::tempdir().unwrap();
    // The image keeps its accounts in /<top>/lib, a directory the host does
    // not have: code that followed the links on the host could not write.
    let top = work
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(!Path::new("/").join(&top).exists());
    for relative in [false, true] {
        let root = work.path().join(format!("root-{relative}"));
        image_tree(&root);
        let lib = root.join(&top).join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        for name in ["passwd", "group"] {
            std::fs::rename(root.join("etc").join(name), lib.join(name)).unwrap();
            let target = if relative {
                format!("../{top}/lib/{name}")
            } else {
                format!("/{top}/lib/{name}")
            };
            std::os::unix::fs::symlink(target, root.join("etc").join(name)).unwrap();
        }
        let agent = work.path().join("agent");
        std::fs::write(&agent, b"\x7fELF").unwrap();
        prepare_guest(&root, &agent).unwrap_or_else(|e| panic!("relative {relative}: {e}"));
        let text = std::fs::read_to_string(lib.join("passwd")).unwrap();
        assert!(
            text.ends_with("\nuser:x:1000:1000:user:/home/user:/bin/bash\n"),
            "relative {relative}: {text}"
        );
        let groups = std::fs::read_to_string(lib.join("group")).unwrap();
        assert!(
            groups.ends_with("\nuser:x:1000:\n"),
            "relative {relative}: {groups}"
        );
        assert!(std::fs::symlink_metadata(root.join("etc/passwd"))
            .unwrap()
            .file_type()
            .is_symlink());
    }
    assert!(!Path::new("/").join(&top).exists());
}

#[test]
fn account_files_that_are_not_files_fail_the_build_by_name() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    image_tree(&root);
    std::fs::remove_file(root.join("etc/group")).unwrap();
    std::fs::create_dir(root.join("etc/group")).unwrap();
    let agent = work.path().join("agent");
    std::fs::write(&agent, b"\x7fELF").unwrap();
    let e = prepare_guest(&root, &agent).unwrap_err().to_string();
    assert!(
        e.contains("/etc/group is a directory, not a regular file"),
        "{e}"
    );
}

/// A layer tar.gz of `entries` (path, link target or file bytes) in `store`.
fn layer(store: &BlobStore, entries: &[(&str, Result<&Path, &[u8]>)]) -> String {
    use std::io::Write;
    let mut b = tar::Builder::new(Vec::new());
    for (path, what) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        match what {
            Ok(target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, path, target).unwrap();
            }
            Err(bytes) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(bytes.len() as u64);
                b.append_data(&mut h, path, *bytes).unwrap();
            }
        }
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&b.into_inner().unwrap()).unwrap();
    store
        .insert(&mut gz.finish().unwrap().as_slice(), None)
        .unwrap()
}

fn image_of(layers: Vec<String>) -> Image {
    Image {
        reference: "test".into(),
        digest: "sha256:00".into(),
        config: Default::default(),
        layers,
        fetched_layers: 0,
        cached_layers: 0,
        fetched_bytes: 0,
    }
}

#[test]
fn a_built_image_with_a_passwd_link_to_the_host_fails_and_leaves_nothing() {
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    canaries(outside.path());
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let canary = outside.path().join("passwd");
    let evil = layer(
        &store,
        &[("bin/sh", Err(b"")), ("etc/passwd", Ok(canary.as_path()))],
    );
    let root = work.path().join("rootfs");
    let agent = work.path().join("agent");
    std::fs::write(&agent, b"\x7fELF").unwrap();
    let before = snapshot(outside.path(), None);
    let e = unpack_and_prepare(
        &store,
        &image_of(vec![evil]),
        &root,
        &agent,
        &ImageLimits::DEFAULT,
    )
    .err()
    .expect("the build went on")
    .to_string();
    assert!(e.contains("/etc/passwd is a symbolic link"), "{e}");
    assert_eq!(before, snapshot(outside.path(), None));
    assert!(!root.exists(), "the tree was left behind");
}

#[test]
fn a_gzip_bomb_fails_the_build_naming_the_limit_and_leaves_nothing() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let zeros = vec![0u8; 4 << 20];
    let bomb = layer(&store, &[("bin/sh", Err(b"")), ("zeros", Err(&zeros))]);
    let root = work.path().join("rootfs");
    let agent = work.path().join("agent");
    std::fs::write(&agent, b"\x7fELF").unwrap();
    let limits = ImageLimits {
        max_unpacked_bytes: 1 << 20,
        ..ImageLimits::DEFAULT
    };
    let e = unpack_and_prepare(
        &store,
        &image_of(vec![bomb.clone()]),
        &root,
        &agent,
        &limits,
    )
    .err()
    .expect("the bomb was unpacked");
    assert!(
        matches!(e, Error::Image(siesta_image::ImageError::TooLarge { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("more than 1.0 MiB"), "{e}");
    assert!(!root.exists(), "a partial tree was left behind");
    // Within the default limits the same image builds, `user` and all.
    let ok = unpack_and_prepare(
        &store,
        &image_of(vec![bomb]),
        &root,
        &agent,
        &ImageLimits::DEFAULT,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ok.defaults.guest.user, "user");
    assert!(std::fs::read_to_string(root.join("etc/passwd"))
        .unwrap()
        .contains("user:x:1000:"));
}
