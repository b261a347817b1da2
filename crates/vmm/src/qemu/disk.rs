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
//! Every node names its whole chain, as the caller recorded it, and ends in
//! `"backing": null`: QEMU follows no file name from a header a VMM could
//! have rewritten ([`crate::disk_image`]). The images a VMM is started with
//! are opened by path (QEMU is still root then; the spawn checks their
//! headers first). Every image added later reaches it as descriptors
//! ([`super::fdset`]): the VMM may have dropped to a user of its own that
//! can open nothing of the server's. So a replaced disk's files are each
//! opened here, checked, and passed, and a checkpoint's overlay is created
//! here with `qemu-img` and handed over.

use std::fs::File;
use std::path::Path;

use serde_json::{json, Value};

use super::fdset::{self, Access, FdSet};
use super::QemuInstance;
use crate::{disk_image, BackingFile, DiskFormat, DiskSpec, LaunchMode, VmmError};

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

/// The image's format node as `-blockdev` takes it at start-up (QEMU is
/// still root and opens the files by path): writeback caching and guest
/// discards punched through to the file, over exactly the chain the spec
/// names.
pub(super) fn image_node(disk: &DiskSpec, node: &str) -> Result<Value, String> {
    for (path, _) in disk.files() {
        utf8_path(path, "disk")?;
    }
    let mut file = |p: &Path| json!({ "driver": "file", "filename": p.to_string_lossy() });
    Ok(top_node(disk.block_node(&mut file), disk, node))
}

/// The image's format node for a disk handed over as fd sets, one per file
/// of [`DiskSpec::files`] in that order.
pub(super) fn passed_image_node(disk: &DiskSpec, node: &str, sets: &[FdSet]) -> Value {
    let mut sets = sets.iter();
    let mut file = |_: &Path| {
        let set = sets.next().map(|s| s.path()).unwrap_or_default();
        json!({ "driver": "file", "filename": set })
    };
    top_node(disk.block_node(&mut file), disk, node)
}

fn top_node(mut v: Value, disk: &DiskSpec, node: &str) -> Value {
    v["node-name"] = json!(node);
    v["discard"] = json!("unmap");
    v["read-only"] = json!(disk.read_only);
    v
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
        let files = self.open_disk(&disk)?;
        let passed = match self.pass_files(files).await {
            Ok(sets) => sets,
            Err((e, passed)) => {
                self.drop_fdsets(&passed).await;
                return Err(e);
            }
        };
        let args = passed_image_node(&disk, &new_node, &passed);
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

    /// Opens every file of `disk` (the image writable unless read-only,
    /// the files below it read-only) and checks each image's header from
    /// the descriptor QEMU will get, so what is checked is what it opens.
    fn open_disk(&self, disk: &DiskSpec) -> Result<Vec<File>, VmmError> {
        let mut files = Vec::new();
        for (i, (path, format)) in disk.files().enumerate() {
            let access = if i == 0 && !disk.read_only {
                Access::ReadWrite
            } else {
                Access::Read
            };
            let op = if i == 0 {
                "open the new disk"
            } else {
                "open the new disk's backing file"
            };
            let file = fdset::open(path, access).map_err(|e| self.io(op, path, e))?;
            disk_image::check(&file, path, format).map_err(|d| self.invalid("replace_disk", d))?;
            files.push(file);
        }
        Ok(files)
    }

    /// Hands QEMU `files`, each in a set of its own. On failure, also the
    /// sets passed so far.
    async fn pass_files(&mut self, files: Vec<File>) -> Result<Vec<FdSet>, (VmmError, Vec<FdSet>)> {
        let mut passed = Vec::with_capacity(files.len());
        for file in files {
            match self.pass_open_file(file).await {
                Ok(set) => passed.push(set),
                Err(e) => return Err((e, passed)),
            }
        }
        Ok(passed)
    }

    /// See [`crate::VmInstance::checkpoint_disk`]: the overlay is created
    /// here over the current image without opening it (`qemu-img create -u`:
    /// its header names that image's real path, for people reading it) and
    /// QEMU is given it as a descriptor. QEMU puts it over the current node
    /// itself (`mode: existing`), following no name.
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
        let mut backing = vec![BackingFile {
            path: current.path,
            format: current.format,
        }];
        backing.extend(current.backing);
        self.spec.disk = Some(DiskSpec {
            path: overlay.to_path_buf(),
            format: DiskFormat::Qcow2,
            read_only: false,
            backing,
        });
        Ok(())
    }
}

/// `qemu-img create -u` of a qcow2 overlay over `current`, of its size.
async fn create_overlay(current: &DiskSpec, overlay: &Path) -> Result<(), String> {
    let size = disk_image::virtual_size(&current.path, current.format)?;
    let out = tokio::process::Command::new("qemu-img")
        .args(["create", "-q", "-u", "-f", "qcow2", "-F"])
        .arg(current.format.as_str())
        .arg("-b")
        .arg(&current.path)
        .arg(overlay)
        .arg(size.to_string())
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
            backing: vec![],
        };
        let v = image_node(&disk, "disk0-img-2").unwrap();
        assert_eq!(v["driver"], "qcow2");
        assert_eq!(v["node-name"], "disk0-img-2");
        assert_eq!(v["file"]["filename"], "/s/a,b.qcow2");
        // Alone: said so, or QEMU would follow the header's name.
        assert!(v["backing"].is_null() && v.get("backing").is_some());
        disk.backing = vec![
            BackingFile {
                path: "/c/layer.qcow2".into(),
                format: DiskFormat::Qcow2,
            },
            BackingFile::raw("/t/disk.raw".into()),
        ];
        let v = image_node(&disk, "n").unwrap();
        assert_eq!(v["backing"]["driver"], "qcow2");
        assert_eq!(v["backing"]["file"]["filename"], "/c/layer.qcow2");
        assert_eq!(v["backing"]["backing"]["driver"], "raw");
        assert_eq!(v["backing"]["backing"]["file"]["filename"], "/t/disk.raw");
        assert!(v["backing"]["backing"].get("backing").is_none());
        let sets = [FdSet(4), FdSet(5), FdSet(6)];
        let v = passed_image_node(&disk, "m", &sets);
        assert_eq!(v["node-name"], "m");
        assert_eq!(v["file"]["filename"], "/dev/fdset/4");
        assert_eq!(v["backing"]["file"]["filename"], "/dev/fdset/5");
        assert_eq!(v["backing"]["backing"]["file"]["filename"], "/dev/fdset/6");
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
