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
        .map_err(|e| Error::Command {
            what: "qemu-img create".into(),
            detail: format!("cannot run qemu-img (install qemu-utils): {e}"),
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            what: format!("qemu-img create {}", overlay.display()),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}
