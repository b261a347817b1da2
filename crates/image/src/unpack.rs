//! Applying an image's layers, in order, to a directory: the root file
//! system of a template.
//!
//! Each layer is read twice from the cache. The first pass applies its
//! whiteouts to what the lower layers left (`.wh.NAME` removes `NAME`;
//! `.wh..wh..opq` empties its directory), the second unpacks its entries
//! with owners, modes, times and extended attributes. Deletions therefore
//! never touch the layer's own files, whatever order its tar has them in.
//! Device nodes are skipped (the guest has devtmpfs); no entry may leave the
//! root, through `..` or through a symbolic link.
//!
//! The first pass also counts the image's entries and the bytes they
//! declare against [`ImageLimits`], so a gzip bomb is refused from its tar
//! headers before its data is written; the decompressed stream itself is
//! capped too. A failed unpack removes the root it made.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path, PathBuf};

use flate2::read::MultiGzDecoder;

use crate::error::{chain, ImageError, IoContext, Result};
use crate::limits::ImageLimits;
use crate::registry::short;

mod budget;
use crate::store::BlobStore;
use budget::{read_error, Budget, Capped};

const OPAQUE: &str = ".wh..wh..opq";
const WHITEOUT: &str = ".wh.";

/// What unpacking did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UnpackStats {
    pub layers: usize,
    pub entries: u64,
    pub whiteouts: u64,
    pub skipped_devices: u64,
}

/// Applies `layers` (digests in the store, lowest first) to `root`, within
/// `limits`. When `root` did not exist and unpacking fails, it is removed:
/// no partial tree is left behind.
pub fn unpack_layers(
    store: &BlobStore,
    layers: &[String],
    root: &Path,
    limits: &ImageLimits,
) -> Result<UnpackStats> {
    let made = std::fs::symlink_metadata(root).is_err();
    std::fs::create_dir_all(root).ctx("creating the root directory", root)?;
    let unpacked = unpack_all(store, layers, root, limits);
    if unpacked.is_err() && made {
        let _ = std::fs::remove_dir_all(root);
    }
    unpacked
}

fn unpack_all(
    store: &BlobStore,
    layers: &[String],
    root: &Path,
    limits: &ImageLimits,
) -> Result<UnpackStats> {
    let mut stats = UnpackStats::default();
    let mut budget = Budget::new(limits);
    for digest in layers {
        let blob = store.path(digest)?;
        let cap = budget.stream_cap();
        apply_whiteouts(&blob, root, &mut stats, &mut budget, cap).map_err(|e| lift(e, digest))?;
        unpack_entries(&blob, root, &mut stats, cap).map_err(|e| lift(e, digest))?;
        stats.layers += 1;
    }
    Ok(stats)
}

/// An error inside a layer, named by its digest.
fn lift(e: LayerError, digest: &str) -> ImageError {
    let digest = short(digest).to_string();
    match e {
        LayerError::Image(i) => i,
        LayerError::Bad(detail) => ImageError::BadLayer { digest, detail },
        LayerError::TooLarge(detail) => ImageError::TooLarge {
            subject: format!("layer {digest}"),
            detail,
        },
    }
}

enum LayerError {
    Image(ImageError),
    Bad(String),
    /// Over one of the image's limits.
    TooLarge(String),
}

impl From<ImageError> for LayerError {
    fn from(e: ImageError) -> Self {
        LayerError::Image(e)
    }
}

type LayerResult<T> = std::result::Result<T, LayerError>;

/// The layer's tar stream, decompressed by what its first bytes say, and
/// cut off (an error) after `cap` bytes.
fn open_layer(blob: &Path, cap: u64) -> LayerResult<tar::Archive<Box<dyn Read>>> {
    let mut file = BufReader::new(File::open(blob).ctx("opening a cached layer", blob)?);
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut file, &mut magic).ctx("reading a cached layer", blob)?;
    let head = std::io::Cursor::new(magic[..n].to_vec());
    let stream: Box<dyn Read> = Box::new(head.chain(file));
    let reader: Box<dyn Read> = match magic {
        [0x1f, 0x8b, ..] => Box::new(MultiGzDecoder::new(stream)),
        [0x28, 0xb5, 0x2f, 0xfd] => {
            return Err(LayerError::Bad(
                "zstd-compressed layers are not supported yet; recompress it with gzip".into(),
            ))
        }
        _ => stream,
    };
    Ok(tar::Archive::new(Box::new(Capped {
        inner: reader,
        left: cap,
    })))
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// A member's path split into its normal components; `..` is refused.
fn member_path(raw: &Path) -> LayerResult<Vec<String>> {
    let mut parts = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                return Err(LayerError::Bad(format!(
                    "entry {} leaves the image root (`..`)",
                    raw.display()
                )))
            }
        }
    }
    Ok(parts)
}

/// `root/parts...`, refusing a path whose parent directories pass through a
/// symbolic link (it could point anywhere on the host).
fn inside(root: &Path, parts: &[String]) -> LayerResult<PathBuf> {
    let mut p = root.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        p.push(part);
        if i + 1 < parts.len() {
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                if m.file_type().is_symlink() {
                    return Err(LayerError::Bad(format!(
                        "entry /{} passes through the symbolic link /{}",
                        parts.join("/"),
                        parts[..=i].join("/")
                    )));
                }
            }
        }
    }
    Ok(p)
}

/// The first pass: whiteouts, and every entry counted against `budget`.
fn apply_whiteouts(
    blob: &Path,
    root: &Path,
    stats: &mut UnpackStats,
    budget: &mut Budget,
    cap: u64,
) -> LayerResult<()> {
    let mut archive = open_layer(blob, cap)?;
    let entries = archive.entries().map_err(|e| read_error(e, blob))?;
    for entry in entries {
        let entry = entry.map_err(|e| read_error(e, blob))?;
        // Before its data is read: a bomb fails here, on its header.
        budget.take(entry.size())?;
        let parts = member_path(&entry.path().ctx("reading a layer entry's name", blob)?)?;
        let Some((name, dir)) = parts.split_last() else {
            continue;
        };
        if name == OPAQUE {
            let d = inside(root, dir)?;
            if std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir()) {
                for child in std::fs::read_dir(&d).ctx("reading a directory to empty it", &d)? {
                    let child = child.ctx("reading a directory to empty it", &d)?;
                    remove(&child.path())?;
                }
            }
            stats.whiteouts += 1;
        } else if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            let mut target = dir.to_vec();
            target.push(hidden.to_string());
            remove(&inside(root, &target)?)?;
            stats.whiteouts += 1;
        }
    }
    Ok(())
}

fn remove(p: &Path) -> LayerResult<()> {
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return Ok(());
    };
    let r = if m.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    };
    r.ctx("removing a whited-out path", p)?;
    Ok(())
}

fn unpack_entries(blob: &Path, root: &Path, stats: &mut UnpackStats, cap: u64) -> LayerResult<()> {
    let mut archive = open_layer(blob, cap)?;
    // Numeric owners (never mapped through the host's user names), set
    // before the mode so set-uid bits survive.
    archive.set_preserve_ownerships(true);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(true);
    archive.set_overwrite(true);
    let entries = archive.entries().map_err(|e| read_error(e, blob))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| read_error(e, blob))?;
        let raw = entry
            .path()
            .ctx("reading a layer entry's name", blob)?
            .into_owned();
        let parts = member_path(&raw)?;
        let Some(name) = parts.last() else { continue };
        if name.starts_with(WHITEOUT) {
            continue;
        }
        let kind = entry.header().entry_type();
        if kind.is_character_special() || kind.is_block_special() {
            stats.skipped_devices += 1;
            continue;
        }
        let target = inside(root, &parts)?;
        implied_parents(root, &parts)?;
        replace_other_kind(&target, kind.is_dir())?;
        let unpacked = entry.unpack_in(root).map_err(|e| {
            LayerError::Bad(format!("unpacking /{}: {}", parts.join("/"), chain(&e)))
        })?;
        if !unpacked {
            return Err(LayerError::Bad(format!(
                "entry {} leaves the image root",
                raw.display()
            )));
        }
        stats.entries += 1;
    }
    Ok(())
}

/// Creates the parents of an entry that no entry of the layer listed, as
/// 0755 directories (an image's `/usr/local` may exist only as the parent
/// of its files). The tar crate would create them with the process's
/// umask, which is 077 in siesta: the guest's `user` could not enter them.
fn implied_parents(root: &Path, parts: &[String]) -> LayerResult<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut dir = root.to_path_buf();
    for part in &parts[..parts.len().saturating_sub(1)] {
        dir.push(part);
        match std::fs::create_dir(&dir) {
            Ok(()) => std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                .ctx("setting the mode of an implied directory", &dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => Err(e).ctx("creating an implied directory", &dir)?,
        }
    }
    Ok(())
}

/// A directory replacing a file (or a file replacing a directory) from a
/// lower layer: the lower one goes first, as in an overlay.
fn replace_other_kind(target: &Path, new_is_dir: bool) -> LayerResult<()> {
    if let Ok(m) = std::fs::symlink_metadata(target) {
        if m.is_dir() != new_is_dir {
            remove(target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    enum E<'a> {
        File(&'a str, &'a [u8], u32, u64),
        Dir(&'a str),
        Link(&'a str, &'a str),
        Dev(&'a str),
    }

    /// A layer tar (gzip when `gz`) in the store; returns its digest.
    fn layer(store: &BlobStore, entries: &[E], gz: bool) -> String {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1_700_000_000);
            match e {
                E::File(p, data, mode, uid) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(data.len() as u64);
                    h.set_mode(*mode);
                    h.set_uid(*uid);
                    h.set_gid(*uid);
                    b.append_data(&mut h, p, *data).unwrap();
                }
                E::Dir(p) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    b.append_data(&mut h, p, &[][..]).unwrap();
                }
                E::Link(p, to) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, p, to).unwrap();
                }
                E::Dev(p) => {
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_size(0);
                    h.set_mode(0o666);
                    b.append_data(&mut h, p, &[][..]).unwrap();
                }
            }
        }
        let bytes = b.into_inner().unwrap();
        let bytes = if gz {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&bytes).unwrap();
            enc.finish().unwrap()
        } else {
            bytes
        };
        store.insert(&mut bytes.as_slice(), None).unwrap()
    }

    fn setup() -> (tempfile::TempDir, BlobStore, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let root = dir.path().join("root");
        (dir, store, root)
    }

    #[test]
    fn upper_layers_replace_and_white_out_lower_ones() {
        let (_d, store, root) = setup();
        let lower = layer(
            &store,
            &[
                E::Dir("etc"),
                E::File("etc/keep", b"lower", 0o644, 0),
                E::File("etc/gone", b"x", 0o644, 0),
                E::Dir("opt/app"),
                E::File("opt/app/old", b"old", 0o644, 0),
                E::File("was-file", b"f", 0o644, 0),
                E::File("usr/bin/sudo", b"#!", 0o4755, 0),
            ],
            true,
        );
        let upper = layer(
            &store,
            &[
                // The layer's own file comes before the opaque marker: it stays.
                E::File("opt/app/new", b"new", 0o600, 1000),
                E::File("opt/app/.wh..wh..opq", b"", 0o644, 0),
                E::File("etc/.wh.gone", b"", 0o644, 0),
                E::File("etc/keep", b"upper", 0o644, 0),
                E::Dir("was-file"),
                E::Dev("dev/null"),
            ],
            false,
        );
        let stats = unpack_layers(&store, &[lower, upper], &root, &ImageLimits::DEFAULT).unwrap();
        assert_eq!(stats.layers, 2);
        assert_eq!(stats.whiteouts, 2);
        assert_eq!(stats.skipped_devices, 1);
        assert_eq!(std::fs::read(root.join("etc/keep")).unwrap(), b"upper");
        assert!(!root.join("etc/gone").exists());
        assert!(
            !root.join("opt/app/old").exists(),
            "opaque dir keeps lower files"
        );
        let new = std::fs::metadata(root.join("opt/app/new")).unwrap();
        assert_eq!(new.uid(), 1000);
        assert_eq!(new.permissions().mode() & 0o7777, 0o600);
        assert!(root.join("was-file").is_dir());
        let sudo = std::fs::metadata(root.join("usr/bin/sudo")).unwrap();
        assert_eq!(
            sudo.permissions().mode() & 0o7777,
            0o4755,
            "set-uid bit kept"
        );
        assert!(!root.join("opt/app/.wh..wh..opq").exists());
        assert!(!root.join("dev/null").exists());
    }

    #[test]
    fn nothing_is_written_outside_the_root() {
        let (dir, store, root) = setup();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let link = layer(
            &store,
            &[E::Link("escape", outside.to_str().unwrap())],
            false,
        );
        let through = layer(&store, &[E::File("escape/pwned", b"x", 0o644, 0)], false);
        let e = unpack_layers(
            &store,
            &[link.clone(), through],
            &root,
            &ImageLimits::DEFAULT,
        )
        .unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let whiteout = layer(
            &store,
            &[E::File("escape/.wh.victim", b"", 0o644, 0)],
            false,
        );
        std::fs::write(outside.join("victim"), b"v").unwrap();
        assert!(unpack_layers(&store, &[link, whiteout], &root, &ImageLimits::DEFAULT).is_err());
        assert!(outside.join("victim").exists());
        assert!(!outside.join("pwned").exists());
    }

    /// `limits` with `max_unpacked_bytes` and `max_entries` lowered.
    fn lowered(bytes: u64, entries: u64) -> ImageLimits {
        ImageLimits {
            max_unpacked_bytes: bytes,
            max_entries: entries,
            ..ImageLimits::DEFAULT
        }
    }

    #[test]
    fn a_gzip_bomb_is_refused_and_leaves_no_tree() {
        let (_d, store, root) = setup();
        let zeros = vec![0u8; 8 << 20];
        let bomb = layer(
            &store,
            &[
                E::Dir("etc"),
                E::File("etc/hostname", b"bomb\n", 0o644, 0),
                E::File("zeros", &zeros, 0o644, 0),
            ],
            true,
        );
        let compressed = std::fs::metadata(store.path(&bomb).unwrap()).unwrap().len();
        assert!(compressed < 256 << 10, "not a bomb: {compressed} bytes");
        let e = unpack_layers(
            &store,
            std::slice::from_ref(&bomb),
            &root,
            &lowered(1 << 20, 100),
        )
        .unwrap_err();
        assert!(matches!(e, ImageError::TooLarge { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&bomb[7..19])
                && text.contains("more than 1.0 MiB")
                && text.contains("unpacked bytes"),
            "{text}"
        );
        assert!(!root.exists(), "a partial tree was left behind");
        // The same layer within the limits unpacks: the limit refused it.
        unpack_layers(&store, &[bomb], &root, &lowered(16 << 20, 100)).unwrap();
        assert_eq!(
            std::fs::metadata(root.join("zeros")).unwrap().len(),
            8 << 20
        );
    }

    #[test]
    fn limits_count_over_all_layers() {
        let (_d, store, root) = setup();
        let half = vec![7u8; 600 << 10];
        let a = layer(&store, &[E::File("a", &half, 0o644, 0)], true);
        let b = layer(&store, &[E::File("b", &half, 0o644, 0)], true);
        let e = unpack_layers(
            &store,
            &[a.clone(), b.clone()],
            &root,
            &lowered(1 << 20, 100),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&b[7..19]) && e.contains("more than 1.0 MiB"),
            "{e}"
        );
        assert!(!root.exists());
        let many: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
        let files: Vec<E> = many.iter().map(|n| E::File(n, b"", 0o644, 0)).collect();
        let c = layer(&store, &files, false);
        let e = unpack_layers(&store, &[a, c], &root, &lowered(16 << 20, 10))
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 10 entries"), "{e}");
        assert!(!root.exists());
    }

    #[test]
    fn a_long_name_record_cannot_outgrow_the_limits() {
        let (_d, store, root) = setup();
        // A GNU long-name record (which tar buffers whole) of 4 MiB.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(4 << 20);
        h.set_path("././@LongLink").unwrap();
        h.set_cksum();
        b.append(&h, std::io::repeat(b'a').take(4 << 20)).unwrap();
        let mut f = tar::Header::new_gnu();
        f.set_entry_type(tar::EntryType::Regular);
        f.set_size(0);
        b.append_data(&mut f, "short", &[][..]).unwrap();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&b.into_inner().unwrap()).unwrap();
        let d = store
            .insert(&mut enc.finish().unwrap().as_slice(), None)
            .unwrap();
        let e = unpack_layers(&store, &[d], &root, &lowered(1 << 20, 10)).unwrap_err();
        assert!(matches!(e, ImageError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("tar stream is longer"), "{e}");
        assert!(!root.exists());
    }

    #[test]
    fn a_corrupt_layer_is_an_error_naming_it() {
        let (_d, store, root) = setup();
        let mut junk = vec![0x1f, 0x8b];
        junk.extend_from_slice(&[0xff; 64]);
        let d = store.insert(&mut junk.as_slice(), None).unwrap();
        let e = unpack_layers(
            &store,
            std::slice::from_ref(&d),
            &root,
            &ImageLimits::DEFAULT,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(&d[7..19]), "{e}");
    }

    #[test]
    fn parents_no_entry_lists_are_made_0755_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let parts: Vec<String> = ["usr", "local", "bin", "tool"].map(String::from).to_vec();
        std::fs::create_dir(dir.path().join("usr")).unwrap();
        std::fs::set_permissions(
            dir.path().join("usr"),
            std::fs::Permissions::from_mode(0o711),
        )
        .unwrap();
        assert!(implied_parents(dir.path(), &parts).is_ok());
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("usr"), 0o711, "an existing directory keeps its mode");
        assert_eq!((mode("usr/local"), mode("usr/local/bin")), (0o755, 0o755));
        assert!(!dir.path().join("usr/local/bin/tool").exists());
    }
}
