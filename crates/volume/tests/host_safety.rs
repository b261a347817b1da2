//! What a guest (through its NFS mount) or a volume token holder (through
//! the content API) can leave on the host: no setuid or setgid files, no
//! files owned by root (review M4), and no more entries than the size
//! limit pays for (review M2).

mod common;

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use siesta_volume::content::Attrs;
use siesta_volume::nfs::NfsLimits;
use siesta_volume::{VolumeError, VolumePath, Volumes};

const NFS3ERR_NOSPC: u32 = 28;

/// Mode bits, uid and gid of a host file.
fn host(path: &Path) -> (u32, u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.mode() & 0o7777, meta.uid(), meta.gid())
}

fn p(raw: &str) -> VolumePath {
    VolumePath::parse(raw).unwrap()
}

#[test]
fn nfs_cannot_plant_a_setuid_root_file() {
    if !need_root() {
        return;
    }
    let served = Served::new(64, NfsLimits::default());
    std::fs::write(served.data().join("x"), b"#!/bin/sh\n").unwrap();
    let mut c = served.client();
    let root = c.mount_root();
    let x = c.lookup(&root, "x");
    // The review's exploit: chown 0:0, then chmod 4755.
    assert_eq!(c.setattr(&x, None, Some(0), Some(0)), 0);
    assert_eq!(c.setattr(&x, Some(0o4755), None, None), 0);
    assert_eq!(host(&served.data().join("x")), (0o755, 1000, 1000));
    // All at once, and setgid alone.
    assert_eq!(c.setattr(&x, Some(0o6755), Some(0), Some(0)), 0);
    assert_eq!(host(&served.data().join("x")), (0o755, 1000, 1000));
    assert_eq!(c.setattr(&x, Some(0o2711), None, None), 0);
    assert_eq!(host(&served.data().join("x")), (0o711, 1000, 1000));
    // Other owners are kept: only root is squashed.
    assert_eq!(c.setattr(&x, None, Some(1001), Some(1002)), 0);
    assert_eq!(host(&served.data().join("x")), (0o711, 1001, 1002));

    // CREATE with a setuid mode and root as owner.
    let args = Xdr::default()
        .opaque(&root)
        .opaque(b"made")
        .u32(0)
        .u32(1)
        .u32(0o4755)
        .u32(1)
        .u32(0)
        .u32(1)
        .u32(0)
        .bytes(&[0; 12]);
    assert_eq!(c.nfs(8, &args.0).0, 0);
    assert_eq!(host(&served.data().join("made")), (0o755, 1000, 1000));

    // A directory keeps its sticky bit (it grants nothing), not setgid.
    assert_eq!(c.mkdir(&root, "d"), 0);
    let d = c.lookup(&root, "d");
    assert_eq!(c.setattr(&d, Some(0o3777), Some(0), None), 0);
    assert_eq!(host(&served.data().join("d")), (0o1777, 1000, 1000));
}

#[test]
fn the_content_api_cannot_plant_a_setuid_root_file() {
    if !need_root() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let vols = Volumes::open(home.path(), 64).unwrap();
    let rec = vols.create("api", None).unwrap();
    let fs = vols.content(&rec).unwrap();
    let data = vols.data_dir(&rec);
    let root_setuid = Attrs {
        uid: Some(0),
        gid: Some(0),
        mode: Some(0o4755),
    };

    // An upload with ?uid=0&gid=0&mode=4755.
    let mut pending = fs.begin_write(&p("/x"), false).unwrap();
    pending.file.write_all(b"#!/bin/sh\n").unwrap();
    let stat = fs.commit(pending, root_setuid).unwrap();
    assert_eq!((stat.mode, stat.uid, stat.gid), (0o755, 1000, 1000));
    assert_eq!(host(&data.join("x")), (0o755, 1000, 1000));

    // A metadata update of an existing file.
    std::fs::write(data.join("y"), b"y").unwrap();
    fs.set_attrs(
        &p("/y"),
        Attrs {
            mode: Some(0o6755),
            ..root_setuid
        },
    )
    .unwrap();
    assert_eq!(host(&data.join("y")), (0o755, 1000, 1000));

    // A directory asked setgid and root's.
    fs.make_dir(
        &p("/d"),
        Attrs {
            mode: Some(0o2775),
            ..root_setuid
        },
        false,
    )
    .unwrap();
    assert_eq!(host(&data.join("d")), (0o775, 1000, 1000));
}

#[test]
fn the_volumes_directory_is_the_servers_alone() {
    if !need_root() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("volumes");
    // As an older siesta, under umask 022, left it.
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    drop(Volumes::open(&dir, 64).unwrap());
    assert_eq!(host(&dir).0, 0o700);
}

#[test]
fn mkdir_through_nfs_stops_at_the_limit() {
    if !need_root() {
        return;
    }
    // 1 MiB pays for 256 entries of 4 KiB.
    let served = Served::new(1, NfsLimits::default());
    let mut c = served.client();
    let root = c.mount_root();
    let mut made = 0;
    let last = loop {
        let status = c.mkdir(&root, &format!("d{made}"));
        if status != 0 || made > 1000 {
            break status;
        }
        made += 1;
    };
    assert_eq!((made, last), (256, NFS3ERR_NOSPC));
    // Removing one gives its room back.
    let rmdir = Xdr::default().opaque(&root).opaque(b"d0");
    assert_eq!(c.nfs(13, &rmdir.0).0, 0);
    assert_eq!(c.mkdir(&root, "again"), 0);
    assert_eq!(c.mkdir(&root, "one-more"), NFS3ERR_NOSPC);
}

#[test]
fn mkdir_and_empty_files_through_the_api_stop_at_the_limit() {
    if !need_root() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let vols = Volumes::open(home.path(), 64).unwrap();
    let rec = vols.create("small", Some(1)).unwrap();
    let fs = vols.content(&rec).unwrap();
    let mut made = 0;
    let err = loop {
        match fs.make_dir(&p(&format!("/d{made}")), Attrs::default(), false) {
            Ok(_) if made < 1000 => made += 1,
            Ok(_) => panic!("no limit"),
            Err(e) => break e,
        }
    };
    assert_eq!(made, 256);
    assert!(matches!(err, VolumeError::Full { .. }), "{err}");
    // An empty file costs a block too.
    assert!(matches!(
        fs.begin_write(&p("/empty"), false),
        Err(VolumeError::Full { .. })
    ));
    // parents=true on what exists costs nothing.
    fs.make_dir(&p("/d1"), Attrs::default(), true).unwrap();
    assert_eq!(fs.usage().unwrap(), 1 << 20);
}
