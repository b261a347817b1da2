//! An unprivileged user of its own for every VMM process.
//!
//! QEMU starts as root (it must open the tap device, the memory file, the
//! disks and the console log its command line names, all under a 0700
//! home), then drops to the user it is given with `-runas uid:gid` before
//! it runs the guest. Each running VMM gets a uid no other running VMM has,
//! with a group of the same number and no other groups, and none of them
//! has a passwd entry: a guest that breaks into its QEMU holds no
//! capability, cannot signal or `ptrace` another sandbox's QEMU, and can
//! open nothing of siesta's (the home is 0700 root). As it drops it is also
//! `chroot`ed into an empty directory beside the lock file (`vmm-root`),
//! so not even what every user of the host may read has a path it can
//! open.
//!
//! The uids come from a range that no distribution or systemd hands out by
//! default (systemd leaves 1879048192..2147483647 unused), starting at
//! [`DEFAULT_UID_BASE`].
//!
//! Two live VMMs never share a uid, on the whole host: a server and a
//! `siesta template build` or `siesta bench` beside it draw from the same
//! range. Each uid taken is locked in one lock file of the host
//! ([`DEFAULT_LOCK_FILE`]): an open-file-description lock on the byte at
//! offset `uid`, held by the siesta process until its VMM has been
//! reaped. QEMU never gets the descriptor (a QEMU taken over could unlock
//! its uid, or lock every other). A VMM that outlives the process that
//! started it (a killed server's) no longer has a lock, so a uid is also
//! skipped while any process of the host runs as it (`/proc`).
//! Uids are handed out round-robin rather than lowest-free, so what a VMM
//! left behind in world-writable places (`/tmp`, `/dev/shm`) is not the
//! very next VMM's to read.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The first uid handed to a VMM by default.
pub const DEFAULT_UID_BASE: u32 = 1_900_000_000;
/// How many uids the range holds by default: more VMMs than one node runs.
pub const DEFAULT_UID_COUNT: u32 = 65_536;
/// The host's lock file for VMM uids (root's, on tmpfs: a reboot frees all).
pub const DEFAULT_LOCK_FILE: &str = "/run/siesta/vmm-users.lock";
/// The empty directory a VMM is `chroot`ed into, beside the lock file.
const ROOT_DIR_NAME: &str = "vmm-root";

/// The range VMM users are drawn from, and which of them are taken.
#[derive(Debug)]
pub struct VmmUsers {
    base: u32,
    count: u32,
    lock_file: PathBuf,
    state: Mutex<Taken>,
}

#[derive(Debug, Default)]
struct Taken {
    /// Uids this process has handed out and not had back.
    uids: BTreeSet<u32>,
    /// Where the next search starts (an offset into the range).
    next: u32,
}

/// One VMM's user, taken from [`VmmUsers`] until dropped.
#[derive(Debug)]
pub struct VmmUser {
    uid: u32,
    users: Arc<VmmUsers>,
    /// Holds the host-wide lock on `uid` (never handed to the VMM).
    _lock: File,
}

impl VmmUsers {
    /// `count` uids from `base` on; `None` if the range would pass
    /// `u32::MAX - 1` (`-1` means "no user" to the kernel) or includes root.
    pub fn new(base: u32, count: u32) -> Option<Arc<Self>> {
        if base == 0 || count == 0 || base.checked_add(count)? == u32::MAX {
            return None;
        }
        Some(Arc::new(VmmUsers {
            base,
            count,
            lock_file: PathBuf::from(DEFAULT_LOCK_FILE),
            state: Mutex::new(Taken::default()),
        }))
    }

    /// The same range, locked in `lock_file` instead of the host's
    /// [`DEFAULT_LOCK_FILE`] (tests).
    pub fn with_lock_file(base: u32, count: u32, lock_file: PathBuf) -> Option<Arc<Self>> {
        let users = Self::new(base, count)?;
        Some(Arc::new(VmmUsers {
            lock_file,
            ..Arc::into_inner(users)?
        }))
    }

    /// The default range.
    pub fn default_range() -> Arc<Self> {
        Self::new(DEFAULT_UID_BASE, DEFAULT_UID_COUNT).expect("the default range is valid")
    }

    /// The next uid after the last one handed out that no process of the
    /// host runs as and no other siesta process has locked, locked until
    /// the returned user is dropped (after its VMM has been reaped).
    pub fn take(self: &Arc<Self>) -> Result<VmmUser, String> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        make_private_dir(self.lock_file.parent())?;
        make_empty_root(&self.root_dir())?;
        let running = uids_running(self.base, self.count);
        for i in 0..self.count {
            let offset = ((u64::from(state.next) + u64::from(i)) % u64::from(self.count)) as u32;
            let uid = self.base + offset;
            if state.uids.contains(&uid) || running.contains(&uid) {
                continue;
            }
            let Some(lock) = lock_uid(&self.lock_file, uid)? else {
                continue; // another siesta process's VMM runs as it
            };
            state.uids.insert(uid);
            state.next = (offset + 1) % self.count;
            return Ok(VmmUser {
                uid,
                users: Arc::clone(self),
                _lock: lock,
            });
        }
        Err(format!(
            "all {} VMM users of this host are taken ({} by this process): \
             no VMM can start until one exits",
            self.count,
            state.uids.len()
        ))
    }

    /// Users and groups of the host (`/etc/passwd`, `/etc/group`) whose ids
    /// lie in the range, as `user NAME (ID)` / `group NAME (ID)`: a VMM
    /// given one of those ids could open that user's files.
    pub fn host_ids_in_range(&self) -> Vec<String> {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let mut found = ids_in(&read("/etc/passwd"), "user", self.base, self.count);
        found.extend(ids_in(&read("/etc/group"), "group", self.base, self.count));
        found
    }

    /// The empty directory VMMs are `chroot`ed into (made by [`Self::take`]).
    pub fn root_dir(&self) -> PathBuf {
        self.lock_file.with_file_name(ROOT_DIR_NAME)
    }

    /// How many uids this process has taken now.
    pub fn in_use(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .uids
            .len()
    }
}

/// The uids in `base..base + count` that a live process of the host runs
/// as (the owner of `/proc/PID` is the process's effective uid).
fn uids_running(base: u32, count: u32) -> BTreeSet<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    let is_pid = |e: &std::fs::DirEntry| {
        e.file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
    };
    procs
        .flatten()
        .filter(is_pid)
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .filter(|uid| uid.checked_sub(base).is_some_and(|o| o < count))
        .collect()
}

/// Creates `dir` (the lock file's directory) private to its owner if
/// missing.
fn make_private_dir(dir: Option<&Path>) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = dir else { return Ok(()) };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("creating {}: {e}", dir.display()))
}

/// Makes `dir` (in a private directory) an empty directory nobody but its
/// owner can write, or checks that it is one.
fn make_empty_root(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let ctx = |what: &str, e: std::io::Error| format!("{what} {}: {e}", dir.display());
    match std::fs::DirBuilder::new().mode(0o555).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(ctx("creating", e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| ctx("reading", e))?;
    let empty = std::fs::read_dir(dir)
        .map_err(|e| ctx("listing", e))?
        .next()
        .is_none();
    let foreign_writable = meta.permissions().mode() & 0o022 != 0 || meta.uid() != own_uid();
    if !meta.is_dir() || !empty || foreign_writable {
        return Err(format!(
            "{} must be an empty directory only root can write (VMMs are chrooted there)",
            dir.display()
        ));
    }
    Ok(())
}

/// The uid this process runs as (the owner of what it creates).
fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Locks byte `uid` of `lock_file` on a descriptor of its own; `None` if
/// another open file description holds it.
fn lock_uid(lock_file: &Path, uid: u32) -> Result<Option<File>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let ctx = |what: &str, e: std::io::Error| format!("{what} {}: {e}", lock_file.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(lock_file)
        .map_err(|e| ctx("opening", e))?;
    // SAFETY: an all-zero `flock` is a valid value of the plain C struct.
    let mut range: libc::flock = unsafe { std::mem::zeroed() };
    range.l_type = libc::F_WRLCK as libc::c_short;
    range.l_whence = libc::SEEK_SET as libc::c_short;
    range.l_start = libc::off_t::from(uid);
    range.l_len = 1;
    // SAFETY: F_OFD_SETLK on a descriptor `file` owns, with a valid struct.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &range) } == 0 {
        return Ok(Some(file));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(None),
        _ => Err(ctx(&format!("locking uid {uid} in"), e)),
    }
}

/// Entries of a passwd- or group-style file whose id (the third field)
/// lies in `base..base + count`.
fn ids_in(file: &str, kind: &str, base: u32, count: u32) -> Vec<String> {
    file.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id: u32 = fields.nth(1)?.parse().ok()?;
            (id >= base && id - base < count).then(|| format!("{kind} {name} ({id})"))
        })
        .collect()
}

impl VmmUser {
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The user's group: the same number.
    pub fn gid(&self) -> u32 {
        self.uid
    }

    /// QEMU's `-runas` argument.
    pub fn runas_arg(&self) -> String {
        format!("{}:{}", self.uid(), self.gid())
    }

    /// Who QEMU becomes: this user, in the empty root directory.
    pub fn run_as(&self) -> crate::qemu::cmdline::RunAs {
        crate::qemu::cmdline::RunAs {
            user: self.runas_arg(),
            root: self.users.root_dir(),
        }
    }
}

impl Drop for VmmUser {
    fn drop(&mut self) {
        let mut state = self.users.state.lock().unwrap_or_else(|p| p.into_inner());
        state.uids.remove(&self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(dir: &Path, base: u32, count: u32) -> Arc<VmmUsers> {
        VmmUsers::with_lock_file(base, count, dir.join("run/vmm-users.lock")).unwrap()
    }

    #[test]
    fn live_users_never_share_a_uid_and_uids_go_round() {
        let d = tempfile::tempdir().unwrap();
        let users = users(d.path(), 5000, 3);
        let a = users.take().unwrap();
        let b = users.take().unwrap();
        let c = users.take().unwrap();
        assert_eq!([a.uid(), b.uid(), c.uid()], [5000, 5001, 5002]);
        let e = users.take().unwrap_err();
        assert!(e.contains("all 3 VMM users"), "{e}");
        drop(b);
        assert_eq!(users.in_use(), 2);
        let d2 = users.take().unwrap();
        assert_eq!(d2.uid(), 5001);
        assert_eq!(d2.runas_arg(), "5001:5001");
        drop((a, c));
        // Round-robin: after 5001 comes 5002, not the lowest free 5000.
        assert_eq!(users.take().unwrap().uid(), 5002);
    }

    #[test]
    fn two_processes_of_one_host_never_share_a_uid() {
        let d = tempfile::tempdir().unwrap();
        // Two `VmmUsers` over one lock file stand for two siesta processes
        // (each opens the file anew, so each holds its own description).
        let server = users(d.path(), 7000, 4);
        let build = users(d.path(), 7000, 4);
        let s1 = server.take().unwrap();
        let b1 = build.take().unwrap();
        let s2 = server.take().unwrap();
        let b2 = build.take().unwrap();
        let mut uids = vec![s1.uid(), b1.uid(), s2.uid(), b2.uid()];
        uids.sort_unstable();
        uids.dedup();
        assert_eq!(uids.len(), 4, "a uid was handed out twice");
        assert!(build.take().is_err() && server.take().is_err());
        // A lease given back frees its uid for the other process.
        let uid = s1.uid();
        drop(s1);
        assert_eq!(build.take().unwrap().uid(), uid);
    }

    #[test]
    fn uids_a_process_runs_as_are_seen() {
        let me = own_uid();
        assert!(uids_running(me, 1).contains(&me));
    }

    #[test]
    fn the_chroot_dir_must_be_empty() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("vmm-root");
        make_empty_root(&root).unwrap();
        make_empty_root(&root).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&root).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o555);
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(root.join("planted"), b"x").unwrap();
        let e = make_empty_root(&root).unwrap_err();
        assert!(e.contains("empty directory"), "{e}");
    }

    #[test]
    fn host_users_and_groups_inside_the_range_are_found() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      odd:x:1900000005:100::/home/odd:/bin/sh\n\
                      after:x:1900065536:100::/:/bin/sh\n\
                      broken line\n";
        assert_eq!(
            ids_in(passwd, "user", 1_900_000_000, 65_536),
            ["user odd (1900000005)"]
        );
        assert!(ids_in("g:x:12:\n", "group", 1_900_000_000, 65_536).is_empty());
        assert!(VmmUsers::default_range().host_ids_in_range().is_empty());
    }

    #[test]
    fn ranges_that_hold_root_or_minus_one_are_refused() {
        assert!(VmmUsers::new(0, 10).is_none());
        assert!(VmmUsers::with_lock_file(0, 10, "/x".into()).is_none());
        assert!(VmmUsers::new(10, 0).is_none());
        assert!(VmmUsers::new(u32::MAX - 10, 10).is_none());
        assert!(VmmUsers::new(u32::MAX - 10, 9).is_some());
        assert!(DEFAULT_UID_BASE.checked_add(DEFAULT_UID_COUNT).is_some());
    }
}
