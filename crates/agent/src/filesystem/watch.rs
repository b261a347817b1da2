//! Watching a directory (optionally its whole tree) with inotify.
//!
//! inotify watches one directory per watch descriptor, so a recursive watch
//! adds one for every subdirectory at start and for every directory that
//! appears later. Event kinds map as fsnotify (which envd uses) maps them:
//! create/moved-in → CREATE, modify → WRITE, delete → REMOVE, moved-out →
//! RENAME, attrib → CHMOD.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use siesta_envd_proto::filesystem::{EventType, FilesystemEvent};
use tokio::sync::mpsc;

use super::entry::{self, Names};
use crate::rpc::{Code, RpcError};
use crate::users::UserDb;

/// What a watch reports, per watched directory.
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::DONT_FOLLOW
        | WatchMask::ONLYDIR
}

/// Filesystems whose changes made on other machines inotify cannot see; envd
/// refuses to watch them unless the client says it knows
/// (`allowNetworkMounts`).
const NETWORK_FS_MAGIC: &[i64] = &[
    0x6969,      // NFS
    0x517B,      // SMB
    0xFF53_4D42, // CIFS
    0xFE53_4D42, // SMB2
    0x6573_5546, // FUSE (sshfs, s3fs, ...)
    0x0102_1997, // 9P (v9fs)
];

/// Options of a watch, from `WatchDirRequest`/`CreateWatcherRequest`.
#[derive(Debug, Clone, Copy)]
pub struct WatchOptions {
    pub recursive: bool,
    pub include_entry: bool,
    pub allow_network_mounts: bool,
}

/// Starts watching `root` (absolute). Events arrive on the returned channel;
/// dropping the receiver stops the watch and closes the inotify descriptor.
pub fn start(
    root: PathBuf,
    opts: WatchOptions,
    users: Arc<UserDb>,
) -> Result<mpsc::Receiver<FilesystemEvent>, RpcError> {
    let display = root.display().to_string();
    let meta = std::fs::metadata(&root).map_err(|e| RpcError::from_io(&e, &display))?;
    if !meta.is_dir() {
        return Err(RpcError::invalid_argument(format!(
            "{display} is not a directory"
        )));
    }
    if !opts.allow_network_mounts && is_network_fs(&root) {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            format!("{display} is on a network filesystem; set allowNetworkMounts to watch it"),
        ));
    }
    let inotify = Inotify::init().map_err(|e| RpcError::from_io(&e, "inotify_init"))?;
    let stream = inotify
        .into_event_stream(vec![0u8; 64 * 1024])
        .map_err(|e| RpcError::from_io(&e, "inotify stream"))?;
    let mut tree = Tree {
        watches: stream.watches(),
        dirs: HashMap::new(),
        recursive: opts.recursive,
    };
    tree.add(&root, PathBuf::new())
        .map_err(|e| RpcError::from_io(&e, &display))?;

    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        let mut stream = stream;
        loop {
            let ev = tokio::select! {
                _ = tx.closed() => return,
                ev = stream.next() => ev,
            };
            let ev = match ev {
                Some(Ok(ev)) => ev,
                Some(Err(e)) => {
                    tracing::warn!(root = %root.display(), "inotify read failed: {e}");
                    return;
                }
                None => return,
            };
            if ev.mask.contains(EventMask::Q_OVERFLOW) {
                tracing::warn!(root = %root.display(), "inotify queue overflowed; events were lost");
                continue;
            }
            let Some(out) = tree.translate(&root, &ev.wd, ev.mask, ev.name.as_deref()) else {
                continue;
            };
            let mut event = out;
            if opts.include_entry {
                let db = &users;
                let mut names = Names::new(db);
                event.entry = entry::describe(&root.join(&event.name), &mut names).ok();
            }
            if tx.send(event).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// The watched directories, by descriptor, as paths relative to the root.
struct Tree {
    watches: Watches,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    recursive: bool,
}

impl Tree {
    /// Watches `abs` (known to the client as `rel`) and, when recursive, every
    /// directory below it. Subdirectories that vanish meanwhile are skipped.
    fn add(&mut self, abs: &Path, rel: PathBuf) -> std::io::Result<()> {
        let wd = self.watches.add(abs, mask())?;
        if let Some(old) = self.dirs.insert(wd, rel.clone()) {
            // The same inode under a new name (a directory moved within the
            // tree): the descriptors below it still carry the old prefix.
            if old != rel {
                for p in self.dirs.values_mut() {
                    if let Ok(rest) = p.strip_prefix(&old) {
                        *p = rel.join(rest);
                    }
                }
            }
        }
        if self.recursive {
            let Ok(children) = std::fs::read_dir(abs) else {
                return Ok(());
            };
            for child in children.flatten() {
                if child
                    .file_type()
                    .map(|t| entry::is_real_dir(&t))
                    .unwrap_or(false)
                {
                    let name = child.file_name();
                    // Best effort: a child removed meanwhile is simply not watched.
                    let _ = self.add(&abs.join(&name), rel.join(&name));
                }
            }
        }
        Ok(())
    }

    /// Turns one inotify event into a client event, updating the watch set.
    fn translate(
        &mut self,
        root: &Path,
        wd: &WatchDescriptor,
        mask: EventMask,
        name: Option<&OsStr>,
    ) -> Option<FilesystemEvent> {
        if mask.contains(EventMask::IGNORED) {
            // The directory is gone or unwatched; its descriptor may be reused.
            self.dirs.remove(wd);
            return None;
        }
        let dir = self.dirs.get(wd)?.clone();
        // Events on the watched directory itself (no name) duplicate what its
        // parent's watch reports, or concern the root, which the client named.
        let name = name?;
        let rel = dir.join(name);
        let is_dir = mask.contains(EventMask::ISDIR);
        if self.recursive && is_dir && mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
            if let Err(e) = self.add(&root.join(&rel), rel.clone()) {
                tracing::debug!("not watching new directory {}: {e}", rel.display());
            }
        }
        Some(FilesystemEvent {
            name: rel.to_string_lossy().into_owned(),
            r#type: event_type(mask)? as i32,
            entry: None,
        })
    }
}

/// The client event type of an inotify mask, `None` for kinds not reported.
pub fn event_type(mask: EventMask) -> Option<EventType> {
    if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
        Some(EventType::Create)
    } else if mask.contains(EventMask::MODIFY) {
        Some(EventType::Write)
    } else if mask.contains(EventMask::DELETE) {
        Some(EventType::Remove)
    } else if mask.contains(EventMask::MOVED_FROM) {
        Some(EventType::Rename)
    } else if mask.contains(EventMask::ATTRIB) {
        Some(EventType::Chmod)
    } else {
        None
    }
}

// fs_type_t is i64 here but narrower on other targets.
#[allow(clippy::unnecessary_cast)]
fn is_network_fs(path: &Path) -> bool {
    match nix::sys::statfs::statfs(path) {
        Ok(s) => NETWORK_FS_MAGIC.contains(&(s.filesystem_type().0 as i64)),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_masks_like_fsnotify() {
        assert_eq!(
            event_type(EventMask::CREATE | EventMask::ISDIR),
            Some(EventType::Create)
        );
        assert_eq!(event_type(EventMask::MOVED_TO), Some(EventType::Create));
        assert_eq!(event_type(EventMask::MODIFY), Some(EventType::Write));
        assert_eq!(event_type(EventMask::DELETE), Some(EventType::Remove));
        assert_eq!(event_type(EventMask::MOVED_FROM), Some(EventType::Rename));
        assert_eq!(event_type(EventMask::ATTRIB), Some(EventType::Chmod));
        assert_eq!(event_type(EventMask::ACCESS), None);
    }
}
