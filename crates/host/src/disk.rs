//! Copy-on-write disks: every sandbox gets a qcow2 overlay over its
//! template's read-only disk image, so a new sandbox costs no copy and its
//! writes stay its own.

use std::path::Path;

use siesta_vmm::{disk_image, DiskFormat, DiskSpec};
use tokio::process::Command;

use crate::error::{HostError as Error, Result};

/// Creates `overlay` (qcow2) backed by the raw image `base`.
pub async fn create_overlay(base: &Path, overlay: &Path) -> Result<()> {
    create_overlay_on(base, DiskFormat::Raw, overlay).await
}

/// Creates `overlay` (qcow2) backed by `base`, an image in `format`, of
/// `base`'s size, without opening `base` (`-u`): a qcow2 `base` was written
/// by a VM, which could have made its header name any file
/// (`siesta_vmm::disk_image`).
pub async fn create_overlay_on(base: &Path, format: DiskFormat, overlay: &Path) -> Result<()> {
    let size = virtual_size(base, format)?;
    let mut cmd = Command::new("qemu-img");
    cmd.args([
        "create",
        "-q",
        "-u",
        "-f",
        "qcow2",
        "-F",
        format.as_str(),
        "-b",
    ])
    .arg(base)
    .arg(overlay)
    .arg(size.to_string());
    qemu_img(cmd, &format!("qemu-img create {}", overlay.display())).await
}

/// The size the guest sees of the image at `path`.
fn virtual_size(path: &Path, format: DiskFormat) -> Result<u64> {
    disk_image::virtual_size(path, format).map_err(|detail| Error::CorruptImage {
        path: path.to_path_buf(),
        detail,
    })
}

/// Refuses an image (written by a VM) whose header would make `qemu-img`
/// open a file nobody named.
fn check_image(path: &Path, format: DiskFormat) -> Result<()> {
    disk_image::check_path(path, format).map_err(|detail| Error::CorruptImage {
        path: path.to_path_buf(),
        detail,
    })
}

/// Points qcow2 `overlay` at the raw image `base` as its backing file,
/// without touching its data (`qemu-img rebase -u`): for an overlay whose
/// backing image has the same content at another path (another node's
/// copy of the template disk).
pub async fn rebase_onto(overlay: &Path, base: &Path) -> Result<()> {
    // The overlay is a VM's (or a peer node's): `-u` opens no backing file,
    // and the check refuses a data file.
    check_image(overlay, DiskFormat::Qcow2)?;
    let mut cmd = Command::new("qemu-img");
    cmd.args(["rebase", "-q", "-u", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(base)
        .arg(overlay);
    qemu_img(cmd, &format!("qemu-img rebase {}", overlay.display())).await
}

/// The backing file qcow2 `overlay` names in its header, if any (shown,
/// never opened: see `siesta_vmm::disk_image`).
pub fn backing_file(overlay: &Path) -> Result<Option<std::path::PathBuf>> {
    let file = std::fs::File::open(overlay).map_err(|source| Error::Io {
        what: "reading the header of",
        path: overlay.to_path_buf(),
        source,
    })?;
    let header = disk_image::read_header(&file, overlay).map_err(|detail| Error::CorruptImage {
        path: overlay.to_path_buf(),
        detail,
    })?;
    Ok(header.backing_name)
}

/// Writes what `disk` (an image over the chain it names) presents as one
/// sparse raw image at `raw`. `qemu-img` is given the whole chain as a
/// `json:` name, so it follows no name from a header a VM wrote.
pub async fn flatten(disk: &DiskSpec, raw: &Path) -> Result<()> {
    disk.check_images().map_err(|detail| Error::CorruptImage {
        path: disk.path.clone(),
        detail,
    })?;
    let mut file =
        |p: &Path| serde_json::json!({ "driver": "file", "filename": p.to_string_lossy() });
    let source = format!("json:{}", disk.block_node(&mut file));
    let mut cmd = Command::new("qemu-img");
    cmd.args(["convert", "-q", "-O", "raw"])
        .arg(source)
        .arg(raw);
    qemu_img(
        cmd,
        &format!(
            "qemu-img convert {} to {}",
            disk.path.display(),
            raw.display()
        ),
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
