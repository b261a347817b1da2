//! The FUSE file system the lazy files are served through: one flat,
//! read-only directory, each file named by its SHA-256. QEMU maps the
//! memory file (privately: the guest's writes never reach it) and opens
//! the disk as its overlay's backing file; each page it touches first is a
//! FUSE read, which waits only for the chunk holding it.

use std::ffi::OsStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyEntry, ReplyOpen, Request,
};

use super::file::LazyFile;

/// Attributes never change: a file is added whole-sized and never altered.
const TTL: Duration = Duration::from_secs(3600);

/// The files served, by inode (the first file is inode 2).
#[derive(Default)]
pub struct Files {
    files: RwLock<Vec<(String, Arc<LazyFile>)>>,
}

impl Files {
    /// Serves `file` under its SHA-256 (once: a second one is ignored).
    pub fn add(&self, file: Arc<LazyFile>) {
        let mut files = self.files.write().unwrap_or_else(|p| p.into_inner());
        let name = file.sha256().to_string();
        if !files.iter().any(|(n, _)| *n == name) {
            files.push((name, file));
        }
    }

    fn by_inode(&self, ino: INodeNo) -> Option<Arc<LazyFile>> {
        let i = u64::from(ino).checked_sub(2)? as usize;
        let files = self.files.read().unwrap_or_else(|p| p.into_inner());
        files.get(i).map(|(_, f)| Arc::clone(f))
    }

    fn by_name(&self, name: &OsStr) -> Option<(INodeNo, Arc<LazyFile>)> {
        let files = self.files.read().unwrap_or_else(|p| p.into_inner());
        files
            .iter()
            .position(|(n, _)| OsStr::new(n) == name)
            .map(|i| (INodeNo(i as u64 + 2), Arc::clone(&files[i].1)))
    }
}

/// The [`Filesystem`] over shared [`Files`].
pub struct LazyFs(pub Arc<Files>);

fn attr(ino: INodeNo, kind: FileType, size: u64) -> FileAttr {
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm: if kind == FileType::Directory {
            0o755
        } else {
            0o444
        },
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.0.by_name(name) {
            Some((ino, file)) if parent == INodeNo::ROOT => reply.entry(
                &TTL,
                &attr(ino, FileType::RegularFile, file.size()),
                Generation(0),
            ),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT {
            return reply.attr(&TTL, &attr(ino, FileType::Directory, 0));
        }
        match self.0.by_inode(ino) {
            Some(file) => reply.attr(&TTL, &attr(ino, FileType::RegularFile, file.size())),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Opens for writing are let through: QEMU opens its memory file
        // read-write even when it maps it privately. A write itself is
        // refused (not implemented).
        match self.0.by_inode(ino) {
            // The page cache is kept across opens: every VM of the
            // snapshot shares what was read once.
            Some(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Nothing is ever written: a close has nothing to flush.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = self.0.by_inode(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match file.read_at(offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => {
                tracing::error!(file = file.sha256(), offset, "lazy read failed: {e}");
                reply.error(Errno::EIO)
            }
        }
    }
}
