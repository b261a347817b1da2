//! Acting on the filesystem on behalf of a guest user.
//!
//! The agent runs as root, so the kernel would allow everything. A request
//! made as `user` must not read `/root` or write `/etc`, so before touching a
//! path the agent checks the classic mode bits for that user (owner, group
//! incl. supplementary groups, other), and what it creates it hands to the
//! user with `chown`, as envd does.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use crate::rpc::RpcError;
use crate::users::{User, UserDb};

const R: u32 = 4;
const W: u32 = 2;
const X: u32 = 1;

/// The identity a request acts as.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: User,
    pub groups: Vec<u32>,
}

impl Caller {
    /// Looks `name` up; an unknown user is `invalid_argument`.
    pub fn lookup(db: &UserDb, name: &str) -> Result<Self, RpcError> {
        let user = db.lookup(name)?;
        let mut groups = db.supplementary_gids(name);
        groups.push(user.gid);
        Ok(Self { user, groups })
    }

    fn is_root(&self) -> bool {
        self.user.uid == 0
    }

    /// Whether the mode bits of `meta` grant all of `want` (a mask of R/W/X).
    fn allows(&self, meta: &std::fs::Metadata, want: u32) -> bool {
        if self.is_root() {
            return true;
        }
        let mode = meta.mode();
        let bits = if meta.uid() == self.user.uid {
            mode >> 6
        } else if self.groups.contains(&meta.gid()) {
            mode >> 3
        } else {
            mode
        } & 7;
        bits & want == want
    }

    /// Every directory above `path` must be searchable.
    fn check_ancestors(&self, path: &Path) -> io::Result<()> {
        if self.is_root() {
            return Ok(());
        }
        for dir in path.ancestors().skip(1) {
            match std::fs::metadata(dir) {
                Ok(m) if !self.allows(&m, X) => return Err(denied(dir)),
                Ok(_) => {}
                // A missing ancestor is reported by the operation itself.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// `path` may be read (a file) or listed (a directory).
    pub fn check_read(&self, path: &Path) -> io::Result<()> {
        self.check_ancestors(path)?;
        let meta = std::fs::metadata(path)?;
        let want = if meta.is_dir() { R | X } else { R };
        if self.allows(&meta, want) {
            Ok(())
        } else {
            Err(denied(path))
        }
    }

    /// `path` may be created, replaced or removed: its closest existing
    /// ancestor must be writable and searchable (creating parents goes
    /// through that directory); an existing file must be writable too when
    /// `overwrite` (uploads truncate it in place).
    pub fn check_write(&self, path: &Path, overwrite: bool) -> io::Result<()> {
        if self.is_root() {
            return Ok(());
        }
        if overwrite {
            if let Ok(meta) = std::fs::metadata(path) {
                if !meta.is_dir() && !self.allows(&meta, W) {
                    return Err(denied(path));
                }
            }
        }
        let existing = path
            .ancestors()
            .skip(1)
            .find(|a| a.exists())
            .unwrap_or(Path::new("/"));
        let meta = std::fs::metadata(existing)?;
        if !meta.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        if !self.allows(&meta, W | X) {
            return Err(denied(existing));
        }
        self.check_ancestors(existing)
    }

    /// Hands `path` (not following a final symlink) to the user.
    pub fn chown(&self, path: &Path) -> io::Result<()> {
        std::os::unix::fs::lchown(path, Some(self.user.uid), Some(self.user.gid))
    }

    /// Creates `dir` and any missing parents (mode 0755), each owned by the
    /// user; an existing directory is fine, an existing non-directory is
    /// `ENOTDIR`.
    pub fn ensure_dirs(&self, dir: &Path) -> io::Result<()> {
        let missing: Vec<&Path> = dir.ancestors().take_while(|a| !a.exists()).collect();
        for d in missing.into_iter().rev() {
            match std::fs::DirBuilder::new().mode(0o755).create(d) {
                Ok(()) => self.chown(d)?,
                // Someone else created it meanwhile.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
                Err(e) => return Err(e),
            }
        }
        if dir.is_dir() {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::ENOTDIR))
        }
    }
}

fn denied(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("permission denied: {}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn caller(uid: u32, gid: u32, groups: Vec<u32>) -> Caller {
        Caller {
            user: User {
                name: "u".into(),
                uid,
                gid,
                home: PathBuf::from("/"),
                shell: "/bin/sh".into(),
            },
            groups,
        }
    }

    #[test]
    fn mode_bits_decide_for_non_root() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let me = std::fs::metadata(&f).unwrap();
        let set =
            |m: u32| std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();

        // A stranger: only the "other" bits count.
        let stranger = caller(me.uid() + 4242, me.gid() + 4242, vec![me.gid() + 4242]);
        set(0o640);
        assert_eq!(
            stranger.check_read(&f).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        set(0o644);
        stranger.check_read(&f).unwrap();
        // Group membership through a supplementary group.
        set(0o640);
        let member = caller(me.uid() + 4242, me.gid() + 1, vec![me.gid() + 1, me.gid()]);
        member.check_read(&f).unwrap();
        // The owner with no read bit is refused even though others may read.
        set(0o044);
        let owner = caller(me.uid(), me.gid(), vec![me.gid()]);
        assert!(owner.check_read(&f).is_err() || me.uid() == 0);
        // Root may do anything.
        caller(0, 0, vec![0]).check_read(&f).unwrap();

        // Writing under a directory the stranger cannot write.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let target = dir.path().join("new/deeper/file");
        assert_eq!(
            stranger.check_write(&target, true).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        stranger.check_write(&target, true).unwrap();
        // Overwriting a file it cannot write.
        set(0o644);
        assert!(stranger.check_write(&f, true).is_err());
        stranger.check_write(&f, false).unwrap();
    }

    #[test]
    fn ensure_dirs_creates_parents_and_refuses_files() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::fs::metadata(dir.path()).unwrap();
        let c = caller(me.uid(), me.gid(), vec![]);
        let deep = dir.path().join("a/b/c");
        c.ensure_dirs(&deep).unwrap();
        assert!(deep.is_dir());
        c.ensure_dirs(&deep).unwrap();
        std::fs::write(dir.path().join("file"), b"").unwrap();
        assert_eq!(
            c.ensure_dirs(&dir.path().join("file/sub"))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOTDIR)
        );
    }
}
