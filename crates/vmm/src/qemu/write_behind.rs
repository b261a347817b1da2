//! Starting a state file's writeback while it is being written.
//!
//! A save is only done once its state file is fsynced. Written plainly, the
//! kernel holds the whole file as dirty page cache and the fsync then waits
//! for all of it to reach the disk, after the last byte is written. Asking
//! for writeback of each window as soon as it is written
//! (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which queues the I/O and does
//! not wait for it) lets the disk work while the pages are still being read
//! from the VMM, so the final fsync waits for the last window or two only.
//! The fsync stays what makes the file durable: the hint changes when the
//! disk writes, not whether the file is synced.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;

use crate::StateWrite;

/// Bytes written between two writeback requests (8 MiB): large enough that
/// the requests cost nothing next to the copy, small enough that the disk
/// starts early and the fsync is left little.
pub const WINDOW: u64 = 8 << 20;

/// A writer to `file`, from its offset 0, that starts the writeback of
/// each window it completes (with [`StateWrite::Behind`]).
pub struct WriteBehind<'f> {
    file: &'f File,
    how: StateWrite,
    written: u64,
    started: u64,
    requests: u64,
}

impl<'f> WriteBehind<'f> {
    pub fn new(file: &'f File, how: StateWrite) -> Self {
        WriteBehind {
            file,
            how,
            written: 0,
            started: 0,
            requests: 0,
        }
    }

    /// How many writeback requests were made.
    #[cfg(test)]
    pub fn requests(&self) -> u64 {
        self.requests
    }

    fn start_writeback(&mut self) {
        let len = self.written - self.started;
        if self.how == StateWrite::AtEnd || len < WINDOW {
            return;
        }
        // SAFETY: an FFI call on a descriptor `self.file` keeps open; it
        // reads no memory of ours.
        let rc = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                self.started as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        // A refused hint is not an error: the fsync that ends every save
        // writes (and reports on) whatever was not started here.
        if rc == 0 {
            self.requests += 1;
        }
        self.started = self.written;
    }
}

impl Write for WriteBehind<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = (&*self.file).write(buf)?;
        self.written += n as u64;
        self.start_writeback();
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self.file).flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_mib(how: StateWrite, mib: usize) -> (Vec<u8>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let file = File::create(&path).unwrap();
        let mut w = WriteBehind::new(&file, how);
        let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        for _ in 0..mib {
            w.write_all(&chunk).unwrap();
        }
        let requests = w.requests();
        file.sync_all().unwrap();
        (std::fs::read(&path).unwrap(), requests)
    }

    #[test]
    fn writes_through_and_starts_one_writeback_per_window() {
        let (bytes, requests) = write_mib(StateWrite::Behind, 20);
        assert_eq!(bytes.len(), 20 << 20);
        assert!(bytes.chunks(1 << 20).all(|c| c[250] == 250 && c[251] == 0));
        // 20 MiB: two full 8 MiB windows; the last 4 MiB is the fsync's.
        assert_eq!(requests, 2);
    }

    #[test]
    fn at_end_starts_no_writeback() {
        let (bytes, requests) = write_mib(StateWrite::AtEnd, 9);
        assert_eq!(bytes.len(), 9 << 20);
        assert_eq!(requests, 0);
    }
}
