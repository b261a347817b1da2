//! Files handed to a running VMM as descriptors instead of paths.
//!
//! A VMM that has dropped to a user of its own (see [`crate::vmm_users`])
//! can open nothing under the server's 0700 home. Every file it needs after
//! start-up is therefore opened here, by the server, and handed over with
//! `add-fd`; QEMU then opens `/dev/fdset/ID`, which duplicates the
//! descriptor of the set with the access mode it asks for. The same path is
//! taken when the VMM runs as root, so there is one way files reach a
//! running VMM, tested on every run.
//!
//! Files QEMU opens this way: a disk given to a waiting VMM
//! (`replace_disk`, each file of its chain), a checkpoint's new overlay and
//! the device state of a changed-pages save. Migration streams go by
//! `getfd` (see [`super`]).

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::path::Path;

use super::QemuInstance;
use crate::VmmError;

/// How the server opens a file it hands over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    ReadWrite,
    /// Created (or emptied) for writing, mode 0600.
    CreateWrite,
}

/// A set QEMU holds one descriptor in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FdSet(pub u64);

impl FdSet {
    /// The name QEMU opens the file by.
    pub fn path(self) -> String {
        format!("/dev/fdset/{}", self.0)
    }
}

impl QemuInstance {
    /// Opens `path` as `access` asks and hands it to QEMU in a set of its
    /// own. The server's descriptor is closed again on return; QEMU's copy
    /// stays in the set until [`Self::drop_fdsets`].
    pub(super) async fn pass_file(
        &mut self,
        op: &'static str,
        path: &Path,
        access: Access,
    ) -> Result<FdSet, VmmError> {
        let file = open(path, access).map_err(|e| self.io(op, path, e))?;
        self.pass_open_file(file).await
    }

    /// Hands QEMU `file`, opened (and checked) by the caller, in a set of
    /// its own.
    pub(super) async fn pass_open_file(&mut self, file: File) -> Result<FdSet, VmmError> {
        let id = qmp!(self, "add-fd", self.qmp.add_fd(file.as_fd()));
        Ok(FdSet(id))
    }

    /// Takes `sets` back from QEMU (best effort: a set left behind costs
    /// one descriptor in a VMM that is being torn down anyway).
    pub(super) async fn drop_fdsets(&mut self, sets: &[FdSet]) {
        for set in sets {
            if let Err(e) = self.qmp.remove_fdset(set.0).await {
                tracing::debug!(vm = %self.spec.id, fdset = set.0, "remove-fd: {e}");
            }
        }
    }
}

pub(super) fn open(path: &Path, access: Access) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = OpenOptions::new();
    match access {
        Access::Read => o.read(true),
        Access::ReadWrite => o.read(true).write(true),
        Access::CreateWrite => o.write(true).create(true).truncate(true).mode(0o600),
    };
    o.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn access_mode(f: &File) -> i32 {
        // SAFETY: F_GETFL on a descriptor `f` owns.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) & libc::O_ACCMODE }
    }

    #[test]
    fn each_access_opens_the_mode_qemu_will_ask_the_set_for() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let w = open(&p, Access::CreateWrite).unwrap();
        assert_eq!(access_mode(&w), libc::O_WRONLY);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(w.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            access_mode(&open(&p, Access::Read).unwrap()),
            libc::O_RDONLY
        );
        assert_eq!(
            access_mode(&open(&p, Access::ReadWrite).unwrap()),
            libc::O_RDWR
        );
        assert!(open(&d.path().join("missing"), Access::Read).is_err());
        assert_eq!(FdSet(7).path(), "/dev/fdset/7");
    }
}
