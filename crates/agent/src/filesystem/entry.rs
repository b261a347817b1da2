//! Building `EntryInfo`, the description of a path every filesystem RPC
//! returns.
//!
//! Field semantics follow envd (Go): `mode` is the permission bits
//! (`FileMode.Perm()`), `permissions` is Go's `FileMode.String()` (for example
//! `drwxr-xr-x`, `Lrwxrwxrwx`, `dtrwxrwxrwx`), `size` is `st_size`. A symlink
//! is described by its own `lstat` (mode, owner, times) but carries the type
//! of what it points to, `is_symlink` and the target path.

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use siesta_envd_proto::filesystem::{EntryInfo, FileType};

use super::{paths, xattr};
use crate::users::UserDb;

/// Resolves uids and gids to names, reading the account files once per
/// request rather than once per entry (a `ListDir` can return thousands).
pub struct Names<'a> {
    db: &'a UserDb,
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl<'a> Names<'a> {
    pub fn new(db: &'a UserDb) -> Self {
        Self {
            db,
            users: HashMap::new(),
            groups: HashMap::new(),
        }
    }

    fn user(&mut self, uid: u32) -> String {
        let db = self.db;
        self.users
            .entry(uid)
            .or_insert_with(|| db.user_name(uid))
            .clone()
    }

    fn group(&mut self, gid: u32) -> String {
        let db = self.db;
        self.groups
            .entry(gid)
            .or_insert_with(|| db.group_name(gid))
            .clone()
    }
}

/// Describes `path` (absolute, already resolved). Errors are those of
/// `lstat`; a dangling symlink is still described (type UNSPECIFIED is
/// avoided: it is reported as a FILE, the SDK drops UNSPECIFIED entries).
pub fn describe(path: &Path, names: &mut Names<'_>) -> std::io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(path)?;
    Ok(from_metadata(path, &meta, names))
}

/// Like [`describe`] with the `lstat` result already at hand (directory walks
/// get it from `read_dir`).
pub fn from_metadata(path: &Path, meta: &Metadata, names: &mut Names<'_>) -> EntryInfo {
    let is_symlink = meta.file_type().is_symlink();
    let (file_type, symlink_target) = if is_symlink {
        // envd reports the fully resolved target; a dangling or looping link
        // falls back to the link's own text.
        let target = std::fs::canonicalize(path)
            .or_else(|_| std::fs::read_link(path))
            .map(|t| paths::display(&t))
            .ok();
        let ty = match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => FileType::Directory,
            _ => FileType::File,
        };
        (ty, target)
    } else if meta.is_dir() {
        (FileType::Directory, None)
    } else {
        (FileType::File, None)
    };
    EntryInfo {
        name: paths::base_name(path),
        r#type: file_type as i32,
        path: paths::display(path),
        size: meta.size() as i64,
        mode: meta.mode() & 0o777,
        permissions: go_mode_string(meta.mode()),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
        modified_time: Some(pbjson_types::Timestamp {
            seconds: meta.mtime(),
            nanos: meta.mtime_nsec() as i32,
        }),
        symlink_target,
        metadata: xattr::read_all(path),
        is_symlink,
    }
}

/// Go's `os.FileMode.String()` for a Unix `st_mode`: one letter per set type
/// bit in the order `dalTLDpSugct?` (`-` when none), then `rwxrwxrwx`.
pub fn go_mode_string(st_mode: u32) -> String {
    let fmt = st_mode & libc::S_IFMT;
    // Go sets these flags from st_mode in os.fillFileStatFromSys.
    let flags = [
        ('d', fmt == libc::S_IFDIR),
        ('L', fmt == libc::S_IFLNK),
        ('D', fmt == libc::S_IFBLK || fmt == libc::S_IFCHR),
        ('p', fmt == libc::S_IFIFO),
        ('S', fmt == libc::S_IFSOCK),
        ('u', st_mode & libc::S_ISUID != 0),
        ('g', st_mode & libc::S_ISGID != 0),
        ('c', fmt == libc::S_IFCHR),
        ('t', st_mode & libc::S_ISVTX != 0),
    ];
    let mut s: String = flags
        .iter()
        .filter(|(_, on)| *on)
        .map(|(c, _)| *c)
        .collect();
    if s.is_empty() {
        s.push('-');
    }
    const RWX: &[u8; 9] = b"rwxrwxrwx";
    for (i, c) in RWX.iter().enumerate() {
        let bit = 1 << (8 - i);
        s.push(if st_mode & bit != 0 { *c as char } else { '-' });
    }
    s
}

/// Whether a `read_dir` entry type is a directory to descend into (symlinks
/// are not followed, as in Go's `filepath.WalkDir`).
pub fn is_real_dir(ft: &std::fs::FileType) -> bool {
    ft.is_dir() && !ft.is_symlink() && !ft.is_block_device()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_mode_strings() {
        assert_eq!(go_mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o1777), "dtrwxrwxrwx");
        assert_eq!(go_mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(go_mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(go_mode_string(libc::S_IFBLK | 0o660), "Drw-rw----");
        assert_eq!(go_mode_string(libc::S_IFIFO | 0o600), "prw-------");
        assert_eq!(go_mode_string(libc::S_IFSOCK | 0o777), "Srwxrwxrwx");
        assert_eq!(go_mode_string(libc::S_IFREG | 0o4755), "urwxr-xr-x");
        assert_eq!(go_mode_string(libc::S_IFREG | 0o2755), "grwxr-xr-x");
    }

    #[test]
    fn describes_files_dirs_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("f.txt"), b"hello").unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        std::os::unix::fs::symlink(root.join("d"), root.join("ld")).unwrap();
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("dangling")).unwrap();
        let db = UserDb::default();
        let mut names = Names::new(&db);

        let f = describe(&root.join("f.txt"), &mut names).unwrap();
        assert_eq!(
            (f.name.as_str(), f.r#type, f.size),
            ("f.txt", FileType::File as i32, 5)
        );
        assert_eq!(f.path, root.join("f.txt").to_string_lossy());
        assert!(f.permissions.starts_with('-') && !f.is_symlink);
        assert!(f.modified_time.is_some());

        let d = describe(&root.join("d"), &mut names).unwrap();
        assert_eq!(d.r#type, FileType::Directory as i32);
        assert!(d.permissions.starts_with('d'));

        let l = describe(&root.join("ld"), &mut names).unwrap();
        assert_eq!(l.r#type, FileType::Directory as i32);
        assert!(l.is_symlink);
        let canon = std::fs::canonicalize(root.join("d")).unwrap();
        assert_eq!(l.symlink_target.as_deref(), Some(canon.to_str().unwrap()));
        assert_eq!((l.mode, l.permissions.as_str()), (0o777, "Lrwxrwxrwx"));

        let dl = describe(&root.join("dangling"), &mut names).unwrap();
        assert_eq!(dl.r#type, FileType::File as i32);
        assert!(dl.is_symlink && dl.symlink_target.is_some());

        assert_eq!(
            describe(&root.join("missing"), &mut names)
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }
}
