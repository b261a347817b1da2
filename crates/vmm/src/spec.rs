//! The one machine description every backend derives its VM from.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::VmmError;

/// Everything needed to start one VMM process. Boot and restore of the same
/// machine must use the same spec (apart from `id`, `run_dir`, `mode` and
/// `memory.shared`), so that the saved device state matches the devices the
/// restoring VMM creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Unique name of this VM; appears in every error.
    pub id: String,
    /// Directory for the control socket, serial log and VMM log; created if
    /// missing. Keep the path short: a Unix socket path has at most 107 bytes.
    pub run_dir: PathBuf,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub memory: MemoryBacking,
    pub disk: Option<DiskSpec>,
    pub net: Option<NetSpec>,
    pub mode: LaunchMode,
    /// Write the guest's serial console to [`LaunchSpec::serial_log_path`].
    /// Without it the serial port still exists (so device state is the same)
    /// but its output is discarded.
    pub serial_log: bool,
}

/// Guest RAM as a file mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBacking {
    pub path: PathBuf,
    /// `true`: MAP_SHARED, guest writes land in the file (used to build a
    /// template; start from a missing or empty file, which QEMU creates
    /// sparse, or old contents end up in the template). `false`: MAP_PRIVATE copy-on-write of a file that is never
    /// modified, so every VM restored from one template shares its page cache.
    pub shared: bool,
    /// Populate every page before the guest runs (QEMU `prealloc=on`), so
    /// the restored guest takes no page faults on its memory. With a private
    /// mapping QEMU writes each page, which copies the whole file into
    /// anonymous memory: the VM no longer shares the template's page cache.
    /// Done when the VMM starts, before the snapshot is loaded.
    #[serde(default)]
    pub prealloc: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    Raw,
    Qcow2,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub format: DiskFormat,
    pub read_only: bool,
    /// Every file below the image, nearest first, as the caller recorded
    /// them: the VMM opens exactly these and follows no name from a qcow2
    /// header (a VMM can rewrite its image's header; see
    /// [`crate::disk_image`]). Empty: the image stands alone.
    #[serde(default)]
    pub backing: Vec<BackingFile>,
}

/// The most files below a disk image a spec may name.
pub const MAX_BACKING_DEPTH: usize = 32;

/// One read-only file below a disk image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackingFile {
    pub path: PathBuf,
    pub format: DiskFormat,
}

impl BackingFile {
    pub fn raw(path: PathBuf) -> Self {
        Self {
            path,
            format: DiskFormat::Raw,
        }
    }
}

impl DiskSpec {
    /// A writable qcow2 overlay at `path` over the raw image `base`: every
    /// sandbox's disk over its template's.
    pub fn overlay_of_raw(path: PathBuf, base: PathBuf) -> Self {
        Self {
            path,
            format: DiskFormat::Qcow2,
            read_only: false,
            backing: vec![BackingFile::raw(base)],
        }
    }

    /// The image and every file below it, top first.
    pub fn files(&self) -> impl Iterator<Item = (&PathBuf, DiskFormat)> {
        std::iter::once((&self.path, self.format))
            .chain(self.backing.iter().map(|b| (&b.path, b.format)))
    }

    /// Refuses the disk if any of its images would make whoever opens it
    /// open a file nobody named ([`crate::disk_image::check`]).
    pub fn check_images(&self) -> Result<(), String> {
        self.files()
            .try_for_each(|(path, format)| crate::disk_image::check_path(path, format))
    }

    /// The image's block node as QEMU's `-blockdev`, `blockdev-add` and
    /// `qemu-img --image-opts`-style `json:` names take it, with `file(path)`
    /// as each file's protocol node: the whole chain is spelled out and
    /// ends in `"backing": null`, so QEMU opens no file a header names.
    /// `file` is called in [`Self::files`] order.
    pub fn block_node(
        &self,
        file: &mut dyn FnMut(&Path) -> serde_json::Value,
    ) -> serde_json::Value {
        let nodes: Vec<_> = self.files().map(|(p, format)| (format, file(p))).collect();
        nodes
            .into_iter()
            .rev()
            .fold(serde_json::Value::Null, |below, (format, file)| {
                chained(format, file, below)
            })
    }
}

/// One format node over `file`; a qcow2 one gets `backing` (null for none).
fn chained(
    format: DiskFormat,
    file: serde_json::Value,
    backing: serde_json::Value,
) -> serde_json::Value {
    let mut v = serde_json::json!({ "driver": format.as_str(), "file": file });
    if format == DiskFormat::Qcow2 {
        v["backing"] = backing;
    }
    v
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetSpec {
    /// `/run/netns/NAME`: the VMM process is started inside this network
    /// namespace, where the tap device lives.
    pub netns: Option<PathBuf>,
    pub tap: String,
    pub mac: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LaunchMode {
    /// Boot the kernel; vCPUs start at [`crate::VmInstance::boot`].
    Boot,
    /// Wait for a state file; see [`crate::VmInstance::restore`].
    Incoming,
}

/// Longest Unix socket path the kernel accepts (sun_path is 108 bytes with NUL).
const MAX_SOCKET_PATH: usize = 107;

impl LaunchSpec {
    /// The VMM's control socket (QMP for QEMU, the API socket for Firecracker).
    pub fn control_socket_path(&self) -> PathBuf {
        self.run_dir.join("vmm.sock")
    }

    /// The guest's serial console output when `serial_log` is set.
    pub fn serial_log_path(&self) -> PathBuf {
        self.run_dir.join("serial.log")
    }

    /// The VMM process's stdout and stderr; its tail is quoted in errors.
    pub fn vmm_log_path(&self) -> PathBuf {
        self.run_dir.join("vmm.log")
    }

    /// Checks what can be checked without starting anything, so a mistake is
    /// reported by name instead of as a VMM exit.
    pub fn validate(&self) -> Result<(), VmmError> {
        let bad = |detail: String| VmmError::InvalidSpec {
            id: self.id.clone(),
            detail,
        };
        if self.id.is_empty() || self.id.contains(|c: char| c.is_control() || c == '/') {
            return Err(bad(format!(
                "id {:?} must be non-empty, without '/' or control characters",
                self.id
            )));
        }
        if self.vcpus == 0 {
            return Err(bad("vcpus must be at least 1".into()));
        }
        if self.memory_mib == 0 {
            return Err(bad("memory_mib must be at least 1".into()));
        }
        let sock = self.control_socket_path();
        if sock.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(bad(format!(
                "control socket path {} is longer than {MAX_SOCKET_PATH} bytes; use a shorter run_dir",
                sock.display()
            )));
        }
        if let Some(disk) = &self.disk {
            // QEMU is given the disk's paths in JSON.
            for (path, _) in disk.files() {
                if path.to_str().is_none() {
                    return Err(bad(format!(
                        "disk path {} is not valid UTF-8",
                        path.display()
                    )));
                }
            }
            let formats: Vec<DiskFormat> = disk.files().map(|(_, f)| f).collect();
            if formats[..formats.len() - 1].contains(&DiskFormat::Raw) {
                return Err(bad("only the last file of a disk's chain can be raw".into()));
            }
            if disk.backing.len() > MAX_BACKING_DEPTH {
                return Err(bad(format!(
                    "the disk's chain has {} files below it; at most {MAX_BACKING_DEPTH}",
                    disk.backing.len()
                )));
            }
        }
        if let Some(net) = &self.net {
            if net.tap.is_empty() || net.tap.len() > 15 || net.tap.contains([',', '/']) {
                return Err(bad(format!(
                    "tap name {:?} must be 1-15 characters without ',' or '/'",
                    net.tap
                )));
            }
            if !is_mac(&net.mac) {
                return Err(bad(format!(
                    "mac {:?} is not of the form 02:00:00:00:00:01",
                    net.mac
                )));
            }
        }
        Ok(())
    }
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn spec() -> LaunchSpec {
        LaunchSpec {
            id: "vm1".into(),
            run_dir: "/run/siesta/vm1".into(),
            vcpus: 2,
            memory_mib: 512,
            kernel: "/k/vmlinuz".into(),
            initrd: Some("/k/initrd".into()),
            cmdline: "console=ttyS0 quiet".into(),
            memory: MemoryBacking {
                path: "/t/mem.img".into(),
                shared: true,
                prealloc: false,
            },
            disk: None,
            net: None,
            mode: LaunchMode::Boot,
            serial_log: true,
        }
    }

    #[test]
    fn validate_accepts_a_good_spec_and_names_the_problem() {
        spec().validate().unwrap();
        let mut s = spec();
        s.run_dir = PathBuf::from(format!("/{}", "x".repeat(120)));
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("vm1") && e.contains("socket path"), "{e}");
        let mut s = spec();
        s.net = Some(NetSpec {
            netns: None,
            tap: "tap0".into(),
            mac: "02:00:00:00:00:zz".into(),
        });
        assert!(s.validate().unwrap_err().to_string().contains("mac"));
        let mut s = spec();
        s.vcpus = 0;
        assert!(s.validate().is_err());
    }
}
