//! Copy-on-write disks: every sandbox gets a qcow2 overlay over its
//! template's read-only disk image, so a new sandbox costs no copy and its
//! writes stay its own.

use std::path::Path;

use tokio::process::Command;

use crate::error::{Error, Result};

/// Creates `overlay` (qcow2) backed by the raw image `base`.
pub async fn create_overlay(base: &Path, overlay: &Path) -> Result<()> {
    let out = Command::new("qemu-img")
        .arg("create")
        .args(["-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(base)
        .arg(overlay)
        .output()
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::missing_tool("qemu-img"),
            _ => Error::Command {
                what: "qemu-img create".into(),
                detail: format!("cannot run qemu-img: {e}"),
            },
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            what: format!("qemu-img create {}", overlay.display()),
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
