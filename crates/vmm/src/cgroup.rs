//! A cgroup of its own for every VMM process, with memory, pids and CPU
//! limits.
//!
//! QEMU is the isolation boundary, and under TCG a weak one: a guest that
//! breaks into its QEMU must not take the node's memory, processes or CPU
//! with it. Each VMM is moved into `<hierarchy>/siesta-<tag>/<vm>.<n>`
//! before it executes (the child writes `0` into the group's
//! `cgroup.procs` between fork and exec), so even QEMU's first allocation
//! is counted. cgroup v2 is used where its memory, pids and cpu
//! controllers are available; otherwise the v1 hierarchies of the same
//! names (hosts that mount both, as this project's build machines do).
//! A host with neither runs its VMMs unconfined and says so.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::VmmError;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Controllers a VM's group is limited by.
const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// Scheduler period the CPU quota is given in.
const CPU_PERIOD_US: u64 = 100_000;

/// What one VMM may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    pub pids: u32,
    /// CPU time per period, in hundredths of a core.
    pub cpu_percent: u32,
}

impl CgroupLimits {
    /// Room for a VM of `memory_mib` and `vcpus`: its RAM twice over (the
    /// memory file's page cache and the private copies of written pages
    /// are both charged) plus 1 GiB for QEMU itself and TCG's translation
    /// cache; 256 tasks (vCPU, I/O and worker threads); its vCPUs plus one
    /// core of CPU for QEMU's own threads.
    pub fn for_vm(memory_mib: u64, vcpus: u32) -> Self {
        Self {
            memory_bytes: (memory_mib.saturating_mul(2).saturating_add(1024)) << 20,
            pids: 256,
            cpu_percent: (vcpus.max(1) + 1) * 100,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Hierarchy {
    /// The unified hierarchy's mount point.
    V2(PathBuf),
    /// One mount point per controller, in [`CONTROLLERS`] order.
    V1([PathBuf; 3]),
}

/// The parent group of one siesta instance's VMMs in whichever hierarchy
/// the host has; cheap to clone.
#[derive(Clone, Debug)]
pub struct Cgroups {
    hierarchy: Hierarchy,
    parent: String,
    next: Arc<AtomicU64>,
}

impl Cgroups {
    /// The usable hierarchy under `/sys/fs/cgroup` for groups named
    /// `parent` (e.g. `siesta-s`), or `None` when the host offers none
    /// this process may write (not root, controllers missing).
    pub fn detect(parent: &str) -> Result<Option<Self>, VmmError> {
        Self::detect_in(Path::new(CGROUP_ROOT), parent)
    }

    fn detect_in(root: &Path, parent: &str) -> Result<Option<Self>, VmmError> {
        let Some(hierarchy) = hierarchy_at(root) else {
            return Ok(None);
        };
        let this = Self {
            hierarchy,
            parent: safe_name(parent),
            next: Arc::new(AtomicU64::new(0)),
        };
        match this.prepare_parent() {
            Ok(()) => Ok(Some(this)),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Ok(None),
            Err(source) => Err(VmmError::Io {
                id: "node".into(),
                op: "create the VMMs' parent cgroup",
                path: this.parent_dirs()[0].clone(),
                source,
            }),
        }
    }

    /// `v2` or `v1`, for logs and `siesta doctor`.
    pub fn version(&self) -> &'static str {
        match self.hierarchy {
            Hierarchy::V2(_) => "v2",
            Hierarchy::V1(_) => "v1",
        }
    }

    fn parent_dirs(&self) -> Vec<PathBuf> {
        match &self.hierarchy {
            Hierarchy::V2(root) => vec![root.join(&self.parent)],
            Hierarchy::V1(roots) => roots.iter().map(|r| r.join(&self.parent)).collect(),
        }
    }

    fn prepare_parent(&self) -> std::io::Result<()> {
        for dir in self.parent_dirs() {
            std::fs::create_dir_all(&dir)?;
        }
        if let Hierarchy::V2(root) = &self.hierarchy {
            // Children get limits only for controllers their parent hands down.
            let enable = "+memory +pids +cpu";
            write_file(&root.join("cgroup.subtree_control"), enable)?;
            write_file(
                &root.join(&self.parent).join("cgroup.subtree_control"),
                enable,
            )?;
        }
        Ok(())
    }

    /// Removes this instance's VM groups that no process is in any more
    /// (those of a server that was killed); busy ones stay.
    pub fn remove_leftovers(&self) -> usize {
        let mut removed = 0;
        for dir in self.parent_dirs() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                // rmdir succeeds only on an empty group: never a live VM's.
                if entry.path().is_dir() && std::fs::remove_dir(entry.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Removes the VM groups no process is in, then the parent itself if
    /// it is empty (an instance that is done: a build, a bench, a test).
    pub fn remove_parent(&self) {
        self.remove_leftovers();
        for dir in self.parent_dirs() {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// A new group for VM `id` with `limits`, ready to be joined by the
    /// process about to exec the VMM.
    pub fn create(&self, id: &str, limits: &CgroupLimits) -> Result<VmCgroup, VmmError> {
        let name = format!(
            "{}.{}",
            safe_name(id),
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let mut group = VmCgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        let io = |op, path: &Path, source| VmmError::Io {
            id: id.to_string(),
            op,
            path: path.to_path_buf(),
            source,
        };
        for (parent, settings) in self.parent_dirs().iter().zip(self.settings(limits)) {
            let dir = parent.join(&name);
            std::fs::create_dir(&dir).map_err(|e| io("create the VMM's cgroup", &dir, e))?;
            group.dirs.push(dir.clone());
            for (file, value) in settings {
                let path = dir.join(file);
                write_file(&path, &value).map_err(|e| io("set a cgroup limit", &path, e))?;
            }
            let procs = dir.join("cgroup.procs");
            let f = OpenOptions::new()
                .write(true)
                .open(&procs)
                .map_err(|e| io("open cgroup.procs", &procs, e))?;
            group.procs.push(f);
        }
        Ok(group)
    }

    /// The files and values of `limits`, per parent directory.
    fn settings(&self, limits: &CgroupLimits) -> Vec<Vec<(&'static str, String)>> {
        let quota = u64::from(limits.cpu_percent) * CPU_PERIOD_US / 100;
        match self.hierarchy {
            Hierarchy::V2(_) => vec![vec![
                ("memory.max", limits.memory_bytes.to_string()),
                ("pids.max", limits.pids.to_string()),
                ("cpu.max", format!("{quota} {CPU_PERIOD_US}")),
            ]],
            Hierarchy::V1(_) => vec![
                vec![("memory.limit_in_bytes", limits.memory_bytes.to_string())],
                vec![("pids.max", limits.pids.to_string())],
                vec![
                    ("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ],
            ],
        }
    }
}

/// One VMM's group (one directory per hierarchy it is limited in).
/// Dropping it removes the directories, which works once its process is
/// gone; a group still in use stays for [`Cgroups::remove_leftovers`].
#[derive(Debug)]
pub struct VmCgroup {
    dirs: Vec<PathBuf>,
    procs: Vec<File>,
}

impl VmCgroup {
    /// The open `cgroup.procs` files the child writes `0` into before exec.
    pub fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// The group's directories (one per hierarchy).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

impl Drop for VmCgroup {
    fn drop(&mut self) {
        self.procs.clear();
        for dir in &self.dirs {
            if let Err(e) = std::fs::remove_dir(dir) {
                tracing::debug!(dir = %dir.display(), error = %e, "VMM cgroup not removed yet");
            }
        }
    }
}

/// Moves the calling process into each group of `fds`. Runs between fork
/// and exec, so it only calls write(2), which is async-signal-safe.
pub fn join_in_child(fds: &[RawFd]) -> std::io::Result<()> {
    for &fd in fds {
        // SAFETY: write(2) of a 1-byte buffer that outlives the call, on a
        // descriptor the parent keeps open until spawn returns.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// v2 when the unified hierarchy at `root` offers every controller, else
/// v1 when each controller has a hierarchy of its own under `root`.
fn hierarchy_at(root: &Path) -> Option<Hierarchy> {
    let offered = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let offered: Vec<&str> = offered.split_whitespace().collect();
    if CONTROLLERS.iter().all(|c| offered.contains(c)) {
        return Some(Hierarchy::V2(root.to_path_buf()));
    }
    let v1 = CONTROLLERS.map(|c| root.join(c));
    v1.iter()
        .all(|d| d.join("cgroup.procs").exists())
        .then_some(Hierarchy::V1(v1))
}

/// A directory name from an id: anything but letters, digits, `-` and `_`
/// becomes `_`, so no id names a path outside the parent.
fn safe_name(id: &str) -> String {
    let name: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "_".into()
    } else {
        name
    }
}

fn write_file(path: &Path, value: &str) -> std::io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_leave_room_for_qemu_and_its_threads() {
        let l = CgroupLimits::for_vm(512, 2);
        assert_eq!(l.memory_bytes, 2048 << 20);
        assert_eq!((l.pids, l.cpu_percent), (256, 300));
    }

    #[test]
    fn names_never_leave_the_parent() {
        assert_eq!(safe_name("../../etc"), "______etc");
        assert_eq!(safe_name("build-base_1"), "build-base_1");
        assert_eq!(safe_name(""), "_");
    }

    #[test]
    fn v2_is_chosen_only_with_every_controller_and_v1_otherwise() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(
            root.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        assert_eq!(
            hierarchy_at(root.path()),
            Some(Hierarchy::V2(root.path().into()))
        );
        std::fs::write(root.path().join("cgroup.controllers"), "hugetlb\n").unwrap();
        assert_eq!(hierarchy_at(root.path()), None);
        for c in CONTROLLERS {
            std::fs::create_dir(root.path().join(c)).unwrap();
            std::fs::write(root.path().join(c).join("cgroup.procs"), "").unwrap();
        }
        assert!(matches!(hierarchy_at(root.path()), Some(Hierarchy::V1(_))));
    }

    #[test]
    fn settings_name_each_hierarchy_s_files() {
        let l = CgroupLimits::for_vm(256, 1);
        let v2 = Cgroups {
            hierarchy: Hierarchy::V2("/x".into()),
            parent: "p".into(),
            next: Arc::default(),
        };
        assert_eq!(
            v2.settings(&l),
            [vec![
                ("memory.max", (1536u64 << 20).to_string()),
                ("pids.max", "256".into()),
                ("cpu.max", "200000 100000".into()),
            ]]
        );
        let v1 = Cgroups {
            hierarchy: Hierarchy::V1(["/m".into(), "/p".into(), "/c".into()]),
            ..v2
        };
        let s = v1.settings(&l);
        assert_eq!(s.len(), 3);
        assert_eq!(s[2][1], ("cpu.cfs_quota_us", "200000".into()));
    }
}
