//! Host metadata as NFS attributes, and host errors as NFS status codes.

use std::io::ErrorKind;

use cap_std::fs::{FileType, Metadata, MetadataExt};
use nfsserve::nfs::{fattr3, ftype3, nfsstat3, nfstime3, specdata3};

pub(super) fn fattr(meta: &Metadata, fsid: u64) -> fattr3 {
    fattr3 {
        ftype: ftype(&meta.file_type()),
        mode: meta.mode() & 0o7777,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        size: meta.len(),
        used: meta.blocks() * 512,
        rdev: specdata3::default(),
        fsid,
        fileid: meta.ino(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
    }
}

fn ftype(t: &FileType) -> ftype3 {
    use cap_std::fs::FileTypeExt;
    if t.is_dir() {
        ftype3::NF3DIR
    } else if t.is_symlink() {
        ftype3::NF3LNK
    } else if t.is_block_device() {
        ftype3::NF3BLK
    } else if t.is_char_device() {
        ftype3::NF3CHR
    } else if t.is_socket() {
        ftype3::NF3SOCK
    } else if t.is_fifo() {
        ftype3::NF3FIFO
    } else {
        ftype3::NF3REG
    }
}

fn time(secs: i64, nsec: i64) -> nfstime3 {
    nfstime3 {
        seconds: secs.clamp(0, u32::MAX as i64) as u32,
        nseconds: nsec.clamp(0, 999_999_999) as u32,
    }
}

/// The NFS status for a host error. cap-std's refusal to leave the root is
/// a `PermissionDenied` without an OS error code.
pub(super) fn status(e: &std::io::Error) -> nfsstat3 {
    if let Some(code) = e.raw_os_error() {
        return match code {
            libc::ENOENT => nfsstat3::NFS3ERR_NOENT,
            libc::EEXIST => nfsstat3::NFS3ERR_EXIST,
            libc::ENOTDIR => nfsstat3::NFS3ERR_NOTDIR,
            libc::EISDIR => nfsstat3::NFS3ERR_ISDIR,
            libc::ENOTEMPTY => nfsstat3::NFS3ERR_NOTEMPTY,
            libc::ENOSPC => nfsstat3::NFS3ERR_NOSPC,
            libc::EDQUOT => nfsstat3::NFS3ERR_DQUOT,
            libc::EROFS => nfsstat3::NFS3ERR_ROFS,
            libc::ENAMETOOLONG => nfsstat3::NFS3ERR_NAMETOOLONG,
            libc::EXDEV => nfsstat3::NFS3ERR_XDEV,
            libc::EINVAL => nfsstat3::NFS3ERR_INVAL,
            libc::EPERM => nfsstat3::NFS3ERR_PERM,
            libc::EACCES => nfsstat3::NFS3ERR_ACCES,
            libc::EFBIG => nfsstat3::NFS3ERR_FBIG,
            libc::EMLINK => nfsstat3::NFS3ERR_MLINK,
            _ => nfsstat3::NFS3ERR_IO,
        };
    }
    match e.kind() {
        ErrorKind::NotFound => nfsstat3::NFS3ERR_NOENT,
        ErrorKind::AlreadyExists => nfsstat3::NFS3ERR_EXIST,
        ErrorKind::PermissionDenied => nfsstat3::NFS3ERR_ACCES,
        ErrorKind::InvalidInput => nfsstat3::NFS3ERR_INVAL,
        _ => nfsstat3::NFS3ERR_IO,
    }
}
