//! The one machine description every backend derives its VM from.

use std::path::PathBuf;

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
    /// A raw image to open as the qcow2 overlay's backing file instead of
    /// the one its header names (same content at another path: a
    /// template disk served lazily when the overlay was made).
    #[serde(default)]
    pub backing: Option<PathBuf>,
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
            for path in std::iter::once(&disk.path).chain(&disk.backing) {
                if path.to_str().is_none() {
                    return Err(bad(format!(
                        "disk path {} is not valid UTF-8",
                        path.display()
                    )));
                }
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
