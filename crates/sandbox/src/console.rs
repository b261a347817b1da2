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
            .map_err(|e| {
                crate::error::Error::Invalid(format!("reading the console stopped: {e}"))
            })?
    }
}

fn tail_lines(path: &std::path::Path) -> Result<Vec<String>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).ctx("opening the console log", path),
    };
    let len = file.metadata().ctx("reading the console log", path)?.len();
    let from = len.saturating_sub(MAX_CONSOLE_BYTES);
    file.seek(SeekFrom::Start(from))
        .ctx("reading the console log", path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .ctx("reading the console log", path)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect();
    if from > 0 && !lines.is_empty() {
        lines.remove(0); // cut in the middle
    }
    Ok(lines)
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
}
