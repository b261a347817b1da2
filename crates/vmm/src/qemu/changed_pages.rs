//! Which pages of a VM's private RAM mapping the guest wrote, and their
//! contents, read from the stopped VMM process through `/proc`.
//!
//! Guest RAM is a `MAP_PRIVATE` mapping of the template's memory file. A page
//! the guest only read is the file's page-cache page; a page it wrote is a
//! private anonymous copy. `/proc/<pid>/pagemap` tells them apart per page:
//! present and not file-backed (bit 63 set, bit 61 clear), or swapped out
//! (bit 62). That set contains every page whose content differs from the
//! file; the spike found about 1% more (pages written back to their old
//! content), which costs bytes, not correctness. The pages are then read
//! with `process_vm_readv`. Both need the VMM stopped and ptrace rights over
//! it (root, or the VMM's parent with `CAP_SYS_PTRACE`).

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

use super::ram_frame::PAGE_SIZE;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const FILE_OR_SHARED: u64 = 1 << 61;
/// Pagemap entries read per `pread` (512 KiB).
const ENTRIES_PER_READ: usize = 64 * 1024;

/// One VMA of the mapping: `len` bytes at `addr`, from byte `file_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    addr: u64,
    len: u64,
    file_offset: u64,
}

/// Where a file is mapped in a process.
#[derive(Debug, Clone)]
pub struct RamMapping {
    pid: u32,
    regions: Vec<Region>,
}

/// Consecutive changed pages: `pages` pages from byte `offset` of the file,
/// at `addr` in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub offset: u64,
    pub addr: u64,
    pub pages: u64,
}

impl RamMapping {
    /// Finds where process `pid` maps bytes `0..len` of `file`, matched by
    /// device and inode (the name in `/proc` may differ by symlinks).
    pub fn find(pid: u32, file: &Path, len: u64) -> io::Result<Self> {
        let meta = std::fs::metadata(file)?;
        let maps_path = format!("/proc/{pid}/maps");
        let maps = std::fs::read_to_string(&maps_path)?;
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        let mut regions: Vec<Region> = maps
            .lines()
            .filter_map(|line| parse_maps_line(line, dev, meta.ino()))
            .collect();
        regions.sort_by_key(|r| r.file_offset);
        let covered = regions
            .iter()
            .try_fold(0u64, |at, r| (r.file_offset == at).then_some(at + r.len));
        if covered != Some(len) {
            return Err(io::Error::other(format!(
                "process {pid} does not map bytes 0..{len} of {} in one piece ({} mappings found in {maps_path})",
                file.display(),
                regions.len()
            )));
        }
        Ok(RamMapping { pid, regions })
    }

    /// The changed pages, in file order, coalesced into runs.
    pub fn changed(&self) -> io::Result<Vec<Run>> {
        let path = format!("/proc/{}/pagemap", self.pid);
        let pagemap = File::open(&path)?;
        let mut runs: Vec<Run> = Vec::new();
        let mut buf = vec![0u8; ENTRIES_PER_READ * 8];
        for r in &self.regions {
            let pages = r.len / PAGE_SIZE as u64;
            let mut done = 0u64;
            while done < pages {
                let n = (pages - done).min(ENTRIES_PER_READ as u64) as usize;
                let first_vpage = r.addr / PAGE_SIZE as u64 + done;
                pagemap.read_exact_at(&mut buf[..n * 8], first_vpage * 8)?;
                for (i, entry) in buf[..n * 8].chunks_exact(8).enumerate() {
                    let mut e = [0u8; 8];
                    e.copy_from_slice(entry);
                    if is_changed(u64::from_ne_bytes(e)) {
                        let page = done + i as u64;
                        push_page(&mut runs, r, page);
                    }
                }
                done += n as u64;
            }
        }
        Ok(runs)
    }

    /// Reads the pages of `runs` (in order) into `slots`, which must hold
    /// exactly as many bytes, in one `process_vm_readv`: the pages go
    /// straight to where the caller wants them, with no buffer between.
    pub fn read_runs(&self, runs: &[Run], slots: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        let remote: Vec<RemoteIoVec> = runs
            .iter()
            .map(|r| RemoteIoVec {
                base: r.addr as usize,
                len: r.pages as usize * PAGE_SIZE,
            })
            .collect();
        let want: usize = remote.iter().map(|r| r.len).sum();
        let room: usize = slots.iter().map(|s| s.len()).sum();
        if room != want {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{want} bytes of pages to read into {room} bytes of slots"),
            ));
        }
        let n = process_vm_readv(Pid::from_raw(self.pid as i32), slots, &remote)
            .map_err(io::Error::from)?;
        // The kernel stops short only where a remote page cannot be read:
        // the mapping changed under a VMM that should be stopped.
        if n != want {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "process {} memory at {:#x}: read {n} of {want} bytes",
                    self.pid,
                    runs.first().map_or(0, |r| r.addr)
                ),
            ));
        }
        Ok(())
    }
}

/// Present as a private (copy-on-write) page, or swapped out.
fn is_changed(entry: u64) -> bool {
    (entry & PRESENT != 0 && entry & FILE_OR_SHARED == 0) || entry & SWAPPED != 0
}

fn push_page(runs: &mut Vec<Run>, region: &Region, page: u64) {
    let offset = region.file_offset + page * PAGE_SIZE as u64;
    let addr = region.addr + page * PAGE_SIZE as u64;
    if let Some(last) = runs.last_mut() {
        if last.addr + last.pages * PAGE_SIZE as u64 == addr
            && last.offset + last.pages * PAGE_SIZE as u64 == offset
        {
            last.pages += 1;
            return;
        }
    }
    runs.push(Run {
        offset,
        addr,
        pages: 1,
    });
}

/// One line of `/proc/<pid>/maps` (`start-end perms offset maj:min inode
/// path`) if it maps the file with device `dev` and inode `ino`.
fn parse_maps_line(line: &str, dev: (u32, u32), ino: u64) -> Option<Region> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let _perms = fields.next()?;
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode: u64 = fields.next()?.parse().ok()?;
    let same_dev = u32::from_str_radix(major, 16).ok()? == dev.0
        && u32::from_str_radix(minor, 16).ok()? == dev.1;
    if inode != ino || !same_dev {
        return None;
    }
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    Some(Region {
        addr: start,
        len: end.checked_sub(start)?,
        file_offset: offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_maps_line_of_the_file() {
        let line = "7f0000000000-7f0020000000 rw-p 00000000 fe:01 1234   /var/lib/siesta/repo/blobs/ab/mem (deleted)";
        let r = parse_maps_line(line, (0xfe, 1), 1234).unwrap();
        assert_eq!(r.addr, 0x7f00_0000_0000);
        assert_eq!(r.len, 512 << 20);
        assert_eq!(r.file_offset, 0);
        assert!(
            parse_maps_line(line, (0xfe, 1), 1235).is_none(),
            "other inode"
        );
        assert!(
            parse_maps_line(line, (8, 1), 1234).is_none(),
            "other device"
        );
        assert!(parse_maps_line("garbage", (0, 0), 0).is_none());
    }

    #[test]
    fn classifies_pagemap_entries() {
        assert!(is_changed(PRESENT), "private copy");
        assert!(!is_changed(PRESENT | FILE_OR_SHARED), "page cache");
        assert!(is_changed(SWAPPED), "swapped private page");
        assert!(!is_changed(0), "never touched");
    }

    #[test]
    fn coalesces_adjacent_pages_into_runs() {
        let region = Region {
            addr: 0x10000,
            len: 16 * PAGE_SIZE as u64,
            file_offset: 0,
        };
        let mut runs = Vec::new();
        for page in [0, 1, 2, 5, 6, 9] {
            push_page(&mut runs, &region, page);
        }
        let shape: Vec<(u64, u64)> = runs.iter().map(|r| (r.offset / 4096, r.pages)).collect();
        assert_eq!(shape, [(0, 3), (5, 2), (9, 1)]);
        assert_eq!(runs[1].addr, 0x10000 + 5 * 4096);
    }

    /// A real private mapping of a file in this process: only the page
    /// written is changed, and its bytes read back through the same calls.
    #[test]
    fn finds_the_pages_a_process_wrote_in_its_private_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mem.img");
        std::fs::write(&path, vec![1u8; 8 * PAGE_SIZE]).unwrap();
        let file = File::open(&path).unwrap();
        let len = 8 * PAGE_SIZE;
        // SAFETY: a fresh private mapping of a file we own, unmapped below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: inside the mapping just made.
        let mem = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
        let _read = mem[0]; // page 0 read only: still the file's page
        mem[3 * PAGE_SIZE + 5] = 9; // page 3 written: a private copy
        let map = RamMapping::find(std::process::id(), &path, len as u64).unwrap();
        let runs = map.changed().unwrap();
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!((runs[0].offset, runs[0].pages), (3 * PAGE_SIZE as u64, 1));
        let mut page = vec![0u8; PAGE_SIZE];
        map.read_runs(&runs, &mut [IoSliceMut::new(&mut page)])
            .unwrap();
        assert_eq!(page[5], 9);
        assert_eq!(page[6], 1);
        let mut small = vec![0u8; 100];
        let e = map
            .read_runs(&runs, &mut [IoSliceMut::new(&mut small)])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(ptr, len) };
        let e = RamMapping::find(std::process::id(), &path, len as u64).unwrap_err();
        assert!(e.to_string().contains("does not map"), "{e}");
    }
}
