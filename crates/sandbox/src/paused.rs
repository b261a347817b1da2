//! Paused sandboxes as repository snapshots.
//!
//! A pause publishes a snapshot of kind `paused`, aliased `sandbox:<id>`,
//! holding the sandbox's device state and RAM (`state.bin`) and its disk
//! overlay (`disk.qcow2`), both hard-linked in and then unlinked from the
//! sandbox directory, and, by reference, its template's shared memory blob.
//! The overlay's backing file is the template's disk blob, so nothing of the
//! template is copied.
//!
//! A paused snapshot is consumed by its resume: the disk is taken back into
//! the sandbox directory (a rename), the VM restored from the state, and the
//! snapshot deleted once the row says running. A failed resume gives the
//! disk back, so nothing is lost. After a crash, [`Saved::inspect`] tells
//! recovery which of these steps was interrupted.
//!
//! The manager's `pause`, `resume` and `connect` lock the sandbox and come
//! here ([`SandboxManager::pause_locked`], [`SandboxManager::resume_locked`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use siesta_snapshot::record::{DISK, MEMORY, STATE};
use siesta_snapshot::repo::{new_id, Placement, PublishFile, PublishRequest};
use siesta_snapshot::{RepoError, Repository, SnapshotKind, SnapshotRecord};

use crate::blocking;
use crate::error::{internal, Error, IoContext, Result};
use crate::lifecycle::deadline;
use crate::manager::{wrong_state, SandboxManager};
use crate::memory_save::{self, SaveMemory, SaveReport};
use crate::resume::{self, SavedState};
use crate::running::{finish_stopping, running, set_running, stop_in_background, stop_running};
use crate::sandbox::{Sandbox, SandboxState};
use siesta_template::Template;

/// What is kept with a paused snapshot (the record's `meta`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PausedMeta {
    pub sandbox: String,
    pub template: String,
    /// Paused by a manager that is not the server (a bench): a server's
    /// recovery leaves it alone, as it has no row for it.
    #[serde(default)]
    pub ephemeral: bool,
}

/// What a pause keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Memory, devices and disk: every process goes on after the resume.
    Memory(SaveMemory),
    /// The disk only (E2B's filesystem-only pause): the guest's file
    /// systems are synced first, and the resume is a cold boot.
    DiskOnly,
}

/// The alias of sandbox `id`'s paused snapshot.
pub fn alias(id: &str) -> String {
    format!("sandbox:{id}")
}

/// Publishes the pause of sandbox `id`: `state` (none for a disk-only
/// pause) and `disk` are linked in (not moved: a failed publication must
/// leave them whole). On error the repository holds nothing of it and both
/// files are where they were. On success `state`'s own name is unlinked;
/// the caller unlinks `disk` once the pause is committed.
pub(crate) fn publish(
    repo: &Repository,
    template: &Template,
    id: &str,
    state: Option<(&Path, Option<String>)>,
    disk: (&Path, String),
    ephemeral: bool,
) -> Result<SnapshotRecord> {
    let (disk, disk_sha256) = disk;
    let meta = PausedMeta {
        sandbox: id.to_string(),
        template: template.record.name.clone(),
        ephemeral,
    };
    let file = |role: &str, source: &Path, placement, sha256| PublishFile {
        role: role.to_string(),
        source: source.to_path_buf(),
        placement,
        sha256,
    };
    // The disk's digest too: a damaged overlay would boot with wrong files.
    let mut files = vec![file(DISK, disk, Placement::LocalLink, Some(disk_sha256))];
    if let Some((state, state_sha256)) = &state {
        // The state's digest goes into the record: QEMU would load damaged
        // pages without noticing, so every resume checks it first. A
        // changed-pages save hashed the file as it wrote it.
        let state_sha = match state_sha256 {
            Some(sha) => sha.clone(),
            None => siesta_snapshot::repo::sha256_file(state)?,
        };
        files.insert(0, file(STATE, state, Placement::LocalLink, Some(state_sha)));
    }
    let (parent, memory) = template.shared_memory().unzip();
    let record = repo.publish(PublishRequest {
        id: new_id("paused"),
        kind: SnapshotKind::Paused,
        parent,
        guest_memory_size: template.record.memory.size,
        files,
        existing: memory
            .map(|m| (MEMORY.to_string(), m))
            .into_iter()
            .collect(),
        aliases: vec![alias(id)],
        meta: serde_json::to_value(&meta)
            .map_err(|e| crate::error::internal("encoding a pause's record", e))?,
    })?;
    if let Some((state, _)) = state {
        let _ = std::fs::remove_file(state);
    }
    Ok(record)
}

/// Where sandbox `id`'s paused snapshot stands.
#[derive(Debug)]
pub(crate) enum Saved {
    /// Published with every file: a complete pause.
    Complete(SnapshotRecord),
    /// Its disk was taken by a resume that had not finished.
    DiskTaken(SnapshotRecord),
    /// No paused snapshot.
    Missing,
}

impl Saved {
    pub(crate) fn inspect(repo: &Repository, id: &str) -> Result<Self> {
        let record = match repo.resolve(&alias(id)) {
            Ok(r) if r.kind == SnapshotKind::Paused => r,
            Ok(_) | Err(RepoError::NotFound(_)) => return Ok(Saved::Missing),
            Err(e) => return Err(e.into()),
        };
        if repo.file_path(&record, DISK)?.is_file() {
            Ok(Saved::Complete(record))
        } else {
            Ok(Saved::DiskTaken(record))
        }
    }
}

/// Unlinks `disk` from a sandbox directory if it is the very file the
/// paused snapshot holds (a pause interrupted before its own unlink).
pub(crate) fn drop_link(repo: &Repository, record: &SnapshotRecord, disk: &Path) -> Result<()> {
    let held = repo.file_path(record, DISK)?;
    let same = |a: &Path, b: &Path| -> bool {
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    };
    if same(disk, &held) {
        std::fs::remove_file(disk).ctx("unlinking a paused sandbox's disk", disk)?;
    }
    Ok(())
}

/// The paused snapshot of sandbox `id`, for its resume: a clear error when
/// there is none.
pub(crate) fn for_resume(repo: &Repository, id: &str) -> Result<SnapshotRecord> {
    match Saved::inspect(repo, id)? {
        Saved::Complete(r) => Ok(r),
        Saved::DiskTaken(r) => Err(Error::CorruptSnapshot {
            path: repo.snapshot_dir(&r.id),
            detail: format!("the disk of paused sandbox {id} is missing"),
        }),
        Saved::Missing => Err(Error::CorruptSnapshot {
            path: repo.root().join("aliases").join(alias(id)),
            detail: format!("paused sandbox {id} has no saved snapshot in the repository"),
        }),
    }
}

impl SandboxManager {
    /// Pauses locked, running sandbox `sb`: vCPUs stopped, state saved,
    /// snapshot published, row committed, VM stopped, in that order. On an
    /// error before the row is committed the VM runs on.
    pub(crate) async fn pause_locked(
        &self,
        sb: &mut Sandbox,
        mode: PauseMode,
    ) -> Result<Option<SaveReport>> {
        let id = sb.record.id.clone();
        let state_path = sb.state_path();
        let disk = sb.disk_path();
        let token = sb.record.access_token.clone();
        let template = self.template_for(sb).await?;
        self.wait_served(&template).await?;
        let repo = self.repo()?;
        let Some(running) = sb.running.as_mut() else {
            return Err(wrong_state(sb, "running"));
        };
        let vmm_err = |source| Error::vmm(id.clone(), source);
        let t0 = std::time::Instant::now();
        if mode == PauseMode::DiskOnly {
            sync_guest(&id, running.agent_addr, token).await?;
        }
        // Stopping the vCPUs also drains and flushes the disk.
        running.vm.pause().await.map_err(vmm_err)?;
        // Hashed while the memory is saved, so it costs the pause nothing.
        let disk_digest = DiskDigest::start(disk.clone());
        let publish_with = |state: Option<(std::path::PathBuf, Option<String>)>| {
            // Hashing, fsyncs and renames: off the async threads.
            let (repo, template, id, disk) =
                (repo.clone(), template.clone(), id.clone(), disk.clone());
            let ephemeral = !self.is_persistent();
            async move {
                let disk_sha256 = disk_digest.finish().await?;
                tokio::task::spawn_blocking(move || {
                    let state = state.as_ref().map(|(p, sha)| (p.as_path(), sha.clone()));
                    publish(
                        &repo,
                        &template,
                        &id,
                        state,
                        (&disk, disk_sha256),
                        ephemeral,
                    )
                })
                .await
                .map_err(|e| internal("publishing the pause", e))
                .and_then(|published| published)
            }
        };
        let saved = match mode {
            PauseMode::Memory(how) => {
                match memory_save::save(running.vm.as_mut(), &template, &state_path, how).await {
                    Ok(report) => publish_with(Some((state_path.clone(), report.sha256.clone())))
                        .await
                        .map(|s| (s, Some(report))),
                    Err(e) => Err(vmm_err(e)),
                }
            }
            PauseMode::DiskOnly => publish_with(None).await.map(|s| (s, None)),
        };
        let t_published = t0.elapsed();
        let (snapshot, report) = match saved {
            Ok(s) => s,
            Err(e) => {
                // Nothing is lost: the VM is still there; let it go on.
                let _ = std::fs::remove_file(&state_path);
                let _ = running.vm.resume().await;
                return Err(e);
            }
        };
        // The snapshot is durable before the row says paused, so a crash in
        // between is recovered as a pause (see recovery).
        let before = sb.record.clone();
        sb.record.state = SandboxState::Paused;
        sb.record.agent_addr = None;
        sb.record.vmm_pid = None;
        sb.record.paused_disk_only = mode == PauseMode::DiskOnly;
        if let Err(e) = self.save_record(&sb.record).await {
            // Not paused as far as anyone will know: back to running.
            sb.record = before;
            let unused = snapshot.id.clone();
            let dropped = blocking::repo(&repo, "dropping an unused pause", move |r| {
                r.delete(&unused)
            });
            if let Err(e) = dropped.await {
                tracing::warn!(sandbox = %id, "dropping unused pause {}: {e}", snapshot.id);
            }
            if let Some(r) = sb.running.as_mut() {
                let _ = r.vm.resume().await;
            }
            return Err(e);
        }
        let t_committed = t0.elapsed();
        stop_in_background(&self.node, sb);
        // The row says paused: streams from it end now (see Node).
        self.node.announce_stopped(&id);
        // From here on the repository's copy is the disk.
        let (held, linked) = (snapshot.clone(), disk.clone());
        blocking::run("unlinking a paused disk", move || {
            drop_link(&repo, &held, &linked)
        })
        .await?;
        self.share_pause(&id, &snapshot);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        match &report {
            Some(r) => {
                tracing::info!(sandbox = %id, memory = ?r.memory, state_bytes = r.state_bytes,
                save_ms = ms(r.save), write_ms = ms(r.write), sync_ms = ms(r.sync),
                published_ms = ms(t_published),
                committed_ms = ms(t_committed), total_ms = ms(t0.elapsed()), "paused")
            }
            None => tracing::info!(sandbox = %id, published_ms = ms(t_published),
                committed_ms = ms(t_committed), total_ms = ms(t0.elapsed()), "paused (disk only)"),
        }
        Ok(report)
    }

    /// Consumes the sandbox's paused snapshot: takes its disk back, resumes
    /// from its state and deletes it once the row says running. On failure
    /// the disk goes back and the sandbox stays paused. A disk-only pause,
    /// or `reboot`, comes back by a cold boot from the disk instead (what
    /// was only in memory is gone, as after a reboot).
    pub(crate) async fn resume_locked(
        &self,
        sb: &mut Sandbox,
        timeout_secs: Option<u64>,
        reboot: bool,
    ) -> Result<()> {
        self.check_open()?;
        let timeout = deadline(timeout_secs)?;
        let id = sb.record.id.clone();
        let template = self.template_for(sb).await?;
        self.node.check_template(&template).await?;
        let repo = self.repo()?;
        // The pause's VMM holds the disk's image lock until it exits.
        finish_stopping(sb).await;
        let snapshot = for_resume(&repo, &id)?;
        let state = verified_files(&repo, &snapshot, !reboot).await?;
        let saved = match state {
            Some(state) => {
                let memory = memory_of(&repo, &snapshot, &template)?;
                Some(SavedState { state, memory })
            }
            None => None,
        };
        let disk = sb.disk_path();
        let (from, to) = (snapshot.id.clone(), disk.clone());
        blocking::repo(&repo, "taking the paused disk back", move |r| {
            r.take_file(&from, DISK, &to)
        })
        .await?;
        // Opened over the template's disk, whatever the header names: a
        // disk made while the template was served lazily names a FUSE file
        // gone after a restart, and a header is the VMM's to rewrite.
        let params = self.resume_params(&sb.record);
        let resumed = match saved {
            Some(saved) => {
                resume::from_saved(
                    &self.node, &self.pool, &template, &id, &sb.dir, saved, &params,
                )
                .await
            }
            None => resume::cold_boot(&self.node, &template, &id, &sb.dir, &params).await,
        };
        let resumed = match resumed {
            Ok(r) => r,
            Err(e) => {
                give_back_disk(&repo, &snapshot.id, &disk, &id).await;
                return Err(e);
            }
        };
        let before = sb.record.clone();
        set_running(sb, running(resumed), timeout);
        sb.record.paused_disk_only = false;
        if let Err(e) = self.save_record(&sb.record).await {
            stop_running(&self.node, sb).await;
            sb.record = before;
            give_back_disk(&repo, &snapshot.id, &disk, &id).await;
            return Err(e);
        }
        // Spent: the disk moves on from here. A failure leaves a snapshot
        // without disk, which recovery deletes.
        let spent = snapshot.id.clone();
        let deleted = blocking::repo(&repo, "deleting a spent pause", move |r| r.delete(&spent));
        if let Err(e) = deleted.await {
            tracing::warn!(sandbox = %id, "deleting spent pause {}: {e}", snapshot.id);
        }
        self.unshare_pause(&id, &snapshot.id);
        Ok(())
    }

    /// Deletes sandbox `id`'s paused snapshot, if it has one.
    pub(crate) async fn delete_pause(&self, id: &str) {
        match self.delete_local_pause(id).await {
            Ok(Some(snapshot)) => self.unshare_pause(id, &snapshot),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(sandbox = %id, "deleting its paused snapshot: {e}; `siesta repo check` lists it")
            }
        }
    }

    /// Deletes sandbox `id`'s paused snapshot from this node's repository
    /// only; returns its id, if it had one.
    pub(crate) async fn delete_local_pause(&self, id: &str) -> Result<Option<String>> {
        let (repo, owned) = (self.repo()?, id.to_string());
        blocking::run(
            "deleting a paused snapshot",
            move || match Saved::inspect(&repo, &owned)? {
                Saved::Complete(s) | Saved::DiskTaken(s) => {
                    repo.delete(&s.id)?;
                    Ok(Some(s.id))
                }
                Saved::Missing => Ok(None),
            },
        )
        .await
    }
}

/// Checks, side by side on blocking threads, the files a sandbox made
/// from `record` uses against the sizes and digests its record keeps: the
/// disk, and the saved state when `with_state` (and it has one). Returns
/// the state's path. A damaged file is refused with what was wrong, and
/// the snapshot is left as it is.
pub(crate) async fn verified_files(
    repo: &Repository,
    record: &SnapshotRecord,
    with_state: bool,
) -> Result<Option<PathBuf>> {
    let disk = verified(repo, record, DISK);
    if with_state && record.files.contains_key(STATE) {
        let (state, _) = tokio::try_join!(verified(repo, record, STATE), disk)?;
        Ok(Some(state))
    } else {
        disk.await.map(|_| None)
    }
}

/// The file of `role` of `record`, checked against its size and digest.
async fn verified(
    repo: &Repository,
    record: &SnapshotRecord,
    role: &'static str,
) -> Result<PathBuf> {
    let (repo, record) = (repo.clone(), record.clone());
    let id = record.id.clone();
    let what = if role == STATE { "saved state" } else { role };
    let checked = tokio::task::spawn_blocking(move || repo.verify_file(&record, role))
        .await
        .map_err(|e| internal(&format!("verifying the {what} of snapshot {id}"), e))?;
    checked.map_err(|e| match e {
        RepoError::Corrupt { path, detail, .. } => Error::CorruptSnapshot {
            path,
            detail: format!("{what} of {id}: {detail}"),
        },
        other => other.into(),
    })
}

/// A paused sandbox's disk hashed while its memory is saved. The vCPUs are
/// stopped and the disk flushed, so it should not change meanwhile; if its
/// size or times did (a full save's migration may still write image
/// metadata as it ends), it is hashed again.
struct DiskDigest {
    path: PathBuf,
    task: tokio::task::JoinHandle<Result<(String, Option<FileStamp>)>>,
}

type FileStamp = (u64, i64, i64, i64, i64);

fn stamp(path: &Path) -> Option<FileStamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

impl DiskDigest {
    fn start(path: PathBuf) -> Self {
        let hashed = path.clone();
        let task = tokio::task::spawn_blocking(move || {
            let before = stamp(&hashed);
            let sha = siesta_snapshot::repo::sha256_file(&hashed)?;
            Ok((sha, before))
        });
        Self { path, task }
    }

    async fn finish(self) -> Result<String> {
        let joined = self
            .task
            .await
            .map_err(|e| internal(&format!("hashing the disk {}", self.path.display()), e))?;
        let (sha, before) = joined?;
        if before.is_some() && before == stamp(&self.path) {
            return Ok(sha);
        }
        tracing::debug!(disk = %self.path.display(), "disk changed while hashed; hashing it again");
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || siesta_snapshot::repo::sha256_file(&path))
            .await
            .map_err(|e| internal(&format!("hashing the disk {}", self.path.display()), e))?
            .map_err(Error::from)
    }
}

/// The memory blob a saved state was taken over: the one its record
/// references (a changed-pages state is only valid over it), or, for a
/// legacy template outside the repository, the template's file.
pub(crate) fn memory_of(
    repo: &Repository,
    record: &SnapshotRecord,
    template: &Template,
) -> Result<std::path::PathBuf> {
    if record.files.contains_key(MEMORY) {
        Ok(repo.file_path(record, MEMORY)?)
    } else {
        Ok(template.memory.clone())
    }
}

/// Has the guest write its file systems' dirty pages to its disk before a
/// disk-only pause: what is only in its page cache would be lost. A guest
/// whose agent does not answer is not paused (as in E2B, a filesystem-only
/// pause needs a responding agent).
pub(crate) async fn sync_guest(id: &str, agent: std::net::SocketAddr, token: String) -> Result<()> {
    let client = siesta_envd_client::EnvdClient::new(id, agent, Some(token));
    let synced = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        client.exec("sync", Some("root"), |_, _| {}),
    )
    .await;
    let detail = match synced {
        Ok(Ok(out)) if out.exit_code == 0 => return Ok(()),
        Ok(Ok(out)) => format!("`sync` exited {}", out.exit_code),
        Ok(Err(e)) => format!("`sync`: {e}"),
        Err(_) => "`sync` took over 30 s".to_string(),
    };
    Err(Error::GuestUnresponsive {
        id: id.to_string(),
        detail,
    })
}

/// Returns a resume's disk to the paused snapshot it was taken from.
async fn give_back_disk(repo: &Repository, snapshot: &str, disk: &Path, id: &str) {
    let (snap, path) = (snapshot.to_string(), disk.to_path_buf());
    let returned = blocking::repo(repo, "returning a paused disk", move |r| {
        r.return_file(&snap, DISK, &path)
    });
    if let Err(e) = returned.await {
        tracing::error!(sandbox = %id, "returning the disk to paused snapshot {snapshot}: {e}; it stays at {}", disk.display());
    }
}
