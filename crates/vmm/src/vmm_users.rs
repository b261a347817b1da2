//! An unprivileged user of its own for every VMM process.
//!
//! QEMU starts as root (it must open the tap device, the memory file, the
//! disks and the console log its command line names, all under a 0700
//! home), then drops to the user it is given with `-runas uid:gid` before
//! it runs the guest. Each running VMM gets a uid no other running VMM has,
//! with a group of the same number and no other groups, and none of them
//! has a passwd entry: a guest that breaks into its QEMU holds no
//! capability, cannot signal or `ptrace` another sandbox's QEMU, and can
//! open only what is readable by everyone (the home is 0700 root, so
//! nothing of siesta's).
//!
//! The uids come from a range that no distribution or systemd hands out by
//! default (systemd leaves 1879048192..2147483647 unused), starting at
//! [`DEFAULT_UID_BASE`]. A uid returns to the range when its process has
//! been reaped, never before, so two live VMMs never share one.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// The first uid handed to a VMM by default.
pub const DEFAULT_UID_BASE: u32 = 1_900_000_000;
/// How many uids the range holds by default: more VMMs than one node runs.
pub const DEFAULT_UID_COUNT: u32 = 65_536;

/// The range VMM users are drawn from, and which of them are taken.
#[derive(Debug)]
pub struct VmmUsers {
    base: u32,
    count: u32,
    taken: Mutex<BTreeSet<u32>>,
}

/// One VMM's user, taken from [`VmmUsers`] until dropped.
#[derive(Debug)]
pub struct VmmUser {
    uid: u32,
    users: Arc<VmmUsers>,
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
            taken: Mutex::new(BTreeSet::new()),
        }))
    }

    /// The default range.
    pub fn default_range() -> Arc<Self> {
        Self::new(DEFAULT_UID_BASE, DEFAULT_UID_COUNT).expect("the default range is valid")
    }

    /// The lowest free uid, or `None` when every one is taken.
    pub fn take(self: &Arc<Self>) -> Option<VmmUser> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let offset = (0..self.count).find(|o| !taken.contains(&(self.base + o)))?;
        let uid = self.base + offset;
        taken.insert(uid);
        Some(VmmUser {
            uid,
            users: Arc::clone(self),
        })
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

    /// How many uids are taken now.
    pub fn in_use(&self) -> usize {
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).len()
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
}

impl Drop for VmmUser {
    fn drop(&mut self) {
        let mut taken = self.users.taken.lock().unwrap_or_else(|p| p.into_inner());
        taken.remove(&self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_users_never_share_a_uid_and_a_dropped_one_is_reused() {
        let users = VmmUsers::new(5000, 3).unwrap();
        let a = users.take().unwrap();
        let b = users.take().unwrap();
        let c = users.take().unwrap();
        assert_eq!([a.uid(), b.uid(), c.uid()], [5000, 5001, 5002]);
        assert!(users.take().is_none(), "the range is exhausted");
        drop(b);
        assert_eq!(users.in_use(), 2);
        let d = users.take().unwrap();
        assert_eq!(d.uid(), 5001);
        assert_eq!(d.runas_arg(), "5001:5001");
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
        assert!(VmmUsers::new(10, 0).is_none());
        assert!(VmmUsers::new(u32::MAX - 10, 10).is_none());
        assert!(VmmUsers::new(u32::MAX - 10, 9).is_some());
        assert!(DEFAULT_UID_BASE.checked_add(DEFAULT_UID_COUNT).is_some());
    }
}
