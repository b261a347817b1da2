//! NFS file ids are host inode numbers; operations need paths. The index
//! maps one to the other: filled as the guest looks names up, checked on
//! every use (the inode at that path must still be the same one), and
//! rebuilt by walking the volume when an id is not known: after a restart
//! of the server, or when something else (the content API, another
//! sandbox) moved the file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cap_std::fs::{Dir, MetadataExt};

pub(super) struct Index {
    paths: Mutex<HashMap<u64, PathBuf>>,
}

impl Index {
    pub(super) fn new() -> Self {
        Self {
            paths: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn remember(&self, ino: u64, path: PathBuf) {
        self.lock().insert(ino, path);
    }

    pub(super) fn forget(&self, ino: u64) {
        self.lock().remove(&ino);
    }

    /// The path of inode `ino` under `root`, if it is still in the volume.
    pub(super) fn path_of(&self, root: &Dir, ino: u64) -> Option<PathBuf> {
        let known = self.lock().get(&ino).cloned();
        if let Some(path) = known {
            if inode_at(root, &path) == Some(ino) {
                return Some(path);
            }
        }
        self.rebuild(root);
        self.lock().get(&ino).cloned()
    }

    /// Walks the whole volume (links not followed) and records every entry.
    fn rebuild(&self, root: &Dir) {
        let mut found = HashMap::new();
        if let Some(ino) = inode_at(root, Path::new(".")) {
            found.insert(ino, PathBuf::from("."));
        }
        walk(root, Path::new(""), &mut found);
        *self.lock() = found;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, PathBuf>> {
        self.paths.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn walk(root: &Dir, dir: &Path, found: &mut HashMap<u64, PathBuf>) {
    let listing = if dir.as_os_str().is_empty() {
        root.entries()
    } else {
        root.read_dir(dir)
    };
    let Ok(entries) = listing else { return };
    for entry in entries.flatten() {
        let path = dir.join(entry.file_name());
        let Ok(meta) = root.symlink_metadata(&path) else {
            continue;
        };
        found.insert(meta.ino(), path.clone());
        if meta.is_dir() {
            walk(root, &path, found);
        }
    }
}

pub(super) fn inode_at(root: &Dir, path: &Path) -> Option<u64> {
    root.symlink_metadata(path).ok().map(|m| m.ino())
}
