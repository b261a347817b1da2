//! File metadata kept as `user.e2b.<key>` extended attributes.
//!
//! The SDK sends `X-Metadata-<key>` headers on upload and reads them back as
//! `EntryInfo.metadata`. libc's `*xattr` calls are used directly: they are
//! plain syscalls, so the static build needs nothing more.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The namespace every metadata key lives under.
pub const PREFIX: &str = "user.e2b.";

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Stores `key = value` on `path` (not following a final symlink, whose
/// attributes Linux does not allow in the `user.` namespace anyway).
pub fn set(path: &Path, key: &str, value: &str) -> io::Result<()> {
    let p = c_path(path)?;
    let name = CString::new(format!("{PREFIX}{key}"))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: both strings are NUL-terminated and outlive the call; the value
    // pointer and length describe one live slice.
    let rc = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes every `user.e2b.*` attribute of `path` (a file overwritten by
/// an upload keeps no metadata of its previous content). Missing xattr
/// support is nothing to remove.
pub fn clear_all(path: &Path) -> io::Result<()> {
    let p = c_path(path)?;
    let Some(names) = list(&p) else { return Ok(()) };
    for name in names
        .split(|b| *b == 0)
        .filter(|n| n.starts_with(PREFIX.as_bytes()))
    {
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        // SAFETY: both strings are NUL-terminated and outlive the call.
        let rc = unsafe { libc::lremovexattr(p.as_ptr(), cname.as_ptr()) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENODATA) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Reads every `user.e2b.*` attribute of `path`. A filesystem without xattr
/// support, or a file without attributes, gives an empty map: metadata is
/// optional and must never make a `Stat` fail.
pub fn read_all(path: &Path) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Ok(p) = c_path(path) else { return out };
    let Some(names) = list(&p) else { return out };
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Some(key) = name.strip_prefix(PREFIX.as_bytes()) else {
            continue;
        };
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        if let Some(value) = get(&p, &cname) {
            out.insert(
                String::from_utf8_lossy(key).into_owned(),
                String::from_utf8_lossy(&value).into_owned(),
            );
        }
    }
    out
}

/// The NUL-separated attribute names, retrying if the list grows between the
/// size query and the read.
fn list(p: &CString) -> Option<Vec<u8>> {
    for _ in 0..3 {
        // SAFETY: a NULL buffer with size 0 only queries the needed size.
        let size = unsafe { libc::llistxattr(p.as_ptr(), std::ptr::null_mut(), 0) };
        if size <= 0 {
            return None;
        }
        let mut buf = vec![0u8; size as usize];
        // SAFETY: buf is writable for buf.len() bytes.
        let got = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got >= 0 {
            buf.truncate(got as usize);
            return Some(buf);
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) {
            return None;
        }
    }
    None
}

fn get(p: &CString, name: &CString) -> Option<Vec<u8>> {
    for _ in 0..3 {
        // SAFETY: size query with a NULL buffer.
        let size = unsafe { libc::lgetxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return None;
        }
        let mut buf = vec![0u8; size as usize];
        // SAFETY: buf is writable for buf.len() bytes.
        let got = unsafe {
            libc::lgetxattr(
                p.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if got >= 0 {
            buf.truncate(got as usize);
            return Some(buf);
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_or_unsupported() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        match set(&f, "owner", "alice") {
            Ok(()) => {
                set(&f, "k2", "").unwrap();
                let m = read_all(&f);
                assert_eq!(m.get("owner").map(String::as_str), Some("alice"));
                assert_eq!(m.get("k2").map(String::as_str), Some(""));
            }
            // tmpfs without user xattrs, overlayfs on some kernels.
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => assert!(read_all(&f).is_empty()),
            Err(e) => panic!("setxattr: {e}"),
        }
    }
}
