//! User snapshots and forks of running sandboxes.
//!
//! Both start with a *capture*: the sandbox's vCPUs stop, its device state
//! and the RAM pages it changed are saved (see [`crate::memory_save`]) and its disk overlay copied
//! while nothing writes to it, then it runs on. A snapshot publishes the
//! capture in the repository (kind `user`; its memory is the template's
//! shared blob, state and disk are its own); a fork resumes N new sandboxes
//! from a capture that is deleted afterwards. A new sandbox from either gets
//! its own copy of the captured disk (sparse; a reflink where the
//! filesystem has them), so children never share written blocks.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use siesta_snapshot::record::{DISK, MEMORY, STATE};
use siesta_snapshot::repo::{new_id, Placement, PublishFile, PublishRequest};
use siesta_snapshot::{RepoError, Repository, SnapshotKind, SnapshotRecord};

use crate::error::{internal, Error, IoContext, Result};
use crate::lifecycle::deadline;
use crate::manager::{new_record, CreateRequest, SandboxManager};
use crate::memory_save::{self, SaveMemory};
use crate::paused::{memory_of, verified_files};
use crate::resume::{self, SavedState};
use crate::sandbox::{SandboxInfo, DISK_FILE};
use crate::volumes::VolumeMount;
use siesta_host::disk::{copy_sparse, rebase_onto};
use siesta_template::Template;

/// What is kept with a user snapshot (the record's `meta`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserSnapshotMeta {
    pub template: String,
    pub source_sandbox: String,
    pub names: Vec<String>,
    /// The access token the captured guest holds: a sandbox made from the
    /// snapshot presents it to `/init` to set its own.
    pub guest_token: String,
    /// The source's volume mounts: its guest has them, so every sandbox
    /// made from the snapshot serves them too.
    #[serde(default)]
    pub volume_mounts: Vec<VolumeMount>,
    /// The source's egress rules, which a sandbox made from the snapshot
    /// gets unless its create request gives its own (absent in snapshots
    /// taken before siesta kept them: then the default).
    #[serde(default)]
    pub egress: Option<siesta_net::EgressPolicy>,
}

/// A user snapshot as callers see it.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    pub id: String,
    pub names: Vec<String>,
    pub template: String,
    pub source_sandbox: String,
    pub created_at_unix_ms: u64,
}

/// A capture's files, in a scratch directory removed on drop.
struct Capture {
    dir: PathBuf,
    state: PathBuf,
    disk: PathBuf,
    /// The blob the source's RAM maps, which `state` was saved over.
    memory: PathBuf,
    /// The source's template as the save saw it, and the token its guest
    /// holds.
    template: Template,
    guest_token: String,
    /// `state`'s SHA-256 where the save computed it.
    state_sha256: Option<String>,
    volume_mounts: Vec<VolumeMount>,
    egress: siesta_net::EgressPolicy,
    /// Only the disk was captured (no `state`).
    disk_only: bool,
}

/// What a new sandbox starts from: a saved state (none: it cold-boots from
/// the disk), the memory blob it was saved over, a disk to copy, and the
/// token the saved guest holds.
struct Origin<'a> {
    state: Option<&'a Path>,
    /// The disk's backing file is to be set to this node's copy of the
    /// template disk: a snapshot's disk names the template disk's path on
    /// the node that took it, which may be another node.
    rebase_disk: bool,
    memory: &'a Path,
    disk: &'a Path,
    guest_token: &'a str,
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn alias_of(name: &str) -> String {
    format!("snapshot:{name}")
}

impl SandboxManager {
    pub(crate) fn repo(&self) -> Result<Repository> {
        let repo = Repository::open(self.node.config.layout().repo())?;
        #[cfg(feature = "test-hooks")]
        if let Some(hook) = self.publish_hook() {
            return Ok(repo.with_publish_hook(hook));
        }
        Ok(repo)
    }

    /// Stops running sandbox `id` for a moment to capture its state and
    /// disk (its disk only, after syncing the guest, when not `memory`),
    /// then lets it run on.
    async fn capture(&self, id: &str, memory: bool) -> Result<Capture> {
        let mut sb = self.lock(id).await?;
        let template = self.template_for(&sb).await?;
        self.wait_served(&template).await?;
        let scratch = self
            .node
            .config
            .layout()
            .sandboxes()
            .join(format!(".capture-{id}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&scratch).ctx("creating capture directory", &scratch)?;
        let mut capture = Capture {
            state: scratch.join("state.bin"),
            disk: scratch.join(DISK_FILE),
            dir: scratch,
            memory: template.memory.clone(),
            template,
            guest_token: sb.record.access_token.clone(),
            state_sha256: None,
            volume_mounts: sb.record.volume_mounts.clone(),
            egress: sb.record.egress.clone(),
            disk_only: !memory,
        };
        let token = sb.record.access_token.clone();
        let disk = sb.disk_path();
        let Some(running) = sb.running.as_mut() else {
            return Err(Error::WrongState {
                id: id.to_string(),
                state: sb.record.state.to_string(),
                expected: "running",
            });
        };
        let vmm_err = |source| Error::vmm(id, source);
        if !memory {
            crate::paused::sync_guest(id, running.agent_addr, token).await?;
        }
        running.vm.pause().await.map_err(vmm_err)?;
        capture.memory = running.vm.memory_file().to_path_buf();
        let saved = async {
            if memory {
                let vm = running.vm.as_mut();
                let report =
                    memory_save::save(vm, &capture.template, &capture.state, SaveMemory::Changed)
                        .await
                        .map_err(vmm_err)?;
                capture.state_sha256 = report.sha256;
            }
            Ok::<_, crate::Error>(copy_sparse(&disk, &capture.disk).await?)
        }
        .await;
        // Whatever happened, the source runs on.
        let resumed = running.vm.resume().await.map_err(vmm_err);
        saved?;
        resumed?;
        Ok(capture)
    }

    /// [`SandboxManager::snapshot`]; without `memory` (E2B's filesystem-only
    /// snapshot) the guest is synced and only its disk is kept, and
    /// sandboxes made from it cold-boot.
    pub(crate) async fn snapshot_with_op(
        &self,
        id: &str,
        name: Option<String>,
        memory: bool,
    ) -> Result<SnapshotInfo> {
        let capture = self.capture(id, memory).await?;
        let template = &capture.template;
        let template_name = template.record.name.clone();
        let repo = self.repo()?;
        let (parent, memory) = template.shared_memory().ok_or_else(|| {
            Error::Invalid(format!(
                "template {template_name:?} predates the snapshot repository; rebuild it to snapshot its sandboxes"
            ))
        })?;
        let names: Vec<String> = name.into_iter().collect();
        let meta = UserSnapshotMeta {
            template: template_name,
            source_sandbox: id.to_string(),
            names: names.clone(),
            guest_token: capture.guest_token.clone(),
            volume_mounts: capture.volume_mounts.clone(),
            egress: Some(capture.egress.clone()),
        };
        let file = |role: &str, source: &Path, sha256| PublishFile {
            role: role.to_string(),
            source: source.to_path_buf(),
            placement: Placement::LocalMove,
            sha256,
        };
        let request = PublishRequest {
            id: new_id("snap"),
            kind: SnapshotKind::User,
            parent: Some(parent),
            guest_memory_size: template.record.memory.size,
            files: Vec::new(),
            existing: vec![(MEMORY.to_string(), memory)],
            aliases: names.iter().map(|n| alias_of(n)).collect(),
            meta: serde_json::to_value(&meta)
                .map_err(|e| crate::error::internal("encoding a snapshot's record", e))?,
        };
        // Hashing, copies and fsyncs: off the async threads. The capture
        // (its scratch directory) goes once published.
        let record = tokio::task::spawn_blocking(move || {
            let files = snapshot_files(&capture, file)?;
            Ok::<_, Error>(repo.publish(PublishRequest { files, ..request })?)
        })
        .await
        .map_err(|e| internal(&format!("publishing the snapshot of {id}"), e))??;
        let aliases = names.iter().map(|n| alias_of(n)).collect();
        self.share_in_background(&record, aliases);
        Ok(info(&record, meta))
    }

    /// With an object store: puts the new snapshot `record` there, behind
    /// the caller's back, so other nodes can create from it (a failure is
    /// logged: the snapshot is whole here either way).
    fn share_in_background(&self, record: &SnapshotRecord, aliases: Vec<String>) {
        let (Some(remote), Ok(repo)) = (self.remote().cloned(), self.repo()) else {
            return;
        };
        let (id, parent) = (record.id.clone(), record.parent.clone());
        self.transfers.spawn(async move {
            match remote.share(&repo, &id, parent.as_deref(), &aliases).await {
                Ok(()) => tracing::info!(snapshot = %id, "shared through the object store"),
                Err(e) => {
                    tracing::warn!(snapshot = %id, "not shared: {e}; `siesta repo push {id}` retries")
                }
            }
        });
    }

    /// Deletes snapshot `id` from the object store too, when there is one
    /// (a failure is logged: it is gone from this node already).
    pub async fn unshare_snapshot(&self, id: &str) {
        let Some(remote) = self.remote() else {
            return;
        };
        if let Err(e) = remote.unshare(id).await {
            tracing::warn!(
                snapshot = id,
                "the object store keeps its copy: {e}; `siesta repo remote-delete {id}` removes it"
            );
        }
    }

    /// User snapshots, optionally only those taken of `source` (every
    /// record is read: on a blocking thread).
    pub async fn list_snapshots(&self, source: Option<&str>) -> Result<Vec<SnapshotInfo>> {
        let source = source.map(str::to_string);
        let repo = self.repo()?;
        let records = crate::blocking::repo(&repo, "listing snapshots", |r| r.list()).await?;
        let mut out = Vec::new();
        for record in records {
            if record.kind != SnapshotKind::User {
                continue;
            }
            let Ok(meta) = serde_json::from_value::<UserSnapshotMeta>(record.meta.clone()) else {
                continue;
            };
            if source.as_ref().is_none_or(|s| *s == meta.source_sandbox) {
                out.push(info(&record, meta));
            }
        }
        out.sort_by_key(|s| s.created_at_unix_ms);
        Ok(out)
    }

    /// Deletes user snapshot `id` (or one named so) here: the id deleted,
    /// `None` if there was none ([`SandboxManager::unshare_snapshot`]
    /// deletes it from the object store).
    pub fn delete_snapshot(&self, id: &str) -> Result<Option<String>> {
        let Some(record) = self.find_snapshot(id)? else {
            return Ok(None);
        };
        self.repo()?.delete(&record.id)?;
        Ok(Some(record.id))
    }

    /// The user snapshot with id or name `key`, if there is one.
    pub(crate) fn find_snapshot(&self, key: &str) -> Result<Option<SnapshotRecord>> {
        let repo = self.repo()?;
        for candidate in [key.to_string(), alias_of(key)] {
            match repo.resolve(&candidate) {
                Ok(r) if r.kind == SnapshotKind::User => return Ok(Some(r)),
                Ok(_) | Err(RepoError::NotFound(_)) => {}
                Err(RepoError::InvalidName { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// The template user snapshot `snap` was taken over: its parent, by
    /// id (a template rebuilt since under the same name, or another node's
    /// template of that name, is not what its disk was written over),
    /// fetched from the object store when this node lacks it; by `name`
    /// for a record without a parent, or whose parent is nowhere.
    async fn template_of(&self, snap: &SnapshotRecord, name: &str) -> Result<Template> {
        let Some(parent) = snap.parent.as_deref() else {
            return self.open_template(name).await;
        };
        let repo = self.repo()?;
        if let Some(t) = Template::open_snapshot(&repo, parent)? {
            self.used_fetched(parent);
            return Ok(t);
        }
        if let Some(remote) = self.remote() {
            remote.fetch_id(&repo, parent).await?;
            self.prune_fetched_later().await;
            if let Some(t) = Template::open_snapshot(&repo, parent)? {
                return Ok(t);
            }
        }
        // The parent is gone (a template deleted since): as before parents
        // were looked up by id, the template of that name.
        self.open_template(name).await
    }

    /// A new sandbox from user snapshot `snap`.
    pub(crate) async fn create_from_snapshot(
        &self,
        snap: &SnapshotRecord,
        req: CreateRequest,
    ) -> Result<SandboxInfo> {
        let repo = self.repo()?;
        let meta: UserSnapshotMeta =
            serde_json::from_value(snap.meta.clone()).map_err(|e| Error::CorruptSnapshot {
                path: repo.snapshot_dir(&snap.id),
                detail: format!("bad snapshot record: {e}"),
            })?;
        // A filesystem-only snapshot has no state: its sandboxes cold-boot.
        let state = verified_files(&repo, snap, true).await?;
        let disk = repo.file_path(snap, DISK)?;
        if !req.volume_mounts.is_empty() && req.volume_mounts != meta.volume_mounts {
            return Err(Error::Invalid(format!(
                "volumeMounts: a sandbox made from snapshot {} mounts what its source mounted; leave volumeMounts out",
                snap.id
            )));
        }
        let req = CreateRequest {
            volume_mounts: meta.volume_mounts.clone(),
            egress: req.egress.or_else(|| meta.egress.clone()),
            ..req
        };
        let template = self.template_of(snap, &meta.template).await?;
        self.node.check_template(&template).await?;
        let memory = memory_of(&repo, snap, &template)?;
        let origin = Origin {
            state: state.as_deref(),
            memory: &memory,
            disk: &disk,
            guest_token: &meta.guest_token,
            rebase_disk: true,
        };
        Box::pin(self.create_from_capture(&template, origin, req)).await
    }

    async fn create_from_capture(
        &self,
        template: &Template,
        origin: Origin<'_>,
        req: CreateRequest,
    ) -> Result<SandboxInfo> {
        let timeout = deadline(req.timeout_secs)?;
        let mut record = new_record(&req, template, timeout);
        let id = crate::ids::new_sandbox_id();
        let dir = self.node.config.layout().sandbox_dir(&id);
        std::fs::create_dir_all(&dir).ctx("creating sandbox directory", &dir)?;
        let result = async {
            copy_sparse(origin.disk, &dir.join(DISK_FILE)).await?;
            if origin.rebase_disk {
                rebase_onto(&dir.join(DISK_FILE), &template.disk_path()).await?;
            }
            record.template = template.record.name.clone();
            let mut params = self.resume_params(&record);
            params.guest_token = Some(origin.guest_token.to_string());
            match origin.state {
                Some(state) => {
                    let saved = SavedState {
                        state: state.to_path_buf(),
                        memory: origin.memory.to_path_buf(),
                    };
                    resume::from_saved(&self.node, &self.pool, template, &id, &dir, saved, &params)
                        .await
                }
                None => resume::cold_boot(&self.node, template, &id, &dir, &params).await,
            }
        }
        .await;
        match result {
            Ok(resumed) => self.adopt(record, resumed, timeout).await,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// `count` new sandboxes, each a copy of running sandbox `id` as it is
    /// now; the source runs on. One result per child, in order.
    ///
    /// The source is captured once; the children resume from that one
    /// state file concurrently (at most [`FORK_CONCURRENCY`] at a time), so
    /// they read its pages through one page cache and map the same
    /// template blob. Each gets its own id, access token, entropy (both at
    /// `/init`), network slot and copy of the disk.
    pub(crate) async fn fork_op(
        &self,
        id: &str,
        count: u32,
        timeout_secs: Option<u64>,
    ) -> Result<Vec<Result<SandboxInfo>>> {
        if !(1..=MAX_FORK_CHILDREN).contains(&count) {
            return Err(Error::Invalid(format!(
                "fork count {count}: use 1 to {MAX_FORK_CHILDREN}"
            )));
        }
        deadline(timeout_secs)?;
        let source = self.get(id).await?;
        self.check_room(&source.template, count as usize).await?;
        let capture = self.capture(id, true).await?;
        let req = CreateRequest {
            template: capture.template.record.name.clone(),
            env_vars: source.env_vars.clone(),
            metadata: source.metadata.clone(),
            egress: Some(source.egress.clone()),
            private_traffic: source.traffic_token.is_some(),
            timeout_secs,
            lifecycle: source.lifecycle,
            volume_mounts: source.volume_mounts.clone(),
        };
        let origin = || Origin {
            state: Some(&capture.state),
            memory: &capture.memory,
            disk: &capture.disk,
            guest_token: &capture.guest_token,
            // Taken here a moment ago: it names this node's template disk.
            rebase_disk: false,
        };
        let children = futures::stream::iter(0..count)
            .map(|_| self.create_from_capture(&capture.template, origin(), req.clone()))
            .buffered(FORK_CONCURRENCY)
            .collect()
            .await;
        Ok(children)
    }

    /// Refuses, before anything is captured, a fork whose children would
    /// not all get a network slot: the free and warm slots, and those of
    /// the VMMs waiting for the template (a child takes one over). A create
    /// racing the fork can still take a slot; that child then fails alone.
    async fn check_room(&self, template: &str, wanted: usize) -> Result<()> {
        let room = self.node.net.room().await + self.pool.waiting(template).await;
        if wanted > room {
            return Err(Error::NodeFull {
                wanted,
                room,
                max_slots: self.node.net.capacity(),
            });
        }
        Ok(())
    }
}

/// The most children one fork call makes.
pub const MAX_FORK_CHILDREN: u32 = 64;

/// Children resumed at once: enough to overlap one child's waits (its
/// guest's health and init, the disk copy) with another's CPU work, few
/// enough that 64 children do not start 64 VMMs in the same instant.
const FORK_CONCURRENCY: usize = 8;

/// The files a user snapshot publishes: the captured state (checked by
/// every sandbox made from it against its digest) unless only the disk was
/// kept, and the disk.
fn snapshot_files(
    capture: &Capture,
    file: impl Fn(&str, &Path, Option<String>) -> PublishFile,
) -> Result<Vec<PublishFile>> {
    // Every sandbox made from it checks the disk's digest before copying it.
    let disk_sha = siesta_snapshot::repo::sha256_file(&capture.disk)?;
    let mut files = vec![file(DISK, &capture.disk, Some(disk_sha))];
    if !capture.disk_only {
        let state_sha = match &capture.state_sha256 {
            Some(sha) => sha.clone(),
            None => siesta_snapshot::repo::sha256_file(&capture.state)?,
        };
        files.insert(0, file(STATE, &capture.state, Some(state_sha)));
    }
    Ok(files)
}

fn info(record: &SnapshotRecord, meta: UserSnapshotMeta) -> SnapshotInfo {
    SnapshotInfo {
        id: record.id.clone(),
        names: meta.names,
        template: meta.template,
        source_sandbox: meta.source_sandbox,
        created_at_unix_ms: record.created_at_unix_ms,
    }
}
