//! A template's memory and disk blobs are checked against their SHA-256
//! before a sandbox first resumes from them, and again whenever they
//! change, so a damaged template is refused rather than resumed with wrong
//! data. Hashing gigabytes on every create would be too slow, so a check is
//! remembered per file *stamp* (size, modification time, inode): in memory,
//! and in `cache/verified/<sha256>` so that a restarted server does not
//! hash again. Writing to a blob changes its stamp; damage that changes no
//! stamp (a failing disk) is what `siesta repo check` is for.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{HostError as Error, Result};

/// What a check of one file found: `Err` says what is wrong.
type Verdict = std::result::Result<(), String>;

/// The node's memory of which blobs were checked; cheap to share.
pub struct BlobChecks {
    markers: PathBuf,
    /// Blob path -> the stamp it was checked at, and what the check found.
    known: Mutex<HashMap<PathBuf, (String, Verdict)>>,
}

impl BlobChecks {
    /// Markers live in `markers` (`Layout::verified_blobs`).
    pub fn new(markers: PathBuf) -> Self {
        Self {
            markers,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// Checks each `(file, sha256)`, hashing a file only when its stamp is
    /// not known good; an empty digest (a record from before digests) is
    /// not checked. Blocking (it may read gigabytes): call it from a
    /// blocking thread.
    pub fn check(&self, files: &[(&Path, &str)]) -> Result<()> {
        for (path, sha) in files {
            if !sha.is_empty() {
                self.check_file(path, sha)?;
            }
        }
        Ok(())
    }

    fn check_file(&self, path: &Path, sha: &str) -> Result<()> {
        let stamp = stamp(path)?;
        // Held while hashing: concurrent first uses wait for one check.
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let verdict = match known.get(path) {
            Some((seen, verdict)) if *seen == stamp => verdict.clone(),
            _ => {
                let verdict = if self.marked(sha) == Some(stamp.clone()) {
                    Ok(())
                } else {
                    self.hash(path, sha, &stamp)
                };
                known.insert(path.to_path_buf(), (stamp, verdict.clone()));
                verdict
            }
        };
        verdict.map_err(|detail| Error::CorruptImage {
            path: path.to_path_buf(),
            detail,
        })
    }

    fn hash(&self, path: &Path, sha: &str, stamp: &str) -> Verdict {
        let started = std::time::Instant::now();
        let actual = sparse_sha256(path).map_err(|e| format!("cannot be read: {e}"))?;
        if actual != sha {
            tracing::error!(file = %path.display(), expected = sha, %actual, "template blob is damaged");
            return Err(format!("its SHA-256 is {actual}, its record says {sha}"));
        }
        tracing::info!(file = %path.display(), ms = started.elapsed().as_millis() as u64, "template blob checked");
        self.mark(sha, stamp);
        Ok(())
    }

    fn marked(&self, sha: &str) -> Option<String> {
        std::fs::read_to_string(self.markers.join(sha)).ok()
    }

    /// Remembers a good check across restarts (best effort: without the
    /// marker the next server hashes again).
    fn mark(&self, sha: &str, stamp: &str) {
        let write = std::fs::create_dir_all(&self.markers)
            .and_then(|()| std::fs::write(self.markers.join(sha), stamp));
        if let Err(e) = write {
            tracing::warn!(dir = %self.markers.display(), "recording a blob check: {e}");
        }
    }

    /// Records that a blob was just written with digest `sha` (a build that
    /// hashed what it published), so its first use need not hash it again.
    pub fn trust(&self, path: &Path, sha: &str) {
        if let Ok(stamp) = stamp(path) {
            self.mark(sha, &stamp);
        }
    }
}

/// SHA-256 of a file's content, reading only its data extents: a hole is
/// hashed as the zeros it reads as, without reading it (the blobs are
/// mostly holes, and reading those costs more than hashing them here).
pub fn sparse_sha256(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;

    const CHUNK: usize = 1 << 20;
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let mut hasher = sha2::Sha256::new();
    let zeros = vec![0u8; CHUNK];
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    let hash_zeros = |hasher: &mut sha2::Sha256, mut n: u64| {
        while n > 0 {
            let take = n.min(CHUNK as u64) as usize;
            hasher.update(&zeros[..take]);
            n -= take as u64;
        }
    };
    while pos < len {
        // SAFETY: lseek on a descriptor we own; the result is checked.
        let data = unsafe { libc::lseek(file.as_raw_fd(), pos as i64, libc::SEEK_DATA) };
        let data = if data < 0 { len } else { data as u64 };
        hash_zeros(&mut hasher, data - pos);
        if data >= len {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(file.as_raw_fd(), data as i64, libc::SEEK_HOLE) };
        let end = if hole < 0 {
            len
        } else {
            (hole as u64).min(len)
        };
        file.seek(SeekFrom::Start(data))?;
        let mut left = end - data;
        while left > 0 {
            let take = left.min(CHUNK as u64) as usize;
            file.read_exact(&mut buf[..take])?;
            hasher.update(&buf[..take]);
            left -= take as u64;
        }
        pos = end;
    }
    Ok(hex::encode(hasher.finalize()))
}

/// What identifies a file's content without reading it.
fn stamp(path: &Path) -> Result<String> {
    let m = std::fs::metadata(path).map_err(|e| Error::CorruptImage {
        path: path.to_path_buf(),
        detail: format!("cannot be read: {e}"),
    })?;
    Ok(format!(
        "{} {}.{} {}",
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ino()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(data: &[u8]) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(data))
    }

    #[test]
    fn a_sparse_file_hashes_as_its_full_content() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let mut f = std::fs::File::create(&path).unwrap();
        f.seek(SeekFrom::Start(3 << 20)).unwrap();
        f.write_all(b"data in the middle").unwrap();
        f.set_len(8 << 20).unwrap();
        drop(f);
        let full = std::fs::read(&path).unwrap();
        assert_eq!(sparse_sha256(&path).unwrap(), sha(&full));
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(sparse_sha256(&empty).unwrap(), sha(b""));
    }

    #[test]
    fn a_changed_blob_is_hashed_again_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        std::fs::write(&blob, b"template memory").unwrap();
        let good = sha(b"template memory");
        let checks = BlobChecks::new(dir.path().join("verified"));
        checks.check_file(&blob, &good).unwrap();
        // Remembered on disk: a new node trusts the same stamp.
        assert!(dir.path().join("verified").join(&good).is_file());
        BlobChecks::new(dir.path().join("verified"))
            .check_file(&blob, &good)
            .unwrap();
        // One byte changed (a new stamp): refused, naming the file.
        std::fs::write(&blob, b"template memorx").unwrap();
        let err = checks.check_file(&blob, &good).unwrap_err().to_string();
        assert!(err.contains("blob") && err.contains("SHA-256"), "{err}");
        // Put back: accepted again.
        std::fs::write(&blob, b"template memory").unwrap();
        checks.check_file(&blob, &good).unwrap();
    }
}
