//! File operations inside one volume: what the volume content API does.
//!
//! Every path is resolved by `cap-std` relative to the volume's root
//! directory handle, so neither `..` nor a symbolic link (one a sandbox
//! made through its mount, say) can reach a file outside the volume: such a
//! path is [`VolumeError::Escapes`]. Uploads are written to the volume's
//! `tmp/` first and renamed into place once whole and synced, so a reader
//! never sees half a file and a killed server leaves no partial file behind.
//!
//! The calls block (they are file system calls): the server runs them on
//! blocking threads.

use std::io::{ErrorKind, Write};
use std::os::unix::fs::PermissionsExt;

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};

use crate::error::{VolumeError, VolumeResult};
use crate::path::VolumePath;
use crate::stat::{EntryKind, EntryStat};
use crate::usage::{entry_cost, usage_of, ENTRY_COST};
use crate::{squash, DEFAULT_OWNER};

/// Default modes of what the API creates when the request names none.
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// How deep a listing may recurse.
pub const MAX_LIST_DEPTH: u32 = 16;

/// Owner and mode asked for by a write, a mkdir or a metadata update.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attrs {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

/// One volume's files.
pub struct VolumeFs {
    volume: String,
    data: Dir,
    tmp: Dir,
    limit: u64,
}

/// An upload in progress: bytes go to `file` (at most `budget` of them),
/// then [`VolumeFs::commit`] puts it at `path`.
pub struct PendingWrite {
    pub path: VolumePath,
    pub file: std::fs::File,
    /// How many bytes the upload may have before the volume is full.
    pub budget: u64,
    temp_name: String,
    force: bool,
}

impl VolumeFs {
    pub(crate) fn new(volume: String, data: Dir, tmp: Dir, limit: u64) -> Self {
        Self {
            volume,
            data,
            tmp,
            limit,
        }
    }

    /// The volume's size limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Stat of `path` itself (a final symbolic link is reported as one).
    pub fn stat(&self, path: &VolumePath) -> VolumeResult<EntryStat> {
        let meta = self
            .data
            .symlink_metadata(path.relative())
            .map_err(|e| self.map_err(e, "stat", path))?;
        let target = if meta.file_type().is_symlink() {
            self.data
                .read_link_contents(path.relative())
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        };
        Ok(EntryStat::new(path, &meta, target))
    }

    /// The entries of directory `path`, `depth` levels down (1: its own).
    pub fn list(&self, path: &VolumePath, depth: u32) -> VolumeResult<Vec<EntryStat>> {
        let depth = depth.clamp(1, MAX_LIST_DEPTH);
        let mut out = Vec::new();
        self.list_into(path, depth, &mut out)?;
        Ok(out)
    }

    fn list_into(
        &self,
        dir: &VolumePath,
        depth: u32,
        out: &mut Vec<EntryStat>,
    ) -> VolumeResult<()> {
        let entries = self
            .data
            .read_dir(dir.relative())
            .map_err(|e| self.map_err(e, "listing", dir))?;
        let mut names: Vec<String> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.map_err(e, "listing", dir))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        for name in names {
            let child = dir.join(&name);
            // An entry removed while listing is simply not listed.
            let Ok(stat) = self.stat(&child) else {
                continue;
            };
            let recurse = depth > 1 && stat.kind == EntryKind::Directory;
            out.push(stat);
            if recurse {
                self.list_into(&child, depth - 1, out)?;
            }
        }
        Ok(())
    }

    /// Creates directory `path`; with `parents`, also its missing parents,
    /// and an existing directory is not an error.
    pub fn make_dir(
        &self,
        path: &VolumePath,
        attrs: Attrs,
        parents: bool,
    ) -> VolumeResult<EntryStat> {
        if path.is_root() {
            return Err(VolumeError::Exists(path.to_string()));
        }
        // Each directory made costs ENTRY_COST of the limit.
        let mut room = self.limit.saturating_sub(self.usage()?);
        if parents {
            for dir in path.ancestors_and_self() {
                self.make_one_dir(&dir, attrs, true, &mut room)?;
            }
        } else {
            self.require_dir(&path.parent())?;
            self.make_one_dir(path, attrs, false, &mut room)?;
        }
        self.stat(path)
    }

    fn make_one_dir(
        &self,
        path: &VolumePath,
        attrs: Attrs,
        existing_ok: bool,
        room: &mut u64,
    ) -> VolumeResult<()> {
        if *room < ENTRY_COST {
            return match self.stat(path) {
                Err(VolumeError::PathNotFound(_)) => Err(self.full(ENTRY_COST)),
                Err(e) => Err(e),
                Ok(stat) => self.existing_dir(path, &stat, existing_ok),
            };
        }
        match self.data.create_dir(path.relative()) {
            Ok(()) => {
                *room -= ENTRY_COST;
                let file =
                    open_dir_fd(&self.data, path).map_err(|e| self.map_err(e, "opening", path))?;
                apply_attrs(&file, attrs, DIR_MODE)
                    .map_err(|e| self.map_err(e, "setting owner and mode of", path))
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                self.existing_dir(path, &self.stat(path)?, existing_ok)
            }
            Err(e) => Err(self.map_err(e, "creating directory", path)),
        }
    }

    /// Whether an entry already at `path` will do as the directory asked for.
    fn existing_dir(
        &self,
        path: &VolumePath,
        stat: &EntryStat,
        existing_ok: bool,
    ) -> VolumeResult<()> {
        match stat.kind {
            EntryKind::Directory if existing_ok => Ok(()),
            EntryKind::Directory => Err(VolumeError::Exists(path.to_string())),
            _ => Err(VolumeError::NotDirectory(path.to_string())),
        }
    }

    /// Opens `path` for reading; gives the file and its length.
    pub fn open_read(&self, path: &VolumePath) -> VolumeResult<(std::fs::File, u64)> {
        let file = self
            .data
            .open(path.relative())
            .map_err(|e| self.map_err(e, "opening", path))?;
        let meta = file.metadata().map_err(|e| self.map_err(e, "stat", path))?;
        if meta.is_dir() {
            return Err(VolumeError::IsDirectory(path.to_string()));
        }
        Ok((file.into_std(), meta.len()))
    }

    /// Starts an upload to `path`: its parent must be a directory, and an
    /// existing file is replaced only with `force`.
    pub fn begin_write(&self, path: &VolumePath, force: bool) -> VolumeResult<PendingWrite> {
        if path.is_root() {
            return Err(VolumeError::IsDirectory(path.to_string()));
        }
        self.require_dir(&path.parent())?;
        let replaced = match self.stat(path) {
            Ok(s) if s.kind == EntryKind::Directory => {
                return Err(VolumeError::IsDirectory(path.to_string()))
            }
            Ok(_) if !force => return Err(VolumeError::Exists(path.to_string())),
            Ok(s) => entry_cost(s.kind == EntryKind::File, s.size),
            Err(VolumeError::PathNotFound(_)) => 0,
            Err(e) => return Err(e),
        };
        let used = self.usage()?;
        // The new file costs at least ENTRY_COST, however short.
        let budget = (self.limit + replaced).saturating_sub(used);
        if budget < ENTRY_COST {
            return Err(self.full(ENTRY_COST));
        }
        let temp_name = format!("upload-{}", hex::encode(rand::random::<[u8; 8]>()));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        let file = self
            .tmp
            .open_with(&temp_name, &options)
            .map_err(|e| self.map_err(e, "creating upload file for", path))?
            .into_std();
        Ok(PendingWrite {
            path: path.clone(),
            file,
            budget,
            temp_name,
            force,
        })
    }

    /// The error for an upload that went past its budget.
    pub fn full(&self, wanted: u64) -> VolumeError {
        VolumeError::Full {
            volume: self.volume.clone(),
            used: self.usage().unwrap_or(0),
            limit: self.limit,
            wanted,
        }
    }

    /// Syncs an upload and puts it in place, with the owner and mode asked
    /// for (else the volume root's default owner and 0644).
    pub fn commit(&self, mut pending: PendingWrite, attrs: Attrs) -> VolumeResult<EntryStat> {
        let path = pending.path.clone();
        let result = self.commit_inner(&mut pending, attrs);
        // Gone once renamed; after a failure, this removes the remains.
        let _ = self.tmp.remove_file(&pending.temp_name);
        result?;
        self.stat(&path)
    }

    fn commit_inner(&self, pending: &mut PendingWrite, attrs: Attrs) -> VolumeResult<()> {
        let path = &pending.path;
        let io = |e| self.map_err(e, "writing", path);
        pending.file.flush().map_err(io)?;
        apply_attrs(&pending.file, attrs, FILE_MODE).map_err(io)?;
        pending.file.sync_all().map_err(io)?;
        if pending.force {
            self.tmp
                .rename(&pending.temp_name, &self.data, path.relative())
                .map_err(|e| self.map_err(e, "renaming the upload to", path))?;
        } else {
            // A hard link never replaces: two uploads racing for one new
            // name cannot both win.
            self.tmp
                .hard_link(&pending.temp_name, &self.data, path.relative())
                .map_err(|e| match e.kind() {
                    ErrorKind::AlreadyExists => VolumeError::Exists(path.to_string()),
                    _ => self.map_err(e, "linking the upload to", path),
                })?;
        }
        sync_dir(&self.data, &path.parent())
            .map_err(|e| self.map_err(e, "syncing the directory of", path))
    }

    /// Drops an upload that will not be committed.
    pub fn abort(&self, pending: PendingWrite) {
        let _ = self.tmp.remove_file(&pending.temp_name);
    }

    /// Changes owner and mode of `path` (following nothing out of the volume).
    pub fn set_attrs(&self, path: &VolumePath, attrs: Attrs) -> VolumeResult<EntryStat> {
        let stat = self.stat(path)?;
        let file = if stat.kind == EntryKind::Directory {
            open_dir_fd(&self.data, path).map_err(|e| self.map_err(e, "opening", path))?
        } else {
            self.data
                .open(path.relative())
                .map_err(|e| self.map_err(e, "opening", path))?
                .into_std()
        };
        let keep = Attrs {
            uid: attrs.uid.or(Some(stat.uid)),
            gid: attrs.gid.or(Some(stat.gid)),
            mode: attrs.mode.or(Some(stat.mode)),
        };
        apply_attrs(&file, keep, stat.mode)
            .map_err(|e| self.map_err(e, "setting owner and mode of", path))?;
        self.stat(path)
    }

    /// Removes a file, a link or a whole directory tree.
    pub fn remove(&self, path: &VolumePath) -> VolumeResult<()> {
        if path.is_root() {
            return Err(VolumeError::RemoveRoot);
        }
        let stat = self.stat(path)?;
        let result = if stat.kind == EntryKind::Directory {
            self.data.remove_dir_all(path.relative())
        } else {
            self.data.remove_file(path.relative())
        };
        result.map_err(|e| self.map_err(e, "removing", path))?;
        sync_dir(&self.data, &path.parent())
            .map_err(|e| self.map_err(e, "syncing the directory of", path))
    }

    /// What the volume's entries cost of its limit ([`crate::usage`]).
    pub fn usage(&self) -> VolumeResult<u64> {
        usage_of(&self.data).map_err(|e| self.map_err(e, "measuring", &VolumePath::root()))
    }

    fn require_dir(&self, path: &VolumePath) -> VolumeResult<()> {
        match self.stat(path)?.kind {
            EntryKind::Directory => Ok(()),
            _ => Err(VolumeError::NotDirectory(path.to_string())),
        }
    }

    /// Turns an I/O error into what the API reports: a missing path, a
    /// path through a file, or a path that leads out of the volume.
    fn map_err(&self, e: std::io::Error, what: &'static str, path: &VolumePath) -> VolumeError {
        match e.kind() {
            ErrorKind::NotFound => VolumeError::PathNotFound(path.to_string()),
            ErrorKind::NotADirectory => VolumeError::NotDirectory(path.to_string()),
            ErrorKind::IsADirectory => VolumeError::IsDirectory(path.to_string()),
            // cap-std's word for "this would leave the root".
            ErrorKind::PermissionDenied if e.raw_os_error().is_none() => VolumeError::Escapes {
                volume: self.volume.clone(),
                path: path.to_string(),
            },
            _ => VolumeError::Io {
                what,
                path: format!("volume {}:{}", self.volume, path).into(),
                source: e,
            },
        }
    }
}

/// Sets owner and mode on an open file or directory: the asked-for values,
/// else the default owner and `default_mode`; never root, never set-ID
/// bits ([`crate::squash`]). The mode is set after the owner: a chown
/// would clear set-ID bits, a chmod after it would not.
fn apply_attrs(file: &std::fs::File, attrs: Attrs, default_mode: u32) -> std::io::Result<()> {
    let uid = squash::uid(attrs.uid.unwrap_or(DEFAULT_OWNER.0));
    let gid = squash::gid(attrs.gid.unwrap_or(DEFAULT_OWNER.1));
    std::os::unix::fs::fchown(file, Some(uid), Some(gid))?;
    let mode = squash::mode(attrs.mode.unwrap_or(default_mode));
    file.set_permissions(std::fs::Permissions::from_mode(mode))
}

fn sync_dir(data: &Dir, dir: &VolumePath) -> std::io::Result<()> {
    open_dir_fd(data, dir)?.sync_all()
}

/// A directory opened for reading: `Dir::open_dir` gives an `O_PATH`
/// descriptor, on which fsync, fchown and fchmod fail.
fn open_dir_fd(data: &Dir, dir: &VolumePath) -> std::io::Result<std::fs::File> {
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_DIRECTORY);
    Ok(data.open_with(dir.relative(), &options)?.into_std())
}
