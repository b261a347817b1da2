//! A bound on the guest's serial console log.
//!
//! QEMU appends whatever the guest writes to its UART to `serial.log`, and
//! a guest can write without end (`cat /dev/zero > /dev/ttyS0`), which
//! would fill the node's disk and fail every pause on it. QEMU's file
//! chardev has no size limit, so a task watches the file: once it passes
//! [`SERIAL_LOG_CAP`], its last [`KEPT_TAIL`] bytes move to
//! `serial.log.1` and the file is emptied. QEMU opens the file with
//! `append=on`, so its next write lands at the new end rather than at its
//! old offset (which would leave a sparse file as long as before). On disk
//! a console takes at most the cap, the kept tail, and what the guest
//! writes between two checks.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::task::AbortHandle;

/// Size at which the console log is rotated.
pub const SERIAL_LOG_CAP: u64 = 4 << 20;
/// How much of the log's end is kept in `serial.log.1` at each rotation.
pub const KEPT_TAIL: u64 = 1 << 20;
/// How often the size is checked.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// The file the kept tail of a rotated console goes to.
pub fn rotated_path(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// The watching task of one console log; stops when dropped (with the
/// VM that owns it).
#[derive(Debug)]
pub struct Watch(AbortHandle);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts watching `log` until the returned [`Watch`] is dropped.
pub fn watch(log: PathBuf, cap: u64) -> Watch {
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let path = log.clone();
            let rotated = tokio::task::spawn_blocking(move || rotate_if_over(&path, cap)).await;
            if let Ok(Err(e)) = rotated {
                tracing::warn!(log = %log.display(), error = %e, "console log not rotated");
            }
        }
    });
    Watch(task.abort_handle())
}

/// Moves the last [`KEPT_TAIL`] bytes of `log` to `log.1` and empties
/// `log` when it is longer than `cap`. Returns whether it rotated.
pub fn rotate_if_over(log: &Path, cap: u64) -> std::io::Result<bool> {
    let mut file = match OpenOptions::new().read(true).write(true).open(log) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if len <= cap {
        return Ok(false);
    }
    let tail = read_tail(&mut file, len, KEPT_TAIL.min(cap))?;
    let rotated = rotated_path(log);
    let mut partial = rotated.as_os_str().to_owned();
    partial.push(".part");
    let partial = PathBuf::from(partial);
    File::create(&partial)?.write_all(&tail)?;
    std::fs::rename(&partial, &rotated)?;
    file.set_len(0)?;
    Ok(true)
}

fn read_tail(file: &mut File, len: u64, n: u64) -> std::io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(len.saturating_sub(n)))?;
    let mut tail = Vec::new();
    file.take(n).read_to_end(&mut tail)?;
    Ok(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_past_the_cap_keeps_its_tail_and_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("serial.log");
        assert!(!rotate_if_over(&log, 10).unwrap(), "no log yet");
        // An appending writer, as QEMU with append=on.
        let mut writer = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        writer.write_all(b"0123456789").unwrap();
        assert!(!rotate_if_over(&log, 10).unwrap());
        let big: Vec<u8> = (0..(3 * KEPT_TAIL))
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        writer.write_all(&big).unwrap();
        assert!(rotate_if_over(&log, KEPT_TAIL).unwrap());
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        let kept = std::fs::read(rotated_path(&log)).unwrap();
        assert_eq!(kept, big[big.len() - KEPT_TAIL as usize..]);
        // The writer goes on at the new end, not at its old offset.
        writer.write_all(b"after").unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"after");
    }
}
