//! What a new manager does with the state a previous server left.
//!
//! A server stopped cleanly paused every sandbox, so its rows are `paused`
//! or `dead` and this finds nothing to do. After a crash or `kill -9`:
//! - QEMU processes of the old server live on (they run in their own process
//!   group). A VMM cannot be re-attached (its QMP client and network slot
//!   died with the server), so every QEMU process whose command line names a
//!   directory under our `sandboxes/` is killed: none can be ours yet, since
//!   the data directory's lock is held.
//! - Each row is settled against its paused snapshot in the repository
//!   (`sandbox:<id>`, see [`crate::paused`]), which a pause publishes
//!   before writing the row and a resume deletes after writing it:
//!
//!   | row       | paused snapshot        | what happened           | becomes |
//!   |-----------|------------------------|-------------------------|---------|
//!   | `running` | complete               | pause before its row    | `paused` |
//!   | `running` | its disk taken         | resume before its delete| `dead` (snapshot deleted) |
//!   | `running` | none                   | crash while running     | `dead`: memory lost, disk kept |
//!   | `paused`  | complete               | (a clean pause)         | `paused` |
//!   | `paused`  | disk taken, disk here  | resume before its row   | `paused` (disk given back) |
//!   | `paused`  | none, or disk lost     | files lost              | `dead`, saying what is missing |
//!
//!   A disk link a pause had not yet unlinked, and a state file a crashed
//!   pause left, are removed.
//! - A directory without a row (a VMM the pool had prepared, or a create
//!   that crashed before its row was written) is removed, and so is a
//!   paused snapshot whose sandbox has no row (a kill that crashed).

use std::collections::HashSet;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use siesta_snapshot::record::DISK;
use siesta_snapshot::Repository;

use crate::error::{Error, IoContext, Result};
use crate::layout::Layout;
use crate::paused::{self, Saved};
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
    remove_abandoned_builds(&layout.templates());
    remove_abandoned_recordings(&layout.home().join("run"));
    let repo = Repository::open(layout.repo())?;
    let mut records = store.all()?;
    for rec in &mut records {
        let dir = layout.sandbox_dir(&rec.id);
        let changed = settle(rec, &dir, &repo).unwrap_or_else(|e| {
            // One sandbox's files must not keep the server from starting:
            // it is reported, and its files stay until it is killed.
            rec.state = SandboxState::Dead;
            rec.dead_reason = Some(format!("could not be recovered: {e}"));
            true
        });
        if changed {
            tracing::warn!(sandbox = %rec.id, state = %rec.state, reason = ?rec.dead_reason, "recovered");
            store.put(rec)?;
        }
    }
    let known: HashSet<&str> = records.iter().map(|r| r.id.as_str()).collect();
    remove_orphans(&layout.sandboxes(), &known);
    remove_orphan_pauses(&repo, &known);
    repair_repository(&repo);
    Ok(records)
}

/// Removes what a publish or delete that a crash cut short left in the
/// repository (staging directories, locks of dead writers, unreferenced
/// blobs), as `siesta repo check --repair` would. It waits briefly for
/// writers of other processes (a `siesta template build` beside the
/// server) and skips the repair, saying so, if they do not finish.
fn repair_repository(repo: &Repository) {
    match repo.repair(Duration::from_secs(2)) {
        Ok(report) if !report.issues.is_empty() => {
            for issue in report.issues.iter().filter(|i| i.kind.repairable()) {
                tracing::warn!(kind = ?issue.kind, path = %issue.path.display(), "repository: removed what a crash left");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(
            "repository repair skipped at start (`siesta repo check --repair` does it): {e}"
        ),
    }
}

/// Gives a row the state it must have now that no VM runs for it, finishing
/// or undoing the pause or resume a crash interrupted; true if that changed
/// the row.
fn settle(rec: &mut SandboxRecord, dir: &Path, repo: &Repository) -> Result<bool> {
    let before = (rec.state, rec.vmm_pid, rec.agent_addr);
    let _ = std::fs::remove_dir_all(dir.join("run"));
    let _ = std::fs::remove_file(dir.join(STATE_FILE));
    let disk = dir.join(DISK_FILE);
    let dead = |rec: &mut SandboxRecord, reason: String| {
        rec.state = SandboxState::Dead;
        rec.dead_reason = Some(reason);
    };
    match (rec.state, Saved::inspect(repo, &rec.id)?) {
        (SandboxState::Dead, _) => {}
        (_, Saved::Complete(snap)) => {
            paused::drop_link(repo, &snap, &disk)?;
            rec.state = SandboxState::Paused;
        }
        (SandboxState::Running, Saved::DiskTaken(snap)) => {
            repo.delete(&snap.id)?;
            dead(rec, LOST_MEMORY.into());
        }
        (SandboxState::Running, Saved::Missing) => dead(rec, LOST_MEMORY.into()),
        (SandboxState::Paused, Saved::DiskTaken(snap)) if disk.is_file() => {
            repo.return_file(&snap.id, DISK, &disk)?;
        }
        (SandboxState::Paused, Saved::DiskTaken(_)) => {
            let reason = format!(
                "its disk is missing from its paused snapshot ({})",
                paused::alias(&rec.id)
            );
            dead(rec, reason);
        }
        (SandboxState::Paused, Saved::Missing) => {
            let reason = format!(
                "its paused snapshot ({}) is missing from the repository",
                paused::alias(&rec.id)
            );
            dead(rec, reason);
        }
    }
    rec.agent_addr = None;
    rec.vmm_pid = None;
    Ok(before != (rec.state, rec.vmm_pid, rec.agent_addr))
}

/// Kills the build VMs of template builds whose process is gone (a server
/// killed mid-build) and removes their directories; a build still running
/// (a `siesta template build` beside the server) is left alone.
fn remove_abandoned_builds(templates: &Path) {
    for work in siesta_template::work_dir::abandoned(templates) {
        tracing::warn!(dir = %work.display(), "removing a template build a previous process left");
        kill_leftover_vmms(&work);
        if let Err(e) = std::fs::remove_dir_all(&work) {
            tracing::warn!(dir = %work.display(), "removing leftover: {e}");
        }
    }
}

/// Kills the VMs of startup-manifest recordings whose process is gone (a
/// server killed while it recorded one) and removes their directories; a
/// recording still running (a `siesta template build` beside the server)
/// is left alone.
fn remove_abandoned_recordings(run: &Path) {
    let prefix = siesta_template::manifest::RECORDING_PREFIX;
    for work in siesta_template::work_dir::abandoned_with_prefix(run, prefix) {
        tracing::warn!(dir = %work.display(), "removing a manifest recording a previous process left");
        kill_leftover_vmms(&work);
        if let Err(e) = std::fs::remove_dir_all(&work) {
            tracing::warn!(dir = %work.display(), "removing leftover: {e}");
        }
    }
}

/// Deletes paused snapshots whose sandbox has no row.
fn remove_orphan_pauses(repo: &Repository, known: &HashSet<&str>) {
    let Ok(aliases) = repo.aliases() else {
        return;
    };
    for (alias, id) in aliases {
        let Some(sandbox) = alias.strip_prefix("sandbox:") else {
            continue;
        };
        if known.contains(sandbox) || paused_by_another_manager(repo, &alias) {
            continue;
        }
        tracing::info!(sandbox, snapshot = %id, "deleting a paused snapshot without a record");
        if let Err(e) = repo.delete(&id) {
            tracing::warn!(snapshot = %id, "deleting orphan pause: {e}");
        }
    }
}

/// A pause an ephemeral manager (a bench) published: it has no row here,
/// and it is not this server's to delete.
fn paused_by_another_manager(repo: &Repository, alias: &str) -> bool {
    repo.resolve(alias)
        .ok()
        .and_then(|r| serde_json::from_value::<paused::PausedMeta>(r.meta).ok())
        .is_some_and(|m| m.ephemeral)
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
/// `sandboxes` (or another directory), and waits until each is gone (a VMM still alive holds its
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
            egress: siesta_net::EgressPolicy::internet(false),
            traffic_token: None,
            cpu_count: 1,
            memory_mb: 512,
            disk_size_mb: 1024,
            lifecycle: Default::default(),
            agent_addr: Some("10.0.0.1:49983".parse().unwrap()),
            vmm_pid: Some(1),
            timings: None,
            dead_reason: None,
            guest_defaults: Default::default(),
            volume_mounts: Vec::new(),
            paused_disk_only: false,
        }
    }

    /// Publishes what a pause of `s1` publishes: state and disk linked in.
    fn pause_s1(repo: &Repository, dir: &Path) -> siesta_snapshot::SnapshotRecord {
        pause_of(repo, dir, "s1", serde_json::Value::Null)
    }

    fn pause_of(
        repo: &Repository,
        dir: &Path,
        id: &str,
        meta: serde_json::Value,
    ) -> siesta_snapshot::SnapshotRecord {
        use siesta_snapshot::repo::{new_id, Placement, PublishFile, PublishRequest};
        let state = dir.join(STATE_FILE);
        std::fs::write(&state, b"state").unwrap();
        let file = |role: &str, source: PathBuf| PublishFile {
            role: role.into(),
            source,
            placement: Placement::LocalLink,
            sha256: None,
        };
        let snap = repo
            .publish(PublishRequest {
                id: new_id("paused"),
                kind: siesta_snapshot::SnapshotKind::Paused,
                parent: None,
                guest_memory_size: 4096,
                files: vec![
                    file("state", state.clone()),
                    file(DISK, dir.join(DISK_FILE)),
                ],
                existing: vec![],
                aliases: vec![paused::alias(id)],
                meta,
            })
            .unwrap();
        std::fs::remove_file(state).unwrap();
        snap
    }

    #[test]
    fn rows_settle_by_their_paused_snapshot() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::open(tmp.path().join("repo")).unwrap();
        let d = &tmp.path().join("s1");
        std::fs::create_dir_all(d.join("run")).unwrap();
        let disk = d.join(DISK_FILE);
        std::fs::write(&disk, b"disk").unwrap();

        // Running without a paused snapshot: memory lost, disk kept.
        let mut r = record(SandboxState::Running);
        assert!(settle(&mut r, d, &repo).unwrap());
        assert_eq!(r.state, SandboxState::Dead);
        assert!(r.dead_reason.as_deref().unwrap().contains("kill -9"));
        assert!(r.vmm_pid.is_none() && r.agent_addr.is_none());
        assert!(!d.join("run").exists() && disk.exists());

        // Paused without one: dead, saying what is missing.
        let mut r = record(SandboxState::Paused);
        settle(&mut r, d, &repo).unwrap();
        assert_eq!(r.state, SandboxState::Dead);
        assert!(r.dead_reason.unwrap().contains("sandbox:s1"));

        // Running with a published pause (crash before the row, and before
        // the disk link was dropped): paused, the stray link and state gone.
        let snap = pause_s1(&repo, d);
        std::fs::write(d.join(STATE_FILE), b"partial").unwrap();
        let mut r = record(SandboxState::Running);
        settle(&mut r, d, &repo).unwrap();
        assert_eq!(r.state, SandboxState::Paused);
        assert!(!disk.exists() && !d.join(STATE_FILE).exists());
        let held = repo.file_path(&snap, DISK).unwrap();
        assert_eq!(std::fs::read(&held).unwrap(), b"disk");

        // Paused, its resume crashed after taking the disk: given back.
        repo.take_file(&snap.id, DISK, &disk).unwrap();
        let mut r = record(SandboxState::Paused);
        assert!(settle(&mut r, d, &repo).unwrap());
        assert_eq!(r.state, SandboxState::Paused);
        assert!(held.exists() && !disk.exists());

        // Running, its resume had committed the row: the spent pause goes.
        repo.take_file(&snap.id, DISK, &disk).unwrap();
        let mut r = record(SandboxState::Running);
        settle(&mut r, d, &repo).unwrap();
        assert_eq!(r.state, SandboxState::Dead);
        assert!(repo.get(&snap.id).is_err() && disk.exists());
        assert!(repo.check().unwrap().is_clean());
    }

    #[test]
    fn pauses_without_a_row_are_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::open(tmp.path().join("repo")).unwrap();
        let d = tmp.path().join("s1");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(DISK_FILE), b"disk").unwrap();
        let snap = pause_s1(&repo, &d);
        remove_orphan_pauses(&repo, &HashSet::from(["s1"]));
        assert!(repo.get(&snap.id).is_ok());
        remove_orphan_pauses(&repo, &HashSet::new());
        assert!(repo.get(&snap.id).is_err());
    }

    #[test]
    fn what_a_bench_runs_is_not_a_servers_leftover() {
        // A bench's pause has no row in the server's database, and is not
        // the server's to delete.
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::open(tmp.path().join("repo")).unwrap();
        let d = tmp.path().join("b1");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(DISK_FILE), b"disk").unwrap();
        let meta = serde_json::json!({"sandbox": "b1", "template": "base", "ephemeral": true});
        let snap = pause_of(&repo, &d, "b1", meta);
        remove_orphan_pauses(&repo, &HashSet::new());
        assert!(repo.get(&snap.id).is_ok());

        // Its sandboxes live outside the server's `sandboxes/`: neither
        // their VMMs nor their directories are the server's.
        let home = tmp.path().join("home");
        let mut config = crate::NodeConfig::new(&home);
        let server = config.layout();
        config.sandbox_root = Some(home.join("ephemeral/n-42"));
        let bench = config.layout();
        let vm_dir = bench.sandbox_dir("b1");
        assert!(!vm_dir.starts_with(server.sandboxes()));
        let cmdline = format!("qemu-system-x86_64\0file={}/disk.qcow2\0", vm_dir.display());
        let mut prefix = server.sandboxes().into_os_string().into_encoded_bytes();
        prefix.push(b'/');
        assert!(!is_our_vmm(cmdline.as_bytes(), &prefix));
        std::fs::create_dir_all(&vm_dir).unwrap();
        remove_orphans(&server.sandboxes(), &HashSet::new());
        assert!(vm_dir.exists());
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
