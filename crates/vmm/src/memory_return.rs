//! Giving the host back memory an idle guest freed, through the kernel's
//! same-page merging (KSM) with `use_zero_pages`.
//!
//! Templates boot with `init_on_free=1`, so a page the guest frees is zeroed
//! at once. On the host that page is still a private (copy-on-write) page of
//! the VMM's guest-RAM mapping: the memory stays used until the sandbox is
//! paused. QEMU marks guest RAM `MADV_MERGEABLE` by default (`-machine
//! mem-merge=on`); with KSM running and `use_zero_pages` set, `ksmd` maps
//! each all-zero private page to the kernel's shared zero page and frees it.
//! The guest keeps reading zeros, which is what `init_on_free` guests rely
//! on (a page they allocate later is not zeroed again), and its next write
//! copies the zero page as any first write would.
//!
//! Why not virtio-balloon free page reporting: QEMU 7.2 discards a reported
//! range of file-backed RAM by punching a hole in the *file*
//! (`ram_block_discard_range`), and guest RAM here is a private mapping of
//! the template's memory file that every sandbox of the template maps; a
//! `MADV_DONTNEED` alone would bring back the template's page, not zeros.
//!
//! KSM also merges identical non-zero pages (across sandboxes too): that
//! saves more memory, and is a known timing side channel between guests
//! (a write to a merged page is slower). `memory_return = false` in the
//! node's configuration leaves KSM alone.
//!
//! KSM is a host-wide setting: it is switched on and left on (as
//! `net.ipv4.ip_forward` is), never switched off or told to unmerge, since
//! other VMs on the host may rely on it.

use std::path::{Path, PathBuf};

/// Where the kernel exposes KSM.
pub const KSM_SYSFS: &str = "/sys/kernel/mm/ksm";

#[derive(Debug, thiserror::Error)]
pub enum MemoryReturnError {
    #[error("memory return needs KSM, and this kernel has none ({} is missing; build the host kernel with CONFIG_KSM, or set memory_return = false)", dir.display())]
    NoKsm { dir: PathBuf },
    #[error("memory return: cannot {op} {}: {source} (run as root, or set memory_return = false)", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("memory return: {} holds {value:?}, not a number", path.display())]
    Parse { path: PathBuf, value: String },
}

/// How `ksmd` scans, when this node sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScanRate {
    /// Pages scanned per wake-up (`pages_to_scan`); `None` keeps the host's.
    pub pages_to_scan: Option<u32>,
}

/// KSM's counters that tell what was returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KsmCounters {
    /// Private pages now mapped to the kernel's zero page.
    pub zero_pages: u64,
    /// Pages that share another page's frame (non-zero merging).
    pub pages_sharing: u64,
    /// Full passes over all mergeable memory so far.
    pub full_scans: u64,
}

/// The host's KSM control files.
#[derive(Debug, Clone)]
pub struct Ksm {
    dir: PathBuf,
}

impl Ksm {
    /// KSM at [`KSM_SYSFS`].
    pub fn host() -> Self {
        Self::at(Path::new(KSM_SYSFS))
    }

    /// KSM's files under `dir` (tests point this at a directory of their own).
    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// Switches zero-page merging on (`use_zero_pages=1`, `run=1`), and the
    /// scan rate where one is given. Writes only what differs, so a host
    /// already set up is not touched.
    pub fn enable(&self, rate: ScanRate) -> Result<(), MemoryReturnError> {
        if !self.dir.is_dir() {
            return Err(MemoryReturnError::NoKsm {
                dir: self.dir.clone(),
            });
        }
        // use_zero_pages first: pages merged before it is set go to KSM's
        // own stable tree instead of the zero page.
        self.ensure("use_zero_pages", 1)?;
        if let Some(pages) = rate.pages_to_scan {
            self.ensure("pages_to_scan", u64::from(pages))?;
        }
        self.ensure("run", 1)
    }

    /// Starts or stops `ksmd` (`run=1|0`; stopping keeps what it merged).
    /// For measurements that compare with and without it; a node only
    /// ever [`enable`](Self::enable)s.
    pub fn set_running(&self, on: bool) -> Result<(), MemoryReturnError> {
        self.ensure("run", u64::from(on))
    }

    /// Whether this process may change KSM's settings (root, sysfs
    /// writable).
    pub fn writable(&self) -> bool {
        nix::unistd::access(&self.dir.join("run"), nix::unistd::AccessFlags::W_OK).is_ok()
    }

    /// Whether `ksmd` runs with zero-page merging.
    pub fn is_enabled(&self) -> Result<bool, MemoryReturnError> {
        Ok(self.read("run")? == 1 && self.read("use_zero_pages")? == 1)
    }

    pub fn counters(&self) -> Result<KsmCounters, MemoryReturnError> {
        Ok(KsmCounters {
            zero_pages: self.read("ksm_zero_pages")?,
            pages_sharing: self.read("pages_sharing")?,
            full_scans: self.read("full_scans")?,
        })
    }

    fn ensure(&self, name: &str, value: u64) -> Result<(), MemoryReturnError> {
        if self.read(name)? == value {
            return Ok(());
        }
        let path = self.dir.join(name);
        std::fs::write(&path, value.to_string()).map_err(|source| MemoryReturnError::Io {
            op: "write",
            path,
            source,
        })
    }

    fn read(&self, name: &str) -> Result<u64, MemoryReturnError> {
        let path = self.dir.join(name);
        let text = std::fs::read_to_string(&path).map_err(|source| MemoryReturnError::Io {
            op: "read",
            path: path.clone(),
            source,
        })?;
        text.trim().parse().map_err(|_| MemoryReturnError::Parse {
            path,
            value: text.trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_ksm(run: &str, zero: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, value) in [
            ("run", run),
            ("use_zero_pages", zero),
            ("pages_to_scan", "100"),
            ("ksm_zero_pages", "7"),
            ("pages_sharing", "3"),
            ("full_scans", "2"),
        ] {
            std::fs::write(dir.path().join(name), format!("{value}\n")).unwrap();
        }
        dir
    }

    fn value(dir: &Path, name: &str) -> String {
        std::fs::read_to_string(dir.join(name)).unwrap()
    }

    #[test]
    fn enable_sets_zero_pages_run_and_the_scan_rate_given() {
        let dir = fake_ksm("0", "0");
        let ksm = Ksm::at(dir.path());
        assert!(!ksm.is_enabled().unwrap());
        ksm.enable(ScanRate {
            pages_to_scan: Some(1000),
        })
        .unwrap();
        assert!(ksm.is_enabled().unwrap());
        assert_eq!(value(dir.path(), "pages_to_scan"), "1000");
        assert_eq!(
            ksm.counters().unwrap(),
            KsmCounters {
                zero_pages: 7,
                pages_sharing: 3,
                full_scans: 2
            }
        );
    }

    #[test]
    fn an_enabled_host_is_left_as_it_is() {
        let dir = fake_ksm("1", "1");
        Ksm::at(dir.path()).enable(ScanRate::default()).unwrap();
        // Untouched: the files keep the newline a write would not add.
        assert_eq!(value(dir.path(), "run"), "1\n");
        assert_eq!(value(dir.path(), "pages_to_scan"), "100\n");
    }

    #[test]
    fn a_kernel_without_ksm_is_named_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let err = Ksm::at(&dir.path().join("ksm"))
            .enable(ScanRate::default())
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("CONFIG_KSM") && msg.contains("memory_return = false"),
            "{msg}"
        );
    }

    #[test]
    fn garbage_in_a_counter_is_an_error_naming_the_file() {
        let dir = fake_ksm("1", "1");
        std::fs::write(dir.path().join("full_scans"), "lots").unwrap();
        let msg = Ksm::at(dir.path()).counters().unwrap_err().to_string();
        assert!(msg.contains("full_scans") && msg.contains("lots"), "{msg}");
    }
}
