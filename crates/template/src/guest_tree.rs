//! Reading and editing an unpacked image tree on the host, as root, without
//! ever leaving it.
//!
//! The tree is the image's: any file in it may be a symbolic link, and an
//! absolute one (`etc/passwd -> /var/lib/siesta/siesta.db`) would lead a
//! plain `open` to a host file. Every access here starts from a descriptor
//! of the root and resolves with `openat2(RESOLVE_IN_ROOT)`: the kernel
//! treats the root as `/` for that lookup, so `/x` and `../../x` both stay
//! inside, and links resolve as the guest will see them. What is created or
//! removed is created or removed by one name in a directory opened that way
//! (`mkdirat`, `unlinkat`, `openat(O_CREAT|O_EXCL|O_NOFOLLOW)`), and modes
//! and owners are set on the open descriptor, never by path.
//!
//! Paths are relative to the root (`etc/passwd`); messages name them as the
//! guest does (`/etc/passwd`).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::error::{Error, IoContext, Result};

/// A root directory whose contents are reached only through itself.
pub(crate) struct GuestTree {
    root: OwnedFd,
    /// The root's host path, for messages only: nothing is opened by it.
    host: PathBuf,
}

/// `openat2` returns `EAGAIN` when a rename raced the lookup; it is retried
/// this many times.
const RETRIES: usize = 16;

impl GuestTree {
    /// Opens `root` (itself a directory, not a link).
    pub(crate) fn open(root: &Path) -> Result<Self> {
        let fd = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(std::io::Error::from)
        .ctx("opening the guest tree", root)?;
        let tree = Self {
            root: fd,
            host: root.to_path_buf(),
        };
        match tree.resolve(".", OFlags::PATH) {
            Err(Errno::NOSYS) => Err(Error::Invalid(
                "this kernel lacks openat2 (Linux 5.6 or later), which siesta needs to edit an image's files safely".into(),
            )),
            r => r.map_err(|e| tree.io("opening the guest tree", ".", e)).map(drop),
        }?;
        Ok(tree)
    }

    /// Where `rel` is on the host, for messages only.
    pub(crate) fn host_path(&self, rel: &str) -> PathBuf {
        self.host.join(rel)
    }

    /// Opens `rel` as the guest would resolve it: links followed, all of
    /// them inside the root.
    fn resolve(&self, rel: &str, flags: OFlags) -> std::result::Result<OwnedFd, Errno> {
        let rel = if rel.is_empty() { "." } else { rel };
        // openat2 refuses O_PATH with flags that only an open file has.
        let flags = if flags.contains(OFlags::PATH) {
            flags | OFlags::CLOEXEC
        } else {
            flags | OFlags::CLOEXEC | OFlags::NOCTTY
        };
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(
                &self.root,
                rel,
                flags,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            ) {
                Err(Errno::AGAIN) if tries < RETRIES => tries += 1,
                r => return r,
            }
        }
    }

    /// Whether `rel` leads to something, following links inside the root.
    pub(crate) fn exists(&self, rel: &str) -> bool {
        self.resolve(rel, OFlags::PATH).is_ok()
    }

    /// Whether there is an entry named `rel`, itself (a link that leads
    /// nowhere included).
    pub(crate) fn present(&self, rel: &str) -> bool {
        let (parent, name) = split(rel);
        self.resolve(parent, OFlags::PATH | OFlags::DIRECTORY)
            .and_then(|dir| rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW))
            .is_ok()
    }

    /// The directory `rel`, made (mode 0755, whatever the process's umask:
    /// the CLI's is 077) where it or any directory above it is missing.
    pub(crate) fn dir(&self, rel: &str) -> Result<File> {
        let parts: Vec<&str> = rel
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let mut cur = self
            .resolve(".", dir_flags)
            .map_err(|e| self.io("opening the guest tree", ".", e))?;
        for i in 0..parts.len() {
            let prefix = parts[..=i].join("/");
            cur = match self.resolve(&prefix, dir_flags) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => self.make_dir(&cur, parts[i], &prefix)?,
                Err(Errno::NOTDIR) => {
                    return Err(Error::Invalid(format!(
                        "the image's /{prefix} is not a directory; siesta needs /{} to be one",
                        parts.join("/")
                    )))
                }
                Err(e) => return Err(self.io("opening a guest directory", &prefix, e)),
            };
        }
        Ok(File::from(cur))
    }

    /// Makes directory `name` in `parent` (the resolved `/prefix` less its
    /// last part) and opens it.
    fn make_dir(&self, parent: &OwnedFd, name: &str, prefix: &str) -> Result<OwnedFd> {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => {}
            // Not there when resolved, yet there by name: a dangling link.
            Err(Errno::EXIST) => return Err(self.dangling(parent, name, prefix)),
            Err(e) => return Err(self.io("creating a guest directory", prefix, e)),
        }
        let dir = File::from(
            rustix::fs::openat(
                parent,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| self.io("opening a guest directory", prefix, e))?,
        );
        dir.set_permissions(std::fs::Permissions::from_mode(0o755))
            .ctx(
                "setting the mode of a guest directory",
                self.host.join(prefix),
            )?;
        Ok(OwnedFd::from(dir))
    }

    /// The contents of regular file `rel` (links followed inside the root),
    /// at most `max` bytes; `None` when there is none. Anything else there
    /// (a directory, a pipe, a link that leads nowhere) is an error.
    pub(crate) fn read_file(&self, rel: &str, max: u64) -> Result<Option<Vec<u8>>> {
        // O_NONBLOCK: opening a pipe must not wait for a writer.
        let fd = match self.resolve(rel, OFlags::RDONLY | OFlags::NONBLOCK) {
            Ok(fd) => fd,
            Err(Errno::NOENT) if self.present(rel) => {
                let (parent, name) = split(rel);
                return Err(self.dangling_at(parent, name, rel));
            }
            Err(Errno::NOENT | Errno::NOTDIR) => return Ok(None),
            Err(e) => return Err(self.io("opening a guest file", rel, e)),
        };
        let file = self.regular(fd, rel)?;
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .ctx("reading a guest file", self.host.join(rel))?;
        if bytes.len() as u64 > max {
            return Err(Error::Invalid(format!(
                "the image's /{rel} is over {} MiB; siesta does not edit it",
                max >> 20
            )));
        }
        Ok(Some(bytes))
    }

    /// Replaces whatever entry is at `rel` (a link is removed, not
    /// followed) with a regular file of `content`, owned by root.
    pub(crate) fn replace_file(&self, rel: &str, content: &[u8], mode: u32) -> Result<()> {
        let (parent, name) = split(rel);
        let dir = self.dir(parent)?;
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::ISDIR) => {
                return Err(Error::Invalid(format!(
                    "the image's /{rel} is a directory; siesta writes a file there"
                )))
            }
            Err(e) => return Err(self.io("replacing a guest file", rel, e)),
        }
        self.create(&dir, name, rel, content, mode)
    }

    /// Appends `line` (and a newline, after one for an unterminated last
    /// line) to regular file `rel`, following links inside the root; a
    /// missing file is made with `mode`, owned by root.
    pub(crate) fn append_line(&self, rel: &str, line: &str, mode: u32) -> Result<()> {
        let fd = match self.resolve(rel, OFlags::RDWR | OFlags::APPEND | OFlags::NONBLOCK) {
            Ok(fd) => fd,
            Err(Errno::NOENT) if self.present(rel) => {
                let (parent, name) = split(rel);
                return Err(self.dangling_at(parent, name, rel));
            }
            Err(Errno::NOENT) => {
                let (parent, name) = split(rel);
                let dir = self.dir(parent)?;
                return self.create(&dir, name, rel, format!("{line}\n").as_bytes(), mode);
            }
            Err(Errno::ISDIR) => return Err(not_regular(rel, "a directory")),
            Err(e) => return Err(self.io("opening a guest file", rel, e)),
        };
        let mut file = self.regular(fd, rel)?;
        let path = self.host.join(rel);
        let len = file.metadata().ctx("reading a guest file", &path)?.len();
        let mut last = [b'\n'];
        if len > 0 {
            file.read_exact_at(&mut last, len - 1)
                .ctx("reading a guest file", &path)?;
        }
        let sep = if last[0] == b'\n' { "" } else { "\n" };
        file.write_all(format!("{sep}{line}\n").as_bytes())
            .ctx("writing a guest file", &path)
    }

    /// A new regular file `name` in `dir` (the resolved parent of `rel`).
    fn create(&self, dir: &File, name: &str, rel: &str, content: &[u8], mode: u32) -> Result<()> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let fd = rustix::fs::openat(
            dir,
            name,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| self.io("creating a guest file", rel, e))?;
        let mut file = File::from(fd);
        let path = self.host.join(rel);
        file.write_all(content).ctx("writing a guest file", &path)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .ctx("setting the mode of a guest file", &path)?;
        std::os::unix::fs::fchown(&file, Some(0), Some(0))
            .ctx("setting the owner of a guest file", &path)
    }

    /// `fd` as a file, when it is a regular one.
    fn regular(&self, fd: OwnedFd, rel: &str) -> Result<File> {
        let file = File::from(fd);
        let kind = file
            .metadata()
            .ctx("reading a guest file", self.host.join(rel))?
            .file_type();
        if kind.is_file() {
            return Ok(file);
        }
        Err(not_regular(
            rel,
            if kind.is_dir() {
                "a directory"
            } else {
                "a pipe, socket or device"
            },
        ))
    }

    fn dangling_at(&self, parent: &str, name: &str, rel: &str) -> Error {
        match self.resolve(parent, OFlags::PATH | OFlags::DIRECTORY) {
            Ok(dir) => self.dangling(&dir, name, rel),
            Err(e) => self.io("opening a guest directory", parent, e),
        }
    }

    /// The error for `/rel`, a link (`name` in `dir`) that leads nowhere
    /// in the image.
    fn dangling(&self, dir: &impl std::os::fd::AsFd, name: &str, rel: &str) -> Error {
        let target = rustix::fs::readlinkat(dir, name, Vec::new())
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "?".into());
        Error::Invalid(format!(
            "the image's /{rel} is a symbolic link to {target}, which is not in the image \
             (links resolve inside the image, as the guest sees them); siesta cannot edit it"
        ))
    }

    fn io(&self, what: &'static str, rel: &str, e: Errno) -> Error {
        Error::Io {
            what,
            path: self.host.join(rel),
            source: e.into(),
        }
    }
}

fn not_regular(rel: &str, kind: &str) -> Error {
    Error::Invalid(format!(
        "the image's /{rel} is {kind}, not a regular file; siesta edits it as a file, so the image cannot be used"
    ))
}

/// `etc/passwd` as (`etc`, `passwd`); a top-level name has parent `.`.
fn split(rel: &str) -> (&str, &str) {
    match rel.trim_end_matches('/').rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => (".", rel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, GuestTree) {
        let dir = tempfile::tempdir().unwrap();
        let tree = GuestTree::open(dir.path()).unwrap();
        (dir, tree)
    }

    #[test]
    fn a_pipe_is_refused_without_waiting_for_a_writer() {
        let (dir, tree) = tree();
        let fifo = std::ffi::CString::new(
            dir.path()
                .join("passwd")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let e = tree.read_file("passwd", 1 << 20).unwrap_err().to_string();
        assert!(e.contains("/passwd is a pipe"), "{e}");
        let e = tree
            .append_line("passwd", "x", 0o644)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/passwd is a pipe"), "{e}");
    }

    #[test]
    fn files_over_the_limit_are_not_read() {
        let (dir, tree) = tree();
        std::fs::write(dir.path().join("group"), b"0123456789").unwrap();
        assert!(tree.read_file("group", 10).unwrap().is_some());
        let e = tree.read_file("group", 9).unwrap_err().to_string();
        assert!(e.contains("/group is over"), "{e}");
        assert!(tree.read_file("missing", 9).unwrap().is_none());
    }

    #[test]
    fn directories_are_made_and_files_in_the_way_named() {
        let (dir, tree) = tree();
        tree.dir("a/b/c").unwrap();
        let made = std::fs::metadata(dir.path().join("a/b/c")).unwrap();
        assert!(made.is_dir());
        assert_eq!(made.permissions().mode() & 0o7777, 0o755);
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let e = tree.dir("f/x").unwrap_err().to_string();
        assert!(e.contains("/f is not a directory"), "{e}");
    }

    #[test]
    fn appending_ends_an_unterminated_line_first() {
        let (dir, tree) = tree();
        std::fs::write(dir.path().join("t"), b"a:b").unwrap();
        tree.append_line("t", "c:d", 0o644).unwrap();
        tree.append_line("new/t", "e:f", 0o600).unwrap();
        assert_eq!(std::fs::read(dir.path().join("t")).unwrap(), b"a:b\nc:d\n");
        let made = dir.path().join("new/t");
        assert_eq!(std::fs::read(&made).unwrap(), b"e:f\n");
        let mode = std::fs::metadata(&made).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(tree.present("t") && tree.exists("t") && !tree.present("nope"));
    }
}
