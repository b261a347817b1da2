//! The guest disk's block graph, and handing a waiting VMM another image.
//!
//! The virtio-blk device is attached to a `raw` filter node ([`DISK_ID`])
//! over the image's format node, never to the image itself:
//!
//! ```text
//! virtio-blk-pci ── disk0 (raw, filter) ── disk0-img (qcow2) ── file
//!                                                  └─ backing (template disk)
//! ```
//!
//! The filter is what lets a VMM spawned ahead of time (the pool's, waiting
//! in `-incoming` over a fresh overlay) resume a *paused* sandbox: its image
//! node is added with `blockdev-add`, the filter is pointed at it with
//! `blockdev-reopen`, and the pool's overlay node is deleted, all before the
//! state is loaded. QEMU has no command that swaps the image under a device
//! directly (`blockdev-change-medium` is for removable media), and a qcow2
//! node cannot be pointed at another file (it caches its header and
//! tables). Under `-incoming` every node is still inactive, so nothing has
//! read or written guest data yet; the migration activates the new one.
//!
//! Image nodes are named `disk0-img`, then `disk0-img-1`, `-2`, ... as they
//! are replaced or checkpointed (`blockdev-snapshot-sync` puts the new
//! overlay between the filter and the old image).
//!
//! The images a VMM is started with are opened by path (QEMU is still
//! root then). Every image added later reaches it as descriptors
//! ([`super::fdset`]): the VMM may have dropped to a user of its own that
//! can open nothing of the server's. So a replaced disk's whole chain is
//! spelled out, one descriptor per file ([`super::backing_chain`]), and a
//! checkpoint's overlay is created here with `qemu-img` and handed over.

use std::path::Path;

use serde_json::{json, Value};

use super::backing_chain::{self, Link};
use super::fdset::{Access, FdSet};
use super::QemuInstance;
use crate::{DiskFormat, DiskSpec, LaunchMode, VmmError};

/// The node the guest's disk device is attached to.
pub const DISK_ID: &str = "disk0";
/// The image node a VMM is spawned with.
pub const FIRST_IMAGE_NODE: &str = "disk0-img";

/// The name of the `n`th image node (0: the one spawned with).
pub(super) fn image_node_name(n: u32) -> String {
    if n == 0 {
        FIRST_IMAGE_NODE.to_string()
    } else {
        format!("{FIRST_IMAGE_NODE}-{n}")
    }
}

/// A path QEMU receives inside JSON, which holds only UTF-8.
pub(super) fn utf8_path<'a>(path: &'a Path, what: &str) -> Result<&'a str, String> {
    path.to_str()
        .ok_or_else(|| format!("{what} {} is not valid UTF-8", path.display()))
}

/// The image's format node as `blockdev-add` (and `-blockdev`) take it:
/// writeback caching, guest discards punched through to the file, and the
/// backing file its header names unless [`DiskSpec::backing`] gives another.
pub(super) fn image_node(disk: &DiskSpec, node: &str) -> Result<Value, String> {
    let mut v = json!({
        "driver": disk.format.as_str(),
        "node-name": node,
        "discard": "unmap",
        "read-only": disk.read_only,
        "file": { "driver": "file", "filename": utf8_path(&disk.path, "disk")? },
    });
    if let Some(backing) = &disk.backing {
        v["backing"] = json!({
            "driver": "raw",
            "file": { "driver": "file", "filename": utf8_path(backing, "disk backing file")? },
        });
    }
    Ok(v)
}

/// The image's format node for a disk handed over as fd sets: `top` for the
/// image and `chain[i]` for the `i`th file below it (nearest first), each
/// named so QEMU follows no backing name from a header.
pub(super) fn passed_image_node(
    disk: &DiskSpec,
    node: &str,
    top: FdSet,
    chain: &[(DiskFormat, FdSet)],
) -> Value {
    let file = |set: FdSet| json!({ "driver": "file", "filename": set.path() });
    let mut backing: Option<Value> = None;
    for &(format, set) in chain.iter().rev() {
        let mut v = json!({ "driver": format.as_str(), "read-only": true, "file": file(set) });
        if let Some(b) = backing.take() {
            v["backing"] = b;
        }
        backing = Some(v);
    }
    let mut v = json!({
        "driver": disk.format.as_str(),
        "node-name": node,
        "discard": "unmap",
        "read-only": disk.read_only,
        "file": file(top),
    });
    if let Some(b) = backing {
        v["backing"] = b;
    }
    v
}

/// The files below `disk`: the explicit raw backing if it names one, else
/// what the image headers name.
fn chain_of(disk: &DiskSpec) -> Result<Vec<Link>, String> {
    match &disk.backing {
        Some(b) => Ok(vec![Link {
            path: b.clone(),
            format: DiskFormat::Raw,
        }]),
        None => backing_chain::below(&disk.path, disk.format),
    }
}

/// The filter node the device is attached to, over image node `image`.
pub(super) fn filter_node(image: &str, read_only: bool) -> Value {
    json!({
        "driver": "raw",
        "node-name": DISK_ID,
        "discard": "unmap",
        "read-only": read_only,
        "file": image,
    })
}

impl QemuInstance {
    /// See [`crate::VmInstance::replace_disk`].
    pub(super) async fn replace_disk_inner(&mut self, disk: DiskSpec) -> Result<(), VmmError> {
        self.check_usable("replace_disk")?;
        if self.spec.mode != LaunchMode::Incoming || self.started {
            return Err(self.invalid(
                "replace_disk",
                "only a VM waiting in -incoming, before its state is loaded, can take another disk"
                    .into(),
            ));
        }
        let Some(old) = self.spec.disk.as_ref() else {
            return Err(self.invalid("replace_disk", "the VM has no disk".into()));
        };
        if old.read_only != disk.read_only {
            return Err(self.invalid(
                "replace_disk",
                "the new disk must be writable exactly when the old one is".into(),
            ));
        }
        let new_node = image_node_name(self.image_nodes);
        let chain = chain_of(&disk).map_err(|d| self.invalid("replace_disk", d))?;
        let (top, below) = match self.pass_disk(&disk, &chain).await {
            Ok(sets) => sets,
            Err((e, passed)) => {
                self.drop_fdsets(&passed).await;
                return Err(e);
            }
        };
        let mut passed: Vec<FdSet> = below.iter().map(|&(_, s)| s).collect();
        passed.push(top);
        let args = passed_image_node(&disk, &new_node, top, &below);
        let old_node = image_node_name(self.image_nodes - 1);
        if let Err(e) = self.qmp.blockdev_add(args).await {
            self.drop_fdsets(&passed).await;
            return Err(self.qmp_error("blockdev-add", e).await);
        }
        let reopen = json!({ "options": [filter_node(&new_node, disk.read_only)] });
        if let Err(e) = self.qmp.blockdev_reopen(reopen).await {
            // Leave the VM as it was: the new node goes, the old one serves.
            let _ = self.qmp.blockdev_del(&new_node).await;
            self.drop_fdsets(&passed).await;
            return Err(self.qmp_error("blockdev-reopen", e).await);
        }
        self.image_nodes += 1;
        qmp!(self, "blockdev-del", self.qmp.blockdev_del(&old_node));
        self.spec.disk = Some(disk);
        Ok(())
    }

    /// Hands QEMU `disk` (writable unless read-only) and every file of
    /// `chain` (read-only). On failure, also the sets passed so far.
    async fn pass_disk(
        &mut self,
        disk: &DiskSpec,
        chain: &[Link],
    ) -> Result<(FdSet, Vec<(DiskFormat, FdSet)>), (VmmError, Vec<FdSet>)> {
        let access = if disk.read_only {
            Access::Read
        } else {
            Access::ReadWrite
        };
        let top = self
            .pass_file("open the new disk", &disk.path, access)
            .await
            .map_err(|e| (e, vec![]))?;
        let mut below = Vec::with_capacity(chain.len());
        for link in chain {
            match self
                .pass_file("open the new disk's backing file", &link.path, Access::Read)
                .await
            {
                Ok(set) => below.push((link.format, set)),
                Err(e) => {
                    let mut passed: Vec<FdSet> = below.iter().map(|&(_, s)| s).collect();
                    passed.push(top);
                    return Err((e, passed));
                }
            }
        }
        Ok((top, below))
    }

    /// See [`crate::VmInstance::checkpoint_disk`]: the overlay is created
    /// here over the current image (so its header names that image's real
    /// path) and QEMU is given it as a descriptor.
    pub(super) async fn checkpoint_disk_inner(&mut self, overlay: &Path) -> Result<(), VmmError> {
        let Some(current) = self.spec.disk.clone() else {
            return Err(self.invalid("checkpoint_disk", "the VM has no disk".into()));
        };
        if overlay.exists() {
            return Err(self.invalid(
                "checkpoint_disk",
                format!("the overlay {} exists already", overlay.display()),
            ));
        }
        create_overlay(&current, overlay)
            .await
            .map_err(|d| self.invalid("checkpoint_disk", d))?;
        let set = match self
            .pass_file("open the new overlay", overlay, Access::ReadWrite)
            .await
        {
            Ok(set) => set,
            Err(e) => {
                let _ = std::fs::remove_file(overlay);
                return Err(e);
            }
        };
        let (node, next) = (
            image_node_name(self.image_nodes - 1),
            image_node_name(self.image_nodes),
        );
        let res = self
            .qmp
            .blockdev_snapshot_sync(&node, &set.path(), &next)
            .await;
        if let Err(e) = res {
            self.drop_fdsets(&[set]).await;
            let _ = std::fs::remove_file(overlay);
            return Err(self.qmp_error("blockdev-snapshot-sync", e).await);
        }
        self.image_nodes += 1;
        self.spec.disk = Some(DiskSpec {
            path: overlay.to_path_buf(),
            format: DiskFormat::Qcow2,
            read_only: false,
            backing: None,
        });
        Ok(())
    }
}

/// `qemu-img create` of a qcow2 overlay over `current` (its own size).
async fn create_overlay(current: &DiskSpec, overlay: &Path) -> Result<(), String> {
    let out = tokio::process::Command::new("qemu-img")
        .args([
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            current.format.as_str(),
            "-b",
        ])
        .arg(&current.path)
        .arg(overlay)
        .output()
        .await
        .map_err(|e| format!("cannot run qemu-img (install qemu-utils): {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(overlay);
        return Err(format!(
            "qemu-img create {}: {}",
            overlay.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DiskFormat;

    #[test]
    fn image_node_names_its_file_and_backing() {
        let mut disk = DiskSpec {
            path: "/s/a,b.qcow2".into(),
            format: DiskFormat::Qcow2,
            read_only: false,
            backing: None,
        };
        let v = image_node(&disk, "disk0-img-2").unwrap();
        assert_eq!(v["driver"], "qcow2");
        assert_eq!(v["node-name"], "disk0-img-2");
        assert_eq!(v["file"]["filename"], "/s/a,b.qcow2");
        assert!(v.get("backing").is_none());
        disk.backing = Some("/t/disk.raw".into());
        let v = image_node(&disk, "n").unwrap();
        assert_eq!(v["backing"]["driver"], "raw");
        assert_eq!(v["backing"]["file"]["filename"], "/t/disk.raw");
        assert_eq!(filter_node("n", true)["file"], "n");
        assert_eq!(image_node_name(0), "disk0-img");
        assert_eq!(image_node_name(3), "disk0-img-3");
    }

    #[test]
    fn a_path_that_is_not_utf8_is_refused_by_name() {
        use std::os::unix::ffi::OsStrExt;
        let p = Path::new(std::ffi::OsStr::from_bytes(b"/d/\xff.qcow2"));
        assert!(utf8_path(p, "disk")
            .unwrap_err()
            .contains("not valid UTF-8"));
    }
}
