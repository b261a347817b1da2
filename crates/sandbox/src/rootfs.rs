//! Copy-on-write disks: every sandbox gets a qcow2 overlay over its
//! template's read-only disk image, so a new sandbox costs no copy and its
//! writes stay its own.

use std::path::Path;

use siesta_vmm::DiskFormat;
use tokio::process::Command;

use crate::error::{Error, Result};

/// Creates `overlay` (qcow2) backed by the raw image `base`.
pub async fn create_overlay(base: &Path, overlay: &Path) -> Result<()> {
    create_overlay_on(base, DiskFormat::Raw, overlay).await
}

/// Creates `overlay` (qcow2) backed by `base`, an image in `format`.
pub async fn create_overlay_on(base: &Path, format: DiskFormat, overlay: &Path) -> Result<()> {
    let mut cmd = Command::new("qemu-img");
    cmd.args(["create", "-q", "-f", "qcow2", "-F", format.as_str(), "-b"])
        .arg(base)
        .arg(overlay);
    qemu_img(cmd, &format!("qemu-img create {}", overlay.display())).await
}

/// Points qcow2 `overlay` at the raw image `base` as its backing file,
/// without touching its data (`qemu-img rebase -u`): for an overlay whose
/// backing image has the same content at another path (another node's
/// copy of the template disk).
pub async fn rebase_onto(overlay: &Path, base: &Path) -> Result<()> {
    let mut cmd = Command::new("qemu-img");
    cmd.args(["rebase", "-q", "-u", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(base)
        .arg(overlay);
    qemu_img(cmd, &format!("qemu-img rebase {}", overlay.display())).await
}

/// The backing file qcow2 `overlay` names in its header, if any.
pub fn backing_file(overlay: &Path) -> Result<Option<std::path::PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileExt;
    let ctx = |source| Error::Io {
        what: "reading the header of",
        path: overlay.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(overlay).map_err(ctx)?;
    let mut header = [0u8; 20];
    file.read_exact_at(&mut header, 0).map_err(ctx)?;
    let bad = |detail: &str| Error::CorruptSnapshot {
        path: overlay.to_path_buf(),
        detail: detail.to_string(),
    };
    if header[..4] != *b"QFI\xfb" {
        return Err(bad("not a qcow2 image"));
    }
    let offset = u64::from_be_bytes(header[8..16].try_into().unwrap_or_default());
    let len = u32::from_be_bytes(header[16..20].try_into().unwrap_or_default());
    if offset == 0 || len == 0 {
        return Ok(None);
    }
    if len > 4096 {
        return Err(bad("its backing file name is over 4 KiB"));
    }
    let mut name = vec![0u8; len as usize];
    file.read_exact_at(&mut name, offset).map_err(ctx)?;
    Ok(Some(std::ffi::OsStr::from_bytes(&name).into()))
}

/// Writes the disk that `top` (an image in `format`, with its backing
/// chain) presents as one sparse raw image at `raw`.
pub async fn flatten(top: &Path, format: DiskFormat, raw: &Path) -> Result<()> {
    let mut cmd = Command::new("qemu-img");
    cmd.args(["convert", "-q", "-f", format.as_str(), "-O", "raw"])
        .arg(top)
        .arg(raw);
    qemu_img(
        cmd,
        &format!("qemu-img convert {} to {}", top.display(), raw.display()),
    )
    .await
}

async fn qemu_img(mut cmd: Command, what: &str) -> Result<()> {
    let out = cmd.output().await.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::missing_tool("qemu-img"),
        _ => Error::Command {
            what: what.into(),
            detail: format!("cannot run qemu-img: {e}"),
        },
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            what: what.into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Copies `from` to `to` keeping holes (and sharing blocks where the
/// filesystem can reflink).
pub async fn copy_sparse(from: &Path, to: &Path) -> Result<()> {
    let out = tokio::process::Command::new("cp")
        .args(["--sparse=always", "--reflink=auto"])
        .arg(from)
        .arg(to)
        .output()
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::missing_tool("cp"),
            _ => Error::Command {
                what: "cp".into(),
                detail: format!("cannot run cp: {e}"),
            },
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            what: format!("copying {} to {}", from.display(), to.display()),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}
