//! Recording a startup manifest from `/proc/<pid>/pagemap`.
//!
//! The VMM maps the snapshot's memory file privately; the guest touching a
//! page makes it present in that mapping (a file page when read, a private
//! copy when written; both came from the file). Sampling the mapping's
//! pagemap entries repeatedly from resume until the agent answers gives the
//! pages the start-up needed, and the sample in which each first appeared:
//! first-touch order by sample index, then by address within a sample. No
//! VMM change is needed; the cost is reading 8 bytes per guest page per
//! sample.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::manifest::Manifest;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;

#[derive(Debug, thiserror::Error)]
pub enum PagemapError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("process {pid} has no mapping of {file}")]
    NoMapping { pid: u32, file: PathBuf },
    #[error("bad line in {path}: {line:?}")]
    BadMaps { path: PathBuf, line: String },
}

/// A mapping of the memory file in the VMM's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
}

/// Finds the mapping of the file with inode `ino` on device `dev` in a
/// `/proc/<pid>/maps` text; the largest if several (QEMU maps guest RAM
/// once; smaller ones would be ROM or alias regions).
pub fn find_mapping(maps: &str, dev: u64, ino: u64) -> Option<Mapping> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let mut devf = f.next()?.split(':');
            let dmaj = u32::from_str_radix(devf.next()?, 16).ok()?;
            let dmin = u32::from_str_radix(devf.next()?, 16).ok()?;
            let inode: u64 = f.next()?.parse().ok()?;
            let (s, e) = range.split_once('-')?;
            let m = Mapping {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                file_offset: offset,
            };
            (inode == ino && dmaj == major && dmin == minor).then_some(m)
        })
        .max_by_key(|m| m.end - m.start)
}

/// Samples the present pages of one process's mapping of a memory file.
pub struct PagemapRecorder {
    pagemap: std::fs::File,
    pagemap_path: PathBuf,
    mapping: Mapping,
    page_size: u64,
    guest_memory_size: u64,
    /// Sample index at which each page was first seen present.
    first_seen: Vec<u32>,
    samples: u32,
    buf: Vec<u8>,
}

const NOT_SEEN: u32 = u32::MAX;

impl PagemapRecorder {
    /// Finds `memory_file`'s mapping in process `pid`. `guest_memory_size`
    /// is the snapshot's; pages of the mapping beyond it are ignored.
    pub fn new(pid: u32, memory_file: &Path, guest_memory_size: u64) -> Result<Self, PagemapError> {
        let meta = std::fs::metadata(memory_file).map_err(|source| PagemapError::Io {
            what: "stat of memory file",
            path: memory_file.to_path_buf(),
            source,
        })?;
        let maps_path = PathBuf::from(format!("/proc/{pid}/maps"));
        let maps = std::fs::read_to_string(&maps_path).map_err(|source| PagemapError::Io {
            what: "reading",
            path: maps_path.clone(),
            source,
        })?;
        let mapping =
            find_mapping(&maps, meta.dev(), meta.ino()).ok_or(PagemapError::NoMapping {
                pid,
                file: memory_file.to_path_buf(),
            })?;
        let pagemap_path = PathBuf::from(format!("/proc/{pid}/pagemap"));
        let pagemap = std::fs::File::open(&pagemap_path).map_err(|source| PagemapError::Io {
            what: "opening",
            path: pagemap_path.clone(),
            source,
        })?;
        // SAFETY: sysconf has no preconditions.
        let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let mapped = (mapping.end - mapping.start)
            .min(guest_memory_size.saturating_sub(mapping.file_offset));
        let pages = (mapped / page_size) as usize;
        Ok(Self {
            pagemap,
            pagemap_path,
            mapping,
            page_size,
            guest_memory_size,
            first_seen: vec![NOT_SEEN; pages],
            samples: 0,
            buf: Vec::new(),
        })
    }

    /// Reads the mapping's pagemap once; returns how many pages were seen
    /// for the first time.
    pub fn sample(&mut self) -> Result<usize, PagemapError> {
        let pages = self.first_seen.len();
        self.buf.resize(pages * 8, 0);
        let at = self.mapping.start / self.page_size * 8;
        self.pagemap
            .read_exact_at(&mut self.buf, at)
            .map_err(|source| PagemapError::Io {
                what: "reading",
                path: self.pagemap_path.clone(),
                source,
            })?;
        let mut new = 0;
        for (i, chunk) in self.buf.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            let entry = u64::from_le_bytes(b);
            if entry & (PRESENT | SWAPPED) != 0 && self.first_seen[i] == NOT_SEEN {
                self.first_seen[i] = self.samples;
                new += 1;
            }
        }
        self.samples += 1;
        Ok(new)
    }

    pub fn samples(&self) -> u32 {
        self.samples
    }

    /// The manifest of every page seen, in first-touch order.
    pub fn finish(&self) -> Manifest {
        let first_page = self.mapping.file_offset / self.page_size;
        let mut seen: Vec<(u32, u64)> = self
            .first_seen
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != NOT_SEEN)
            .map(|(i, s)| (*s, first_page + i as u64))
            .collect();
        seen.sort_unstable();
        let order: Vec<u64> = seen.into_iter().map(|(_, p)| p).collect();
        Manifest::from_touch_order(self.page_size as u32, self.guest_memory_size, &order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_largest_mapping_of_the_inode() {
        let maps = "\
7f0000000000-7f0000100000 rw-p 00000000 fd:01 1234 /data/memory.img
7f1000000000-7f1020000000 rw-p 00000000 fd:01 1234 /data/memory.img
7f2000000000-7f2000001000 r--p 00000000 fd:01 999 /usr/lib/x.so
";
        let dev = libc::makedev(0xfd, 0x01);
        let m = find_mapping(maps, dev, 1234).unwrap();
        assert_eq!(m.start, 0x7f1000000000);
        assert_eq!(m.end - m.start, 0x20000000);
        assert!(find_mapping(maps, dev, 77).is_none());
        assert!(find_mapping(maps, libc::makedev(8, 1), 1234).is_none());
    }

    #[test]
    fn records_touched_pages_of_own_mapping() {
        use std::os::unix::io::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.img");
        let size = 64 * 4096u64;
        std::fs::write(&path, vec![1u8; size as usize]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a private read-only mapping of a file we own, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let mut rec = PagemapRecorder::new(std::process::id(), &path, size).unwrap();
        rec.sample().unwrap();
        let touch = |page: usize| {
            // SAFETY: inside the mapping.
            unsafe { std::ptr::read_volatile((addr as *const u8).add(page * 4096)) }
        };
        touch(20);
        touch(5);
        rec.sample().unwrap();
        touch(6);
        rec.sample().unwrap();
        let m = rec.finish();
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(addr, size as usize) };
        assert_eq!(m.guest_memory_size, size);
        m.validate().unwrap();
        let pages: Vec<u64> = m
            .runs
            .iter()
            .flat_map(|r| r.offset / 4096..r.end() / 4096)
            .collect();
        // 5 and 20 in the same sample (address order); the kernel may map
        // neighbours already cached (fault-around), so 6 may come with 5.
        let pos = |p| pages.iter().position(|x| *x == p);
        assert!(pos(5).is_some() && pos(20).is_some());
        assert!(pos(5) < pos(20));
        assert!(pos(6).is_some());
        assert!(m
            .ranges
            .iter()
            .any(|r| r.offset <= 5 * 4096 && r.end() >= 7 * 4096));
    }
}
