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

use std::path::Path;

use serde_json::{json, Value};

use super::QemuInstance;
use crate::{DiskSpec, LaunchMode, VmmError};

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
        let args = image_node(&disk, &new_node).map_err(|d| self.invalid("replace_disk", d))?;
        let old_node = image_node_name(self.image_nodes - 1);
        qmp!(self, "blockdev-add", self.qmp.blockdev_add(args));
        let reopen = json!({ "options": [filter_node(&new_node, disk.read_only)] });
        if let Err(e) = self.qmp.blockdev_reopen(reopen).await {
            // Leave the VM as it was: the new node goes, the old one serves.
            let _ = self.qmp.blockdev_del(&new_node).await;
            return Err(self.qmp_error("blockdev-reopen", e).await);
        }
        self.image_nodes += 1;
        qmp!(self, "blockdev-del", self.qmp.blockdev_del(&old_node));
        self.spec.disk = Some(disk);
        Ok(())
    }
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
