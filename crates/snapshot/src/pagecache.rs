//! Which pages of a file are in the page cache: `mincore` over a read-only
//! shared mapping of it, which itself faults nothing in.
//!
//! The prefetcher skips chunks that are already resident (copying them out
//! would only cost CPU that the restoring VM needs), and the benchmarks
//! verify file-warm and file-cold conditions with it.

use std::fs::File;
use std::os::unix::io::AsRawFd;

/// A mapping of a file kept only to ask which of its pages are cached.
pub struct Residency {
    addr: *mut libc::c_void,
    len: usize,
    page: usize,
}

// SAFETY: the mapping is never read or written through; `mincore` only
// inspects the kernel's page tables for it, which is safe from any thread.
unsafe impl Send for Residency {}
// SAFETY: as above; `&self` methods only call `mincore`.
unsafe impl Sync for Residency {}

impl Residency {
    /// Maps `file` (its current length) for residency queries; `Ok(None)`
    /// for an empty file, which has no pages.
    pub fn map(file: &File) -> std::io::Result<Option<Self>> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        if len == 0 {
            return Ok(None);
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        // SAFETY: a read-only shared mapping of a file we hold open, of its
        // length; unmapped on drop and never dereferenced.
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
            return Err(std::io::Error::last_os_error());
        }
        Ok(Some(Self { addr, len, page }))
    }

    /// Bytes mapped (the file's length when mapped).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an empty file is not mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Resident pages and pages in `[off, off + len)`, clipped to the file.
    pub fn count(&self, off: u64, len: u64) -> std::io::Result<(usize, usize)> {
        let start = usize::try_from(off).unwrap_or(usize::MAX).min(self.len);
        let start = start - start % self.page;
        let end = usize::try_from(off.saturating_add(len))
            .unwrap_or(usize::MAX)
            .min(self.len);
        if end <= start {
            return Ok((0, 0));
        }
        let pages = (end - start).div_ceil(self.page);
        let mut vec = vec![0u8; pages];
        // SAFETY: [start, end) lies inside the mapping, start is page
        // aligned, and vec has one byte per page of it.
        let rc = unsafe {
            libc::mincore(
                self.addr.cast::<u8>().add(start).cast(),
                end - start,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((vec.iter().filter(|b| **b & 1 == 1).count(), pages))
    }

    /// Whether every page of `[off, off + len)` inside the file is cached
    /// (false for a range wholly past its end, or on any error).
    pub fn all_resident(&self, off: u64, len: u64) -> bool {
        matches!(self.count(off, len), Ok((resident, pages)) if pages > 0 && resident == pages)
    }
}

impl Drop for Residency {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn written_pages_are_resident_and_dropped_ones_are_not() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; 64 * 4096]).unwrap();
        let r = Residency::map(&f).unwrap().unwrap();
        assert_eq!(r.len(), 64 * 4096);
        assert_eq!(r.count(0, 64 * 4096).unwrap(), (64, 64));
        assert!(r.all_resident(4096, 8192));
        // Clipped to the file; wholly past it is empty, not resident.
        assert_eq!(r.count(60 * 4096, 1 << 30).unwrap(), (4, 4));
        assert_eq!(r.count(1 << 30, 4096).unwrap(), (0, 0));
        assert!(!r.all_resident(1 << 30, 4096));

        f.sync_all().unwrap();
        // SAFETY: fadvise on a descriptor we own.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let (resident, pages) = r.count(0, 64 * 4096).unwrap();
        assert_eq!(pages, 64);
        // tmpfs cannot drop pages; a disk-backed file can.
        if resident < 64 {
            assert!(!r.all_resident(0, 64 * 4096));
        }
        assert!(Residency::map(&tempfile::tempfile().unwrap())
            .unwrap()
            .is_none());
    }
}
