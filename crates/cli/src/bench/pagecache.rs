//! Page-cache state of one file, for file-warm / file-cold trials: only this
//! file's pages are touched, never the machine's whole cache.

use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use anyhow::{bail, Context};
use siesta_snapshot::pagecache::Residency;

/// Resident and total pages of `path`.
pub fn residency(path: &Path) -> anyhow::Result<(usize, usize)> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let Some(map) = Residency::map(&file).with_context(|| format!("mapping {}", path.display()))?
    else {
        return Ok((0, 0));
    };
    map.count(0, map.len() as u64)
        .with_context(|| format!("mincore of {}", path.display()))
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
