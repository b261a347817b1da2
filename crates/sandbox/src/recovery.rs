//! What a new manager does with the state a previous server left.
//!
//! A server stopped cleanly paused every sandbox, so its rows are `paused`
//! or `dead` and this finds nothing to do. After a crash or `kill -9`:
//! - QEMU processes of the old server live on (they run in their own process
//!   group). A VMM cannot be re-attached (its QMP client and network slot
//!   died with the server), so every QEMU process whose command line names a
//!   directory under our `sandboxes/` is killed: none can be ours yet, since
//!   the data directory's lock is held.
//! - A row still `running` whose directory holds `state.bin` was being
//!   paused: the state file is published (fsynced, renamed) before the row
//!   is written and deleted on resume, so it is a complete pause; the row
//!   becomes `paused`. Otherwise its memory is lost: the row becomes `dead`
//!   with the reason, and its disk is kept until it is killed.
//! - A `paused` row missing its saved state or disk becomes `dead`.
//! - A directory without a row (a VMM the pool had prepared, or a create
//!   that crashed before its row was written) is removed.

use std::collections::HashSet;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, IoContext, Result};
use crate::layout::Layout;
use crate::sandbox::{SandboxRecord, SandboxState, DISK_FILE, STATE_FILE};
use crate::store::Store;

pub const LOCK_FILE: &str = "siesta.lock";

const LOST_MEMORY: &str = "the server stopped without pausing it (crash or kill -9): \
     its memory and processes are lost; its disk is kept until it is killed";

/// Takes the data directory's exclusive lock, or says who holds it.
pub(crate) fn lock_home(home: &Path) -> Result<std::fs::File> {
    let path = home.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .ctx("opening data directory lock", &path)?;
    // SAFETY: flock on a descriptor we own; released when `file` closes.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::Invalid(format!(
            "{} is locked: another siesta server uses this data directory",
            path.display()
        )));
    }
    Ok(file)
}

/// Brings every row to a state with no live VM behind it (see the module
/// doc) and returns the records to manage.
pub(crate) fn recover(store: &Store, layout: &Layout) -> Result<Vec<SandboxRecord>> {
    kill_leftover_vmms(&layout.sandboxes());
    let mut records = store.all()?;
    for rec in &mut records {
        let dir = layout.sandbox_dir(&rec.id);
        if settle(rec, &dir) {
            tracing::warn!(sandbox = %rec.id, state = %rec.state, reason = ?rec.dead_reason, "recovered");
            store.put(rec)?;
        }
    }
    let known: HashSet<&str> = records.iter().map(|r| r.id.as_str()).collect();
    remove_orphans(&layout.sandboxes(), &known);
    Ok(records)
}

/// Gives a row the state it must have now that no VM runs for it; true if
/// that changed it.
fn settle(rec: &mut SandboxRecord, dir: &Path) -> bool {
    let before = (rec.state, rec.vmm_pid, rec.agent_addr);
    let _ = std::fs::remove_dir_all(dir.join("run"));
    let _ = std::fs::remove_file(dir.join(format!("{STATE_FILE}.tmp")));
    let has = |f: &str| dir.join(f).is_file();
    match rec.state {
        SandboxState::Running if has(STATE_FILE) && has(DISK_FILE) => {
            rec.state = SandboxState::Paused;
        }
        SandboxState::Running => {
            rec.state = SandboxState::Dead;
            rec.dead_reason = Some(LOST_MEMORY.into());
        }
        SandboxState::Paused if !(has(STATE_FILE) && has(DISK_FILE)) => {
            rec.state = SandboxState::Dead;
            rec.dead_reason = Some(format!(
                "its saved state or disk is missing from {}",
                dir.display()
            ));
        }
        SandboxState::Paused | SandboxState::Dead => {}
    }
    rec.agent_addr = None;
    rec.vmm_pid = None;
    before != (rec.state, rec.vmm_pid, rec.agent_addr)
}

/// Removes sandbox directories that have no row.
fn remove_orphans(sandboxes: &Path, known: &HashSet<&str>) {
    let Ok(dir) = std::fs::read_dir(sandboxes) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if known.contains(name.as_str()) {
            continue;
        }
        let path = entry.path();
        tracing::info!(dir = %path.display(), "removing sandbox directory without a record");
        if let Err(e) = std::fs::remove_dir_all(&path) {
            tracing::warn!(dir = %path.display(), "removing leftover: {e}");
        }
    }
}

/// SIGKILLs every QEMU process whose command line names a path under
/// `sandboxes`, and waits until each is gone (a VMM still alive holds its
/// disk's write lock, which a resume needs).
fn kill_leftover_vmms(sandboxes: &Path) {
    let pids = leftover_vmms(Path::new("/proc"), sandboxes);
    for &pid in &pids {
        tracing::warn!(pid, "killing a VMM left by a previous server");
        // SAFETY: plain syscall; the PID was just checked to be our QEMU.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in pids {
        while is_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// PIDs in `proc` whose program is QEMU and whose arguments name a path
/// inside `sandboxes`.
fn leftover_vmms(proc: &Path, sandboxes: &Path) -> Vec<u32> {
    let mut prefix = sandboxes.as_os_str().as_encoded_bytes().to_vec();
    prefix.push(b'/');
    let Ok(dir) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read(proc.join(pid.to_string()).join("cmdline"))
                .is_ok_and(|c| is_our_vmm(&c, &prefix))
        })
        .collect()
}

fn is_our_vmm(cmdline: &[u8], prefix: &[u8]) -> bool {
    let mut args = cmdline.split(|&b| b == 0);
    let program = args.next().unwrap_or_default();
    let name = program.rsplit(|&b| b == b'/').next().unwrap_or_default();
    name.windows(4).any(|w| w == b"qemu")
        && args.any(|a| a.windows(prefix.len()).any(|w| w == prefix))
}

/// Alive and not a zombie (a zombie holds no files; it waits for its
/// parent, which may be this very process in tests).
fn is_alive(pid: u32) -> bool {
    let stat = PathBuf::from(format!("/proc/{pid}/stat"));
    match std::fs::read_to_string(stat) {
        // The state follows the parenthesised command name.
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    #[test]
    fn only_qemu_naming_our_sandboxes_is_ours() {
        let p = b"/var/lib/siesta/sandboxes/";
        let ours = b"/usr/bin/qemu-system-x86_64\0-name\0guest=x\0-chardev\0socket,path=/var/lib/siesta/sandboxes/abc/run/qmp.sock\0";
        assert!(is_our_vmm(ours, p));
        let other_home = b"/usr/bin/qemu-system-x86_64\0path=/tmp/other/sandboxes/abc/run\0";
        assert!(!is_our_vmm(other_home, p));
        let not_qemu = b"/bin/sleep\0/var/lib/siesta/sandboxes/abc\0";
        assert!(!is_our_vmm(not_qemu, p));
        assert!(!is_our_vmm(b"", p));
    }

    #[test]
    fn finds_fake_leftovers_in_a_proc_tree() {
        let proc = tempfile::tempdir().unwrap();
        let put = |pid: &str, cmd: &[u8]| {
            std::fs::create_dir_all(proc.path().join(pid)).unwrap();
            std::fs::write(proc.path().join(pid).join("cmdline"), cmd).unwrap();
        };
        put(
            "10",
            b"qemu-system-x86_64\0file=/h/sandboxes/a/disk.qcow2\0",
        );
        put(
            "11",
            b"qemu-system-x86_64\0file=/h/sandboxes2/a/disk.qcow2\0",
        );
        put("12", b"bash\0/h/sandboxes/a\0");
        put("self", b"qemu\0/h/sandboxes/a\0");
        assert_eq!(leftover_vmms(proc.path(), Path::new("/h/sandboxes")), [10]);
    }

    fn record(state: SandboxState) -> SandboxRecord {
        let now = Utc::now();
        SandboxRecord {
            id: "s1".into(),
            template: "base".into(),
            state,
            created_at: now,
            started_at: now,
            end_at: now,
            access_token: "t".into(),
            env_vars: Default::default(),
            metadata: Default::default(),
            allow_internet: false,
            cpu_count: 1,
            memory_mb: 512,
            disk_size_mb: 1024,
            lifecycle: Default::default(),
            agent_addr: Some("10.0.0.1:49983".parse().unwrap()),
            vmm_pid: Some(1),
            timings: None,
            dead_reason: None,
        }
    }

    #[test]
    fn rows_settle_by_the_files_beside_them() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(DISK_FILE), b"disk").unwrap();
        std::fs::create_dir_all(d.join("run")).unwrap();

        // Running without a saved state: memory lost.
        let mut r = record(SandboxState::Running);
        settle(&mut r, d);
        assert_eq!(r.state, SandboxState::Dead);
        assert!(r.dead_reason.as_deref().unwrap().contains("kill -9"));
        assert!(r.vmm_pid.is_none() && r.agent_addr.is_none());
        assert!(!d.join("run").exists());

        // Paused without a saved state: dead, saying what is missing.
        let mut r = record(SandboxState::Paused);
        settle(&mut r, d);
        assert_eq!(r.state, SandboxState::Dead);

        // Running with a published state file: the pause had completed.
        std::fs::write(d.join(STATE_FILE), b"state").unwrap();
        std::fs::write(d.join("state.bin.tmp"), b"partial").unwrap();
        let mut r = record(SandboxState::Running);
        settle(&mut r, d);
        assert_eq!(r.state, SandboxState::Paused);
        assert!(!d.join("state.bin.tmp").exists());

        let mut r = record(SandboxState::Paused);
        settle(&mut r, d);
        assert_eq!(r.state, SandboxState::Paused);
    }

    #[test]
    fn the_home_lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_home(dir.path()).unwrap();
        assert!(matches!(lock_home(dir.path()), Err(Error::Invalid(_))));
        drop(held);
        lock_home(dir.path()).unwrap();
    }
}
