//! Where things live under the data directory.
//!
//! ```text
//! $SIESTA_HOME/
//!   assets/      vmlinuz, initramfs.img, rootfs-<image>.img (guest/build-assets.sh)
//!   repo/              the snapshot repository (siesta-snapshot; templates
//!                      live there as snapshots aliased `template:<name>`)
//!   templates/<name>/  template.json, memory.img, state.bin, disk.img
//!                      (templates built before the repository; still read)
//!   sandboxes/<id>/    sandbox.json, disk.qcow2, state.bin (when paused), run/
//!   ephemeral/<tag>-<pid>/<id>/  the same, of a bench's sandboxes (never the
//!                      server's: its recovery leaves them alone)
//!   run/pool/<n>/      sockets and logs of pre-spawned VMM processes
//!   cache/kernel-stubs/  the guest kernel's header, which restoring VMMs
//!                      load instead of the whole kernel (not under `run/`,
//!                      whose VM directories recovery owns)
//!   build-files/<sha256>.tar  files uploaded for COPY steps of template
//!                      builds, by the SHA-256 of the archive's inputs
//! ```

use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct Layout {
    home: PathBuf,
    /// Where sandbox directories go: `home/sandboxes` for the server, a
    /// directory of its own for a bench (see [`Layout::with_sandboxes`]).
    sandboxes: PathBuf,
}

impl Layout {
    pub fn new(home: &Path) -> Self {
        Self {
            home: home.to_path_buf(),
            sandboxes: home.join("sandboxes"),
        }
    }

    /// The same data directory, with sandbox directories in `dir`: a
    /// manager that is not the server (a bench) keeps its sandboxes apart,
    /// so that a server's recovery never takes them for its own leftovers.
    pub fn with_sandboxes(mut self, dir: PathBuf) -> Self {
        self.sandboxes = dir;
        self
    }
    pub fn home(&self) -> &Path {
        &self.home
    }
    pub fn kernel(&self) -> PathBuf {
        self.home.join("assets/vmlinuz")
    }
    pub fn initrd(&self) -> PathBuf {
        self.home.join("assets/initramfs.img")
    }
    /// The root filesystem image a template of `image` is built from.
    pub fn image(&self, image: &str) -> PathBuf {
        self.home.join(format!("assets/rootfs-{image}.img"))
    }
    /// The static guest agent that builds from images put into their
    /// guests (guest/build-assets.sh installs it).
    pub fn agent_bin(&self) -> PathBuf {
        self.home.join("assets/siesta-agent")
    }
    /// OCI blobs (layers, configs, manifests) by digest.
    pub fn image_cache(&self) -> PathBuf {
        self.home.join("cache/oci")
    }
    /// Markers of the snapshots fetched from the object store (their last
    /// use), which `fetch_cache.rs` bounds.
    pub fn fetched(&self) -> PathBuf {
        self.home.join("cache/fetched")
    }

    /// The lazy-fetch FUSE mount and its small files (`lazy/`).
    pub fn lazy(&self) -> PathBuf {
        self.home.join("lazy")
    }

    /// Template builds' step cache: the disk after each step.
    pub fn step_cache(&self) -> PathBuf {
        self.home.join("cache/steps")
    }
    /// Which template blobs were checked against their digests, and when
    /// (see [`crate::blob_checks`]).
    pub fn verified_blobs(&self) -> PathBuf {
        self.home.join("cache/verified")
    }
    /// The snapshot repository (see `docs/snapshots.md`).
    pub fn repo(&self) -> PathBuf {
        self.home.join("repo")
    }
    pub fn templates(&self) -> PathBuf {
        self.home.join("templates")
    }
    pub fn template_dir(&self, name: &str) -> PathBuf {
        self.templates().join(name)
    }
    pub fn sandboxes(&self) -> PathBuf {
        self.sandboxes.clone()
    }
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.sandboxes().join(id)
    }
    pub fn pool_dir(&self) -> PathBuf {
        self.home.join("run/pool")
    }
    /// Stand-ins for the guest kernel that VMMs restoring a snapshot load
    /// (`siesta_vmm::qemu::kernel_stub`).
    pub fn kernel_stubs(&self) -> PathBuf {
        self.home.join("cache/kernel-stubs")
    }
    /// Uploaded archives for the COPY steps of template builds.
    pub fn build_files(&self) -> PathBuf {
        self.home.join("build-files")
    }
}

/// Names of templates and sandboxes become directory names: keep them to a
/// safe alphabet so no request can escape the data directory.
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid {kind} name {name:?}: use 1-64 letters, digits, '-', '_' or '.', not starting with '.'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_escape_the_data_dir() {
        assert!(validate_name("template", "base").is_ok());
        assert!(validate_name("template", "my-tpl_2.1").is_ok());
        for bad in ["", "..", "../x", "a/b", ".hidden", &"x".repeat(65)] {
            assert!(validate_name("template", bad).is_err(), "{bad}");
        }
    }
}
