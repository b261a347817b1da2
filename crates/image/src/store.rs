//! Blobs (layers, configs, manifests) cached on disk by digest, so a
//! second build of the same image does not fetch its layers again.
//!
//! Layout: `DIR/sha256/<hex>`. A blob is written to `DIR/tmp/`, hashed,
//! flushed and renamed into place only when its content matches its
//! digest, so the cache never holds a torn or wrong blob under a digest.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{ImageError, IoContext, Result};

/// The cache directory.
#[derive(Debug, Clone)]
pub struct BlobStore {
    dir: PathBuf,
}

impl BlobStore {
    /// Opens (creating) the store in `dir`, removing downloads that a
    /// process no longer running left half-written.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        for sub in ["sha256", "tmp"] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).ctx("creating the image blob cache", &d)?;
        }
        let store = Self { dir };
        store.remove_orphaned_downloads();
        Ok(store)
    }

    /// Temporary files are named `<pid>-<random>`: those of a pid that is
    /// gone (a killed build) are removed; live ones are another build's.
    fn remove_orphaned_downloads(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("tmp")) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.split('-').next()?.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where blob `digest` (`sha256:<64 hex>`) lives; other algorithms and
    /// malformed digests are refused (they would name paths we do not own).
    pub fn path(&self, digest: &str) -> Result<PathBuf> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| ImageError::BadLayer {
                digest: digest.to_string(),
                detail: "not a sha256 digest (only sha256:<64 hex digits> is supported)".into(),
            })?;
        Ok(self.dir.join("sha256").join(hex.to_ascii_lowercase()))
    }

    /// Whether blob `digest` is cached.
    pub fn contains(&self, digest: &str) -> bool {
        self.path(digest).map(|p| p.is_file()).unwrap_or(false)
    }

    /// A fresh temporary file name for a blob being written.
    pub fn temp_path(&self) -> PathBuf {
        let n: u64 = rand::random();
        self.dir
            .join("tmp")
            .join(format!("{}-{n:016x}", std::process::id()))
    }

    /// Verifies the blob written at `tmp` against `digest` and moves it into
    /// place; a mismatch removes it and is an error.
    pub fn commit(&self, tmp: &Path, digest: &str) -> Result<PathBuf> {
        let dest = self.path(digest)?;
        let actual = match hash_file(tmp) {
            Ok(h) => h,
            Err(e) => {
                let _ = std::fs::remove_file(tmp);
                return Err(e);
            }
        };
        if format!("sha256:{actual}") != digest.to_ascii_lowercase() {
            let _ = std::fs::remove_file(tmp);
            return Err(ImageError::DigestMismatch {
                digest: digest.to_string(),
                actual,
            });
        }
        File::open(tmp)
            .and_then(|f| f.sync_all())
            .ctx("flushing a downloaded blob", tmp)?;
        std::fs::rename(tmp, &dest).ctx("moving a blob into the cache", &dest)?;
        Ok(dest)
    }

    /// Copies `reader` into the store; with `expected`, the content must
    /// match it. Returns the blob's digest.
    pub fn insert(&self, reader: &mut dyn Read, expected: Option<&str>) -> Result<String> {
        let tmp = self.temp_path();
        let written = (|| -> std::io::Result<String> {
            let mut out = File::create(&tmp)?;
            let mut hasher = Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = reader.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                out.write_all(&buf[..n])?;
            }
            out.sync_all()?;
            Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
        })();
        let digest = match written {
            Ok(d) => d,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(ImageError::Io {
                    what: "copying a blob into the cache",
                    path: tmp,
                    source: e,
                });
            }
        };
        if let Some(want) = expected {
            if want.to_ascii_lowercase() != digest {
                let _ = std::fs::remove_file(&tmp);
                return Err(ImageError::DigestMismatch {
                    digest: want.to_string(),
                    actual: digest.trim_start_matches("sha256:").to_string(),
                });
            }
        }
        let dest = self.path(&digest)?;
        std::fs::rename(&tmp, &dest).ctx("moving a blob into the cache", &dest)?;
        Ok(digest)
    }

    /// Reads a small cached blob (a manifest or config) whole.
    pub fn read(&self, digest: &str) -> Result<Vec<u8>> {
        let p = self.path(digest)?;
        std::fs::read(&p).ctx("reading a cached blob", p)
    }
}

/// The SHA-256 of a file, in hex.
pub fn hash_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).ctx("opening a blob to verify it", path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher).ctx("reading a blob to verify it", path)?;
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(b: &[u8]) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(b)))
    }

    #[test]
    fn insert_keeps_content_under_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let d = store.insert(&mut &b"layer bytes"[..], None).unwrap();
        assert_eq!(d, digest_of(b"layer bytes"));
        assert!(store.contains(&d));
        assert_eq!(store.read(&d).unwrap(), b"layer bytes");
    }

    #[test]
    fn a_wrong_blob_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let want = digest_of(b"the real one");
        let e = store
            .insert(&mut &b"something else"[..], Some(&want))
            .unwrap_err();
        assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");
        assert!(!store.contains(&want));
        let tmp = store.temp_path();
        std::fs::write(&tmp, b"torn").unwrap();
        assert!(store.commit(&tmp, &want).is_err());
        assert!(!tmp.exists() && !store.contains(&want));
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
    }

    #[test]
    fn downloads_of_dead_processes_are_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let mine = store.temp_path();
        std::fs::write(&mine, b"in progress").unwrap();
        // No process has pid 4194304 + 1 (above the kernel's pid_max limit).
        let dead = dir.path().join("tmp").join("4194305-00");
        std::fs::write(&dead, b"torn").unwrap();
        BlobStore::open(dir.path()).unwrap();
        assert!(mine.exists(), "a live process's download was removed");
        assert!(!dead.exists());
    }

    #[test]
    fn digests_that_name_other_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        for bad in ["sha256:../../etc/passwd", "sha512:00", "md5:abc", ""] {
            assert!(store.path(bad).is_err(), "{bad}");
        }
    }
}
