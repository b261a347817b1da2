//! The files below a qcow2 image, read from the headers as QEMU would.
//!
//! A VMM that runs as a user of its own cannot open a disk by path after it
//! has dropped privileges (the home is 0700 root), so a disk added later
//! (`replace_disk`) is handed over as descriptors, one per file of its
//! chain, and the chain is spelled out rather than left to QEMU to follow
//! from the header. This module reads that chain: for each qcow2 image the
//! backing file name (relative names are relative to the image's
//! directory) and the backing format from its header extension.
//!
//! Header layout (QEMU's `docs/interop/qcow2.txt`): magic `QFI\xfb`,
//! version (2 or 3), backing file offset (u64 at 8) and length (u32 at 16);
//! header extensions follow the header (72 bytes in version 2, the length
//! at 100 in version 3), each a u32 type and u32 length, padded to 8 bytes;
//! type `0xe2792aca` is the backing file format. All big-endian.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::DiskFormat;

const QCOW2_MAGIC: &[u8; 4] = b"QFI\xfb";
const BACKING_FORMAT_EXT: u32 = 0xe279_2aca;
/// Where the extensions begin in a version 2 header.
const V2_HEADER_LEN: u64 = 72;
/// The most of a header (with its extensions) read: QEMU writes a few
/// hundred bytes; a cluster is the most there can be.
const MAX_HEADER: usize = 64 << 10;
/// Deeper chains than this are refused (a loop of images names itself).
pub const MAX_DEPTH: usize = 32;

/// One file of a chain and the driver that reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub path: PathBuf,
    pub format: DiskFormat,
}

/// The backing files below `top` (of `format`), nearest first; empty for a
/// raw image or a qcow2 without a backing file.
pub fn below(top: &Path, format: DiskFormat) -> Result<Vec<Link>, String> {
    let mut chain = Vec::new();
    let mut current = Link {
        path: top.to_path_buf(),
        format,
    };
    while current.format == DiskFormat::Qcow2 {
        let Some(next) = backing_of(&current.path)? else {
            break;
        };
        if chain.len() == MAX_DEPTH {
            return Err(format!(
                "{}: the backing chain is deeper than {MAX_DEPTH} images (a loop?)",
                top.display()
            ));
        }
        chain.push(next.clone());
        current = next;
    }
    Ok(chain)
}

/// The backing file a qcow2 image's header names, if any.
pub fn backing_of(image: &Path) -> Result<Option<Link>, String> {
    let file = File::open(image).map_err(|e| format!("open {}: {e}", image.display()))?;
    let mut header = vec![0u8; MAX_HEADER];
    let n = read_up_to(&file, &mut header).map_err(|e| format!("read {}: {e}", image.display()))?;
    header.truncate(n);
    let bad = |what: &str| format!("{} is not a valid qcow2 image: {what}", image.display());
    if header.len() < V2_HEADER_LEN as usize || &header[..4] != QCOW2_MAGIC {
        return Err(bad("no qcow2 header"));
    }
    let version = be32(&header, 4);
    let offset = be64(&header, 8);
    let len = be32(&header, 16) as u64;
    if offset == 0 || len == 0 {
        return Ok(None);
    }
    let name_bytes = read_at(&file, offset, len, 1023).map_err(|e| bad(&e))?;
    let name = std::str::from_utf8(&name_bytes).map_err(|_| bad("backing name not UTF-8"))?;
    let named = Path::new(name);
    let path = if named.is_absolute() {
        named.to_path_buf()
    } else {
        image.parent().unwrap_or(Path::new("/")).join(named)
    };
    let format = match backing_format(&header, version).map_err(|e| bad(&e))? {
        Some(f) => f,
        // No format recorded: QEMU probes; so do we.
        None => probe(&path)?,
    };
    Ok(Some(Link { path, format }))
}

fn backing_format(header: &[u8], version: u32) -> Result<Option<DiskFormat>, String> {
    let mut at = match version {
        2 => V2_HEADER_LEN as usize,
        3 if header.len() >= 104 => be32(header, 100) as usize,
        _ => return Err(format!("version {version}")),
    };
    while at + 8 <= header.len() {
        let (kind, len) = (be32(header, at), be32(header, at + 4) as usize);
        if kind == 0 {
            return Ok(None);
        }
        let data = header
            .get(at + 8..at + 8 + len)
            .ok_or_else(|| "a header extension runs past the header".to_string())?;
        if kind == BACKING_FORMAT_EXT {
            return match data {
                b"raw" => Ok(Some(DiskFormat::Raw)),
                b"qcow2" => Ok(Some(DiskFormat::Qcow2)),
                other => Err(format!(
                    "backing format {:?} is not raw or qcow2",
                    String::from_utf8_lossy(other)
                )),
            };
        }
        at += 8 + len.div_ceil(8) * 8;
    }
    Ok(None)
}

fn probe(path: &Path) -> Result<DiskFormat, String> {
    let file = File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let mut magic = [0u8; 4];
    let n = read_up_to(&file, &mut magic).map_err(|e| format!("read {}: {e}", path.display()))?;
    Ok(if n == 4 && &magic == QCOW2_MAGIC {
        DiskFormat::Qcow2
    } else {
        DiskFormat::Raw
    })
}

fn read_at(file: &File, offset: u64, len: u64, max: u64) -> Result<Vec<u8>, String> {
    if len > max {
        return Err(format!("backing name of {len} bytes"));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| format!("backing name at {offset}: {e}"))?;
    Ok(buf)
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

    /// A minimal version 3 header naming `backing` (and `format`, if given).
    fn qcow2(backing: &str, format: Option<&str>) -> Vec<u8> {
        let mut h = vec![0u8; 104];
        h[..4].copy_from_slice(QCOW2_MAGIC);
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        h[100..104].copy_from_slice(&104u32.to_be_bytes());
        if let Some(f) = format {
            h.extend_from_slice(&BACKING_FORMAT_EXT.to_be_bytes());
            h.extend_from_slice(&(f.len() as u32).to_be_bytes());
            h.extend_from_slice(f.as_bytes());
            h.resize(h.len().div_ceil(8) * 8, 0);
        }
        h.extend_from_slice(&[0u8; 8]);
        if !backing.is_empty() {
            let at = h.len() as u64;
            h[8..16].copy_from_slice(&at.to_be_bytes());
            h[16..20].copy_from_slice(&(backing.len() as u32).to_be_bytes());
            h.extend_from_slice(backing.as_bytes());
        }
        h
    }

    #[test]
    fn a_chain_is_followed_through_relative_and_absolute_names() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base.raw");
        std::fs::write(&base, vec![0u8; 4096]).unwrap();
        let mid = d.path().join("mid.qcow2");
        std::fs::write(&mid, qcow2(base.to_str().unwrap(), Some("raw"))).unwrap();
        let top = d.path().join("top.qcow2");
        std::fs::write(&top, qcow2("mid.qcow2", None)).unwrap();
        let chain = below(&top, DiskFormat::Qcow2).unwrap();
        assert_eq!(
            chain,
            [
                Link {
                    path: mid.clone(),
                    format: DiskFormat::Qcow2
                },
                Link {
                    path: base,
                    format: DiskFormat::Raw
                }
            ]
        );
        assert!(below(&mid, DiskFormat::Raw).unwrap().is_empty());
        let alone = d.path().join("alone.qcow2");
        std::fs::write(&alone, qcow2("", Some("raw"))).unwrap();
        assert!(below(&alone, DiskFormat::Qcow2).unwrap().is_empty());
    }

    #[test]
    fn loops_garbage_and_odd_formats_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let me = d.path().join("me.qcow2");
        std::fs::write(&me, qcow2("me.qcow2", Some("qcow2"))).unwrap();
        let e = below(&me, DiskFormat::Qcow2).unwrap_err();
        assert!(e.contains("deeper than"), "{e}");
        let junk = d.path().join("junk.qcow2");
        std::fs::write(
            &junk,
            b"not an image at all, just some text............................................",
        )
        .unwrap();
        assert!(backing_of(&junk).unwrap_err().contains("no qcow2 header"));
        let vmdk = d.path().join("v.qcow2");
        std::fs::write(&vmdk, qcow2("x", Some("vmdk"))).unwrap();
        assert!(backing_of(&vmdk).unwrap_err().contains("vmdk"));
        let long = d.path().join("long.qcow2");
        std::fs::write(&long, qcow2(&"a".repeat(2000), None)).unwrap();
        assert!(backing_of(&long).unwrap_err().contains("2000 bytes"));
    }

    #[test]
    fn a_real_qemu_img_chain_reads_as_qemu_img_says() {
        let Ok(out) = std::process::Command::new("qemu-img")
            .arg("--version")
            .output()
        else {
            return; // qemu-utils missing: the synthetic headers above still ran
        };
        assert!(out.status.success());
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base.raw");
        std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
        let top = d.path().join("top.qcow2");
        let st = std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&base)
            .arg(&top)
            .status()
            .unwrap();
        assert!(st.success());
        let chain = below(&top, DiskFormat::Qcow2).unwrap();
        assert_eq!(
            chain,
            [Link {
                path: base,
                format: DiskFormat::Raw
            }]
        );
    }
}
