//! What is read from a disk image before any process running as root opens it.
//!
//! A VMM holds its sandbox's disk read-write, so a QEMU taken over can
//! rewrite the image's qcow2 header: the backing file name, or an external
//! data file (a second file QEMU opens read-write beside the image). The
//! next process to open that image by path (QEMU itself, which opens its
//! command line as root before dropping to its user, or `qemu-img`) would
//! follow those names. So siesta never lets a header name a file:
//!
//! - every file below an image is named by the server ([`crate::DiskSpec`]'s
//!   `backing`, from what it recorded, never read from a header), and the
//!   end of a chain is spelled out too (`"backing": null`);
//! - an image whose header asks for an external data file is refused
//!   ([`check`]) before any tool opens it;
//! - a new overlay over an image is created without opening the image
//!   (`qemu-img create -u`, sized from [`virtual_size`]).
//!
//! Header layout (QEMU's `docs/interop/qcow2.txt`), all big-endian: magic
//! `QFI\xfb`, version (2 or 3) at 4, backing file name offset (u64 at 8)
//! and length (u32 at 16), virtual size (u64 at 24); in version 3 the
//! incompatible feature bits (u64 at 72) and the header length (u32 at
//! 100, at least 104).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::DiskFormat;

const QCOW2_MAGIC: &[u8; 4] = b"QFI\xfb";
/// Incompatible feature bit 2: the guest data lives in another file,
/// named in a header extension.
const EXTERNAL_DATA_FILE: u64 = 1 << 2;
const V2_HEADER_LEN: usize = 72;
const V3_MIN_HEADER_LEN: u32 = 104;
/// The longest backing name QEMU writes (`PATH_MAX`-ish); more is damage.
const MAX_BACKING_NAME: u32 = 4096;

/// The fields of a qcow2 header siesta acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qcow2Header {
    pub version: u32,
    /// What the guest sees as the disk's size.
    pub virtual_size: u64,
    /// The backing file name the header carries (only ever shown, never
    /// opened).
    pub backing_name: Option<PathBuf>,
    pub incompatible_features: u64,
}

/// Reads the header of the qcow2 image open as `file` (`path` names it in
/// errors).
pub fn read_header(file: &File, path: &Path) -> Result<Qcow2Header, String> {
    let bad = |what: &str| format!("{} is not a valid qcow2 image: {what}", path.display());
    let mut h = [0u8; V3_MIN_HEADER_LEN as usize];
    let n = read_up_to(file, &mut h).map_err(|e| format!("read {}: {e}", path.display()))?;
    if n < V2_HEADER_LEN || &h[..4] != QCOW2_MAGIC {
        return Err(bad("no qcow2 header"));
    }
    let version = be32(&h, 4);
    let incompatible_features = match version {
        2 => 0,
        3 if n == h.len() && be32(&h, 100) >= V3_MIN_HEADER_LEN => be64(&h, 72),
        3 => return Err(bad("a version 3 header shorter than 104 bytes")),
        v => return Err(bad(&format!("version {v}"))),
    };
    let (offset, len) = (be64(&h, 8), be32(&h, 16));
    let backing_name = if offset == 0 || len == 0 {
        None
    } else if len > MAX_BACKING_NAME {
        return Err(bad(&format!("a backing file name of {len} bytes")));
    } else {
        let mut name = vec![0u8; len as usize];
        file.read_exact_at(&mut name, offset)
            .map_err(|e| bad(&format!("backing file name at {offset}: {e}")))?;
        use std::os::unix::ffi::OsStringExt;
        Some(PathBuf::from(std::ffi::OsString::from_vec(name)))
    };
    Ok(Qcow2Header {
        version,
        virtual_size: be64(&h, 24),
        backing_name,
        incompatible_features,
    })
}

/// Refuses an image of `format` open as `file` that would make whoever
/// opens it open another file: a qcow2 asking for an external data file.
/// Raw images carry no header and pass.
pub fn check(file: &File, path: &Path, format: DiskFormat) -> Result<(), String> {
    if format == DiskFormat::Raw {
        return Ok(());
    }
    let header = read_header(file, path)?;
    if header.incompatible_features & EXTERNAL_DATA_FILE != 0 {
        return Err(format!(
            "{} asks for an external data file, which siesta never writes: \
             the image was tampered with (by the VMM that held it?) and is not opened",
            path.display()
        ));
    }
    Ok(())
}

/// [`check`] on the file at `path`.
pub fn check_path(path: &Path, format: DiskFormat) -> Result<(), String> {
    if format == DiskFormat::Raw {
        return Ok(());
    }
    let file = File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    check(&file, path, format)
}

/// The size the guest sees of the image at `path`: a raw file's length, a
/// qcow2's virtual size.
pub fn virtual_size(path: &Path, format: DiskFormat) -> Result<u64, String> {
    let file = File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    match format {
        DiskFormat::Raw => file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| format!("stat {}: {e}", path.display())),
        DiskFormat::Qcow2 => Ok(read_header(&file, path)?.virtual_size),
    }
}

fn read_up_to(file: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal version 3 header of `size` bytes naming `backing`, with
    /// the incompatible feature bits `features`.
    fn qcow2(backing: &str, size: u64, features: u64) -> Vec<u8> {
        let mut h = vec![0u8; 112];
        h[..4].copy_from_slice(QCOW2_MAGIC);
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        h[24..32].copy_from_slice(&size.to_be_bytes());
        h[72..80].copy_from_slice(&features.to_be_bytes());
        h[100..104].copy_from_slice(&104u32.to_be_bytes());
        if !backing.is_empty() {
            let at = h.len() as u64;
            h[8..16].copy_from_slice(&at.to_be_bytes());
            h[16..20].copy_from_slice(&(backing.len() as u32).to_be_bytes());
            h.extend_from_slice(backing.as_bytes());
        }
        h
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn a_header_reads_its_size_and_backing_name() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "a.qcow2", &qcow2("/t/disk.raw", 3 << 30, 0));
        let h = read_header(&File::open(&p).unwrap(), &p).unwrap();
        assert_eq!(h.version, 3);
        assert_eq!(h.virtual_size, 3 << 30);
        assert_eq!(h.backing_name.as_deref(), Some(Path::new("/t/disk.raw")));
        assert_eq!(virtual_size(&p, DiskFormat::Qcow2).unwrap(), 3 << 30);
        check_path(&p, DiskFormat::Qcow2).unwrap();
        let raw = write(d.path(), "r.raw", &[7u8; 5000]);
        assert_eq!(virtual_size(&raw, DiskFormat::Raw).unwrap(), 5000);
        check_path(&raw, DiskFormat::Raw).unwrap();
    }

    #[test]
    fn an_external_data_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "x.qcow2", &qcow2("", 1 << 30, EXTERNAL_DATA_FILE));
        let e = check_path(&p, DiskFormat::Qcow2).unwrap_err();
        assert!(e.contains("external data file"), "{e}");
        // Other bits (dirty, compression type) are QEMU's business.
        let ok = write(d.path(), "ok.qcow2", &qcow2("", 1 << 30, 0b11001));
        check_path(&ok, DiskFormat::Qcow2).unwrap();
    }

    #[test]
    fn garbage_short_headers_and_long_names_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let junk = write(d.path(), "j", &[b'x'; 200]);
        assert!(check_path(&junk, DiskFormat::Qcow2)
            .unwrap_err()
            .contains("no qcow2 header"));
        let mut short = qcow2("", 1, 0);
        short[100..104].copy_from_slice(&72u32.to_be_bytes());
        let short = write(d.path(), "s", &short);
        assert!(check_path(&short, DiskFormat::Qcow2)
            .unwrap_err()
            .contains("shorter than 104"));
        let mut v9 = qcow2("", 1, 0);
        v9[4..8].copy_from_slice(&9u32.to_be_bytes());
        let v9 = write(d.path(), "v9", &v9);
        assert!(check_path(&v9, DiskFormat::Qcow2)
            .unwrap_err()
            .contains("version 9"));
        let long = write(d.path(), "l", &qcow2(&"a".repeat(5000), 1, 0));
        assert!(check_path(&long, DiskFormat::Qcow2)
            .unwrap_err()
            .contains("5000 bytes"));
        let past = write(d.path(), "p", &qcow2("name", 1, 0)[..112]);
        assert!(check_path(&past, DiskFormat::Qcow2).is_err());
    }

    #[test]
    fn a_real_qemu_img_image_reads_as_qemu_img_wrote_it() {
        let Ok(out) = std::process::Command::new("qemu-img")
            .arg("--version")
            .output()
        else {
            return; // qemu-utils missing: the synthetic headers above still ran
        };
        assert!(out.status.success());
        let d = tempfile::tempdir().unwrap();
        let base = write(d.path(), "base.raw", &vec![0u8; 1 << 20]);
        let top = d.path().join("top.qcow2");
        let st = std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&base)
            .arg(&top)
            .status()
            .unwrap();
        assert!(st.success());
        let h = read_header(&File::open(&top).unwrap(), &top).unwrap();
        assert_eq!(h.backing_name.as_deref(), Some(base.as_path()));
        assert_eq!(h.virtual_size, 1 << 20);
        check_path(&top, DiskFormat::Qcow2).unwrap();
    }
}
