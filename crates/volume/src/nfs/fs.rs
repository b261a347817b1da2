//! The NFS operations on one volume (`nfsserve`'s `NFSFileSystem`).
//!
//! Paths are resolved by `cap-std` from the volume's root, so a link a
//! guest made cannot lead the server out of the volume; NFS clients follow
//! links themselves, so the server never needs to. Writes are synced before
//! they are answered: `nfsserve` answers every WRITE as `FILE_SYNC`, and a
//! guest that was told its data is stable must find it after a crash.
//!
//! What the guest asks for is bounded here too: a READ gets at most
//! [`MAX_COUNT`] bytes whatever its count, a listing holds at most the
//! entries its reply can carry, every new entry costs [`ENTRY_COST`] of
//! the volume's limit ([`crate::usage`]), and modes and owners are
//! squashed ([`crate::squash`]).

use std::collections::BinaryHeap;
use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use cap_std::fs::{Dir, Metadata, MetadataExt, OpenOptions, OpenOptionsExt};
use nfsserve::nfs::{
    cookieverf3, fattr3, fileid3, filename3, fsinfo3, nfs_fh3, nfspath3, nfsstat3, nfstime3,
    post_op_attr, sattr3, set_atime, set_gid3, set_mode3, set_mtime, set_size3, set_uid3,
    FSF_CANSETTIME, FSF_HOMOGENEOUS, FSF_LINK, FSF_SYMLINK,
};
use nfsserve::vfs::{DirEntry, NFSFileSystem, ReadDirResult, VFSCapabilities};

use super::attr::{fattr, status};
use super::call::MAX_COUNT;
use super::index::{inode_at, Index};
use crate::usage::{entry_cost, file_cost, usage_of, ENTRY_COST};
use crate::{squash, DEFAULT_OWNER};

type NfsResult<T> = Result<T, nfsstat3>;

/// One volume, as an NFS file system.
pub struct VolumeNfs {
    name: String,
    root: Dir,
    root_ino: u64,
    /// Part of every file handle: handles of another volume (or of a
    /// deleted and re-created one) are refused as stale.
    generation: u64,
    index: Index,
    limit: u64,
    /// Bytes in the volume as this server last counted them.
    usage: Mutex<u64>,
}

impl VolumeNfs {
    /// Serves the directory `root` of volume `name` (id `id`).
    pub fn new(name: &str, id: &str, root: Dir, limit: u64) -> std::io::Result<Self> {
        let root_ino = root.dir_metadata()?.ino();
        let generation =
            u64::from_le_bytes(<[u8; 8]>::try_from(&sha_of(id)[..8]).unwrap_or_default());
        let usage = usage_of(&root)?;
        let index = Index::new();
        index.remember(root_ino, PathBuf::from("."));
        Ok(Self {
            name: name.to_string(),
            root,
            root_ino,
            generation,
            index,
            limit,
            usage: Mutex::new(usage),
        })
    }

    fn path(&self, id: fileid3) -> NfsResult<PathBuf> {
        self.index
            .path_of(&self.root, id)
            .ok_or(nfsstat3::NFS3ERR_STALE)
    }

    /// `dir/name` for a new or looked-up entry; `.`, `..`, `/` and NUL are
    /// not names.
    fn child(&self, dirid: fileid3, name: &filename3) -> NfsResult<PathBuf> {
        let bytes: &[u8] = name.as_ref();
        if bytes.is_empty()
            || bytes == b"."
            || bytes == b".."
            || bytes.contains(&b'/')
            || bytes.contains(&0)
        {
            return Err(nfsstat3::NFS3ERR_INVAL);
        }
        if bytes.len() > 255 {
            return Err(nfsstat3::NFS3ERR_NAMETOOLONG);
        }
        let dir = self.path(dirid)?;
        Ok(join(&dir, OsStr::from_bytes(bytes)))
    }

    fn meta(&self, path: &Path) -> NfsResult<Metadata> {
        self.root.symlink_metadata(path).map_err(|e| status(&e))
    }

    /// The attributes of `path`, remembering its id.
    fn entry(&self, path: &Path) -> NfsResult<(fileid3, fattr3)> {
        let meta = self.meta(path)?;
        self.index.remember(meta.ino(), path.to_path_buf());
        Ok((meta.ino(), fattr(&meta, self.generation)))
    }

    /// Opens a file or directory without following a final link.
    fn open(&self, path: &Path, write: bool) -> NfsResult<std::fs::File> {
        let mut options = OpenOptions::new();
        options
            .read(!write)
            .write(write)
            .custom_flags(libc::O_NOFOLLOW);
        self.root
            .open_with(path, &options)
            .map(|f| f.into_std())
            .map_err(|e| status(&e))
    }

    /// Gives `path` (not following a link) the volume's owner.
    fn squash_owner(&self, path: &Path) -> NfsResult<()> {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().ok_or(nfsstat3::NFS3ERR_INVAL)?;
        let dir = self.root.open_dir(parent).map_err(|e| status(&e))?;
        let cname = CString::new(name.as_bytes()).map_err(|_| nfsstat3::NFS3ERR_INVAL)?;
        // SAFETY: a valid directory descriptor and a NUL-terminated name;
        // AT_SYMLINK_NOFOLLOW keeps a link from being followed out.
        let rc = unsafe {
            libc::fchownat(
                dir.as_raw_fd(),
                cname.as_ptr(),
                DEFAULT_OWNER.0,
                DEFAULT_OWNER.1,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(status(&std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Room for `growth` more bytes, counting again before refusing (other
    /// writers share the volume).
    fn reserve(&self, growth: u64) -> NfsResult<()> {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if *usage + growth > self.limit {
            *usage = usage_of(&self.root).map_err(|e| status(&e))?;
            if *usage + growth > self.limit {
                tracing::warn!(volume = %self.name, used = *usage, limit = self.limit, "volume full: NFS write refused");
                return Err(nfsstat3::NFS3ERR_NOSPC);
            }
        }
        *usage += growth;
        Ok(())
    }

    fn released(&self, bytes: u64) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        *usage = usage.saturating_sub(bytes);
    }

    /// Makes a new entry with `make`, which costs [`ENTRY_COST`] of the
    /// limit (given back if it fails).
    fn new_entry<T>(&self, make: impl FnOnce() -> NfsResult<T>) -> NfsResult<T> {
        self.reserve(ENTRY_COST)?;
        make().inspect_err(|_| self.released(ENTRY_COST))
    }

    /// A file's length goes from `old` to `new`: what that costs or frees.
    fn resized(&self, old: u64, new: u64) -> NfsResult<()> {
        let (old, new) = (file_cost(old), file_cost(new));
        if new > old {
            self.reserve(new - old)
        } else {
            self.released(old - new);
            Ok(())
        }
    }

    fn apply(&self, path: &Path, set: &sattr3) -> NfsResult<()> {
        let meta = self.meta(path)?;
        if meta.file_type().is_symlink() {
            // Only an owner change means something for a link.
            if matches!(set.uid, set_uid3::uid(_)) || matches!(set.gid, set_gid3::gid(_)) {
                self.squash_owner(path)?;
            }
            return Ok(());
        }
        let file = self.open(path, matches!(set.size, set_size3::size(_)))?;
        if let set_size3::size(size) = set.size {
            if meta.is_file() {
                self.resized(meta.len(), size)?;
            }
            file.set_len(size).map_err(|e| status(&e))?;
        }
        // Owner before mode: a chown clears set-ID bits, a chmod after it
        // would not (and squash::mode drops them anyway).
        let uid = match set.uid {
            set_uid3::uid(u) => Some(squash::uid(u)),
            set_uid3::Void => None,
        };
        let gid = match set.gid {
            set_gid3::gid(g) => Some(squash::gid(g)),
            set_gid3::Void => None,
        };
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::fchown(&file, uid, gid).map_err(|e| status(&e))?;
        }
        if let set_mode3::mode(mode) = set.mode {
            file.set_permissions(std::fs::Permissions::from_mode(squash::mode(mode)))
                .map_err(|e| status(&e))?;
        }
        set_times(&file, &set.atime, &set.mtime)
    }
}

#[async_trait]
impl NFSFileSystem for VolumeNfs {
    fn capabilities(&self) -> VFSCapabilities {
        VFSCapabilities::ReadWrite
    }

    fn root_dir(&self) -> fileid3 {
        self.root_ino
    }

    async fn lookup(&self, dirid: fileid3, filename: &filename3) -> NfsResult<fileid3> {
        let dir = self.path(dirid)?;
        let path = match filename.as_ref() {
            b"." => dir,
            b".." => dir
                .parent()
                .map(Path::to_path_buf)
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or_else(|| PathBuf::from(".")),
            _ => self.child(dirid, filename)?,
        };
        Ok(self.entry(&path)?.0)
    }

    async fn getattr(&self, id: fileid3) -> NfsResult<fattr3> {
        let path = self.path(id)?;
        Ok(self.entry(&path)?.1)
    }

    async fn setattr(&self, id: fileid3, set: sattr3) -> NfsResult<fattr3> {
        let path = self.path(id)?;
        self.apply(&path, &set)?;
        Ok(self.entry(&path)?.1)
    }

    async fn read(&self, id: fileid3, offset: u64, count: u32) -> NfsResult<(Vec<u8>, bool)> {
        let path = self.path(id)?;
        let file = self.open(&path, false)?;
        let size = file.metadata().map_err(|e| status(&e))?.len();
        // FSINFO's rtmax; RFC 1813 lets a server return less than asked.
        let mut buf = vec![0u8; count.min(MAX_COUNT) as usize];
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(status(&e)),
            }
        }
        buf.truncate(got);
        Ok((buf, offset + got as u64 >= size))
    }

    async fn write(&self, id: fileid3, offset: u64, data: &[u8]) -> NfsResult<fattr3> {
        let path = self.path(id)?;
        let file = self.open(&path, true)?;
        let size = file.metadata().map_err(|e| status(&e))?.len();
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(nfsstat3::NFS3ERR_FBIG)?;
        if end > size {
            self.resized(size, end)?;
        }
        file.write_all_at(data, offset).map_err(|e| status(&e))?;
        file.sync_data().map_err(|e| status(&e))?;
        Ok(self.entry(&path)?.1)
    }

    async fn create(
        &self,
        dirid: fileid3,
        filename: &filename3,
        attr: sattr3,
    ) -> NfsResult<(fileid3, fattr3)> {
        let path = self.child(dirid, filename)?;
        let mut options = OpenOptions::new();
        options
            .write(true)
            .create(true)
            .custom_flags(libc::O_NOFOLLOW);
        let open = || self.root.open_with(&path, &options).map_err(|e| status(&e));
        let mut file = match self.meta(&path) {
            Ok(_) => open()?,
            Err(_) => self.new_entry(open)?,
        }
        .into_std();
        if !matches!(attr.mode, set_mode3::mode(_)) {
            file.set_permissions(std::fs::Permissions::from_mode(0o644))
                .map_err(|e| status(&e))?;
        }
        file.flush().map_err(|e| status(&e))?;
        self.squash_owner(&path)?;
        self.apply(&path, &attr)?;
        self.entry(&path)
    }

    async fn create_exclusive(&self, dirid: fileid3, filename: &filename3) -> NfsResult<fileid3> {
        let path = self.child(dirid, filename)?;
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        let file = self
            .new_entry(|| self.root.open_with(&path, &options).map_err(|e| status(&e)))?
            .into_std();
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(|e| status(&e))?;
        self.squash_owner(&path)?;
        Ok(self.entry(&path)?.0)
    }

    async fn mkdir(&self, dirid: fileid3, dirname: &filename3) -> NfsResult<(fileid3, fattr3)> {
        let path = self.child(dirid, dirname)?;
        self.new_entry(|| self.root.create_dir(&path).map_err(|e| status(&e)))?;
        self.root
            .set_permissions(
                &path,
                cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(0o755)),
            )
            .map_err(|e| status(&e))?;
        self.squash_owner(&path)?;
        self.entry(&path)
    }

    async fn remove(&self, dirid: fileid3, filename: &filename3) -> NfsResult<()> {
        let path = self.child(dirid, filename)?;
        let meta = self.meta(&path)?;
        let removed = if meta.is_dir() {
            self.root.remove_dir(&path)
        } else {
            self.root.remove_file(&path)
        };
        removed.map_err(|e| status(&e))?;
        if !meta.is_file() || meta.nlink() <= 1 {
            self.released(entry_cost(meta.is_file(), meta.len()));
        }
        self.index.forget(meta.ino());
        Ok(())
    }

    async fn rename(
        &self,
        from_dirid: fileid3,
        from: &filename3,
        to_dirid: fileid3,
        to: &filename3,
    ) -> NfsResult<()> {
        let from_path = self.child(from_dirid, from)?;
        let to_path = self.child(to_dirid, to)?;
        self.root
            .rename(&from_path, &self.root, &to_path)
            .map_err(|e| status(&e))?;
        if let Some(ino) = inode_at(&self.root, &to_path) {
            self.index.remember(ino, to_path);
        }
        Ok(())
    }

    /// Entries in inode order: the cookie is the last inode sent, so a
    /// listing goes on correctly when entries come or go in between. Only
    /// the `max_entries` next inodes are kept while the directory is read,
    /// so a huge directory costs a pass, not its size in memory.
    async fn readdir(
        &self,
        dirid: fileid3,
        start_after: fileid3,
        max_entries: usize,
    ) -> NfsResult<ReadDirResult> {
        let dir = self.path(dirid)?;
        let entries = self.root.read_dir(&dir).map_err(|e| status(&e))?;
        // A max-heap of the smallest inodes past the cookie.
        let mut next: BinaryHeap<(u64, OsString)> = BinaryHeap::new();
        let mut more = false;
        for entry in entries.flatten() {
            let ino = entry.ino();
            if ino <= start_after {
                continue;
            }
            if next.len() == max_entries {
                more = true;
                match next.peek() {
                    Some((top, _)) if ino < *top => drop(next.pop()),
                    _ => continue,
                }
            }
            next.push((ino, entry.file_name()));
        }
        let entries = next
            .into_sorted_vec()
            .into_iter()
            .filter_map(|(_, name)| {
                let path = join(&dir, &name);
                // An entry removed since it was read is left out.
                let meta = self.root.symlink_metadata(&path).ok()?;
                self.index.remember(meta.ino(), path);
                Some(DirEntry {
                    fileid: meta.ino(),
                    name: name.as_bytes().into(),
                    attr: fattr(&meta, self.generation),
                })
            })
            .collect();
        Ok(ReadDirResult {
            entries,
            end: !more,
        })
    }

    async fn symlink(
        &self,
        dirid: fileid3,
        linkname: &filename3,
        target: &nfspath3,
        _attr: &sattr3,
    ) -> NfsResult<(fileid3, fattr3)> {
        let path = self.child(dirid, linkname)?;
        let target = OsStr::from_bytes(target.as_ref());
        self.new_entry(|| {
            self.root
                .symlink_contents(target, &path)
                .map_err(|e| status(&e))
        })?;
        self.squash_owner(&path)?;
        self.entry(&path)
    }

    async fn readlink(&self, id: fileid3) -> NfsResult<nfspath3> {
        let path = self.path(id)?;
        let target = self
            .root
            .read_link_contents(&path)
            .map_err(|e| status(&e))?;
        Ok(target.as_os_str().as_bytes().into())
    }

    /// As `nfsserve`'s default, but reads of 1 MiB preferred (its 124 KiB
    /// made a guest's sequential reads a third as fast) and files up to
    /// the volume's limit.
    async fn fsinfo(&self, root: fileid3) -> NfsResult<fsinfo3> {
        let attr = match self.getattr(root).await {
            Ok(a) => post_op_attr::attributes(a),
            Err(_) => post_op_attr::Void,
        };
        Ok(fsinfo3 {
            obj_attributes: attr,
            rtmax: MAX_COUNT,
            rtpref: MAX_COUNT,
            rtmult: 4096,
            wtmax: MAX_COUNT,
            wtpref: MAX_COUNT,
            wtmult: 4096,
            dtpref: 64 * 1024,
            maxfilesize: self.limit,
            time_delta: nfstime3 {
                seconds: 0,
                nseconds: 1,
            },
            properties: FSF_LINK | FSF_SYMLINK | FSF_HOMOGENEOUS | FSF_CANSETTIME,
        })
    }

    fn id_to_fh(&self, id: fileid3) -> nfs_fh3 {
        let mut data = Vec::with_capacity(16);
        data.extend_from_slice(&self.generation.to_le_bytes());
        data.extend_from_slice(&id.to_le_bytes());
        nfs_fh3 { data }
    }

    fn fh_to_id(&self, fh: &nfs_fh3) -> NfsResult<fileid3> {
        let (generation, id) = fh
            .data
            .split_at_checked(8)
            .ok_or(nfsstat3::NFS3ERR_BADHANDLE)?;
        let id: [u8; 8] = id.try_into().map_err(|_| nfsstat3::NFS3ERR_BADHANDLE)?;
        if generation != self.generation.to_le_bytes() {
            return Err(nfsstat3::NFS3ERR_STALE);
        }
        Ok(u64::from_le_bytes(id))
    }

    fn serverid(&self) -> cookieverf3 {
        self.generation.to_le_bytes()
    }
}

fn join(dir: &Path, name: &OsStr) -> PathBuf {
    if dir == Path::new(".") {
        PathBuf::from(name)
    } else {
        dir.join(name)
    }
}

fn set_times(file: &std::fs::File, atime: &set_atime, mtime: &set_mtime) -> NfsResult<()> {
    let spec = |now: bool, given: Option<(u32, u32)>| match (now, given) {
        (true, _) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        (false, Some((s, ns))) => libc::timespec {
            tv_sec: s as libc::time_t,
            tv_nsec: ns as libc::c_long,
        },
        (false, None) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    };
    let a = match atime {
        set_atime::DONT_CHANGE => spec(false, None),
        set_atime::SET_TO_SERVER_TIME => spec(true, None),
        set_atime::SET_TO_CLIENT_TIME(t) => spec(false, Some((t.seconds, t.nseconds))),
    };
    let m = match mtime {
        set_mtime::DONT_CHANGE => spec(false, None),
        set_mtime::SET_TO_SERVER_TIME => spec(true, None),
        set_mtime::SET_TO_CLIENT_TIME(t) => spec(false, Some((t.seconds, t.nseconds))),
    };
    if a.tv_nsec == libc::UTIME_OMIT && m.tv_nsec == libc::UTIME_OMIT {
        return Ok(());
    }
    let times = [a, m];
    // SAFETY: a valid open descriptor and a two-element timespec array.
    if unsafe { libc::futimens(file.as_raw_fd(), times.as_ptr()) } != 0 {
        return Err(status(&std::io::Error::last_os_error()));
    }
    Ok(())
}

fn sha_of(id: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(id.as_bytes()).into()
}
