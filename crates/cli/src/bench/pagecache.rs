//! Page-cache state of one file, for file-warm / file-cold trials: only this
//! file's pages are touched, never the machine's whole cache.

use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use anyhow::{bail, Context};

/// Resident and total pages of `path` (mincore over a fresh mapping, which
/// itself faults nothing in).
pub fn residency(path: &Path) -> anyhow::Result<(usize, usize)> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len() as usize;
    if len == 0 {
        return Ok((0, 0));
    }
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let pages = len.div_ceil(page);
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped
    // below; nothing reads through it.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        bail!(
            "mmap of {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    let mut vec = vec![0u8; pages];
    // SAFETY: vec has one byte per page of the mapping.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        bail!("mincore of {}: {err}", path.display());
    }
    Ok((vec.iter().filter(|b| **b & 1 == 1).count(), pages))
}

/// Drops the file's pages from the page cache (`POSIX_FADV_DONTNEED`).
pub fn make_cold(path: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // Dirty pages are not dropped: write them back first.
    file.sync_data()?;
    // SAFETY: fadvise on a descriptor we own.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        bail!("posix_fadvise(DONTNEED) of {}: errno {rc}", path.display());
    }
    Ok(())
}

/// Reads the whole file so every page is cached.
pub fn make_warm(path: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = file.read_at(&mut buf, off)?;
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    Ok(())
}
