//! A sandbox's console: what its guest kernel and agent wrote to the serial
//! port since its VM started (E2B's sandbox logs).

use std::io::{Read, Seek, SeekFrom};

use crate::error::{IoContext, Result};
use crate::manager::SandboxManager;

/// At most this much of the end of the console is returned.
pub const MAX_CONSOLE_BYTES: u64 = 1 << 20;

impl SandboxManager {
    /// The last [`MAX_CONSOLE_BYTES`] of the running sandbox's console, as
    /// lines; none for a sandbox that is not running (its VM, and the
    /// console with it, is gone while it is paused).
    pub async fn console_lines(&self, id: &str) -> Result<Vec<String>> {
        let sb = self.lock(id).await?;
        let Some(run) = &sb.running else {
            return Ok(Vec::new());
        };
        let path = run.run_dir.join("serial.log");
        drop(sb);
        tokio::task::spawn_blocking(move || tail_lines(&path))
            .await
            .map_err(|e| crate::error::internal("reading the console", e))?
    }
}

/// The last [`MAX_CONSOLE_BYTES`] of the console as whole lines: the end
/// of `serial.log`, preceded by the kept tail of its last rotation
/// (`serial.log.1`, see `siesta_vmm::qemu::serial_cap`) when the current
/// file is shorter than that.
fn tail_lines(path: &std::path::Path) -> Result<Vec<String>> {
    let current = read_tail(path, MAX_CONSOLE_BYTES)?;
    let room = MAX_CONSOLE_BYTES - current.len() as u64;
    let rotated = siesta_vmm::qemu::serial_cap::rotated_path(path);
    let mut bytes = if room > 0 {
        read_tail(&rotated, room)?
    } else {
        Vec::new()
    };
    bytes.extend_from_slice(&current);
    let cut = bytes.len() as u64 >= MAX_CONSOLE_BYTES;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect();
    if cut && !lines.is_empty() {
        lines.remove(0); // cut in the middle
    }
    Ok(lines)
}

/// The last `max` bytes of `path` (none when it does not exist).
fn read_tail(path: &std::path::Path, max: u64) -> Result<Vec<u8>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).ctx("opening the console log", path),
    };
    let len = file.metadata().ctx("reading the console log", path)?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max)))
        .ctx("reading the console log", path)?;
    let mut bytes = Vec::new();
    file.take(max)
        .read_to_end(&mut bytes)
        .ctx("reading the console log", path)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.log");
        assert!(tail_lines(&path).unwrap().is_empty());
        std::fs::write(&path, "boot\r\nagent ready\n").unwrap();
        assert_eq!(tail_lines(&path).unwrap(), ["boot", "agent ready"]);
        let long = "x".repeat(100) + "\n";
        std::fs::write(&path, long.repeat((MAX_CONSOLE_BYTES / 101 + 10) as usize)).unwrap();
        let lines = tail_lines(&path).unwrap();
        assert!(lines.iter().all(|l| l.len() == 100));
    }

    #[test]
    fn a_rotated_console_reads_on_from_its_kept_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.log");
        let rotated = siesta_vmm::qemu::serial_cap::rotated_path(&path);
        std::fs::write(&rotated, "old 1\nold 2\n").unwrap();
        std::fs::write(&path, "new 1\n").unwrap();
        assert_eq!(tail_lines(&path).unwrap(), ["old 1", "old 2", "new 1"]);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(tail_lines(&path).unwrap(), ["old 1", "old 2"]);
    }
}
