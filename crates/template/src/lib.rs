//! siesta-template: templates, a booted, ready VM frozen to disk.
//! Sandboxes are born by resuming one.
//!
//! - [`Template`] opens one (the one resolver: repository alias first, a
//!   directory from before the repository second); [`record`] is what it
//!   says of itself, [`tags`] its names;
//! - builds: [`build_template`] (boot an image, wait for the agent,
//!   freeze), [`build_from_steps`] (RUN/COPY/ENV/WORKDIR/USER steps over a
//!   base, each step's disk cached), [`dockerfile`] (the Dockerfile subset);
//! - [`launch`]: a template on a host, as a VMM's launch description;
//! - [`record_startup_manifest`]: which memory a resume touches first.
//!
//! It needs the host (`siesta-host`) and the agent client
//! (`siesta-envd-client`), never sandboxes' rows: `siesta-sandbox` sits
//! above it.

mod base;
mod build;
mod derive;
pub mod dockerfile;
pub mod error;
mod from_image;
mod guest_tree;
pub mod launch;
mod layered;
pub mod manifest;
mod publish;
pub mod record;
mod step_cache;
pub mod steps;
pub mod tags;
pub mod work_dir;

pub use build::{boot_spec, boot_until_healthy, Booted, VmSize};
pub use build::{build_template, cold_boot, BuildOptions};
pub use derive::{build_from_steps, BuildLog, BuildPhase, LogLevel};
pub use error::{Error, Result};
pub use from_image::DEFAULT_FREE_MIB;
pub use launch::incoming_spec;
pub use manifest::{record_startup_manifest, spawn_manifest_recording, RecordedManifest};
pub use record::TemplateRecord;
pub use steps::{BuildSource, Step, StepsBuild};

use std::path::{Path, PathBuf};

use siesta_snapshot::record::FileRef;
use siesta_snapshot::record::{DISK, MEMORY, STATE};
use siesta_snapshot::{RepoError, Repository, SnapshotRecord};

use siesta_host::layout::{validate_name, Layout};

/// A template that exists on disk, with its record loaded.
///
/// Templates are snapshots in the repository, aliased `template:<name>`;
/// their memory and disk are shared blobs. A template directory from before
/// the repository (`templates/<name>/`) is still opened, without manifest.
#[derive(Debug, Clone)]
pub struct Template {
    /// The snapshot's directory (or the legacy template directory).
    pub dir: PathBuf,
    pub record: TemplateRecord,
    pub memory: PathBuf,
    pub state: PathBuf,
    pub disk: PathBuf,
    /// The repository record; `None` for a legacy directory template.
    pub snapshot: Option<SnapshotRecord>,
    /// Its memory and disk are served before they are whole (`siesta_tier::lazy`):
    /// each chunk is checked as it arrives, so the resume neither hashes
    /// them nor prefetches from them.
    pub lazy: bool,
}

/// The alias of template `name` in the repository.
pub fn alias(name: &str) -> String {
    format!("template:{name}")
}

impl Template {
    /// Opens template `name`; a missing one is `TemplateNotFound`.
    pub fn open(layout: &Layout, name: &str) -> Result<Self> {
        validate_name("template", name).map_err(Error::Invalid)?;
        let repo = Repository::open(layout.repo())?;
        match repo.resolve(&alias(name)) {
            Ok(snap) => return Self::from_snapshot(&repo, snap),
            Err(RepoError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let dir = layout.template_dir(name);
        if !dir.join(record::RECORD_FILE).exists() {
            return Err(Error::TemplateNotFound {
                name: name.to_string(),
            });
        }
        let record = TemplateRecord::load(&dir)?;
        Ok(Self {
            memory: dir.join(record::MEMORY_FILE),
            state: dir.join(record::STATE_FILE),
            disk: dir.join(record::DISK_FILE),
            dir,
            record,
            snapshot: None,
            lazy: false,
        })
    }

    /// The template that snapshot `id` of `repo` holds; `None` when the
    /// repository has no snapshot of that id.
    pub fn open_snapshot(repo: &Repository, id: &str) -> Result<Option<Self>> {
        match repo.get(id) {
            Ok(snap) => Self::from_snapshot(repo, snap).map(Some),
            Err(RepoError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn from_snapshot(repo: &Repository, snap: SnapshotRecord) -> Result<Self> {
        let memory = repo.file_path(&snap, MEMORY)?;
        let state = repo.file_path(&snap, STATE)?;
        let disk = repo.file_path(&snap, DISK)?;
        Self::served(repo, snap, memory, state, disk)
    }

    /// This template, its files served lazily (see [`Template::lazy`]).
    pub fn served_lazily(mut self) -> Self {
        self.lazy = true;
        self
    }

    /// Template snapshot `snap` of `repo` (or about to be in it), its
    /// files served from the given paths (`siesta_tier::lazy`: before it is whole).
    pub fn served(
        repo: &Repository,
        snap: SnapshotRecord,
        memory: PathBuf,
        state: PathBuf,
        disk: PathBuf,
    ) -> Result<Self> {
        let dir = repo.snapshot_dir(&snap.id);
        let record: TemplateRecord =
            serde_json::from_value(snap.meta.clone()).map_err(|e| Error::CorruptSnapshot {
                path: dir.clone(),
                detail: format!("bad template record: {e}"),
            })?;
        Ok(Self {
            memory,
            state,
            disk,
            dir,
            record,
            snapshot: Some(snap),
            lazy: false,
        })
    }

    /// The template's snapshot id and its shared memory blob, which the
    /// snapshots of its sandboxes reference instead of copying; `None` for
    /// a legacy directory template.
    pub fn shared_memory(&self) -> Option<(String, FileRef)> {
        let snap = self.snapshot.as_ref()?;
        Some((snap.id.clone(), snap.files.get(MEMORY)?.clone()))
    }

    pub fn memory_path(&self) -> PathBuf {
        self.memory.clone()
    }
    pub fn state_path(&self) -> PathBuf {
        self.state.clone()
    }
    pub fn disk_path(&self) -> PathBuf {
        self.disk.clone()
    }

    /// Checks the sizes of the snapshot files (cheap, done on every restore).
    pub fn verify_sizes(&self) -> Result<()> {
        if self.lazy {
            // Sized from the object store's index; a `stat` here would be
            // a FUSE call from an async thread.
            return Ok(());
        }
        let r = &self.record;
        for (path, f) in [
            (&self.memory, &r.memory),
            (&self.state, &r.state),
            (&self.disk, &r.disk),
        ] {
            record::check_size(path, f)?;
        }
        Ok(())
    }

    /// Refuses a snapshot made by another VMM kind, version, machine type
    /// or accelerator than `current`, naming each difference.
    pub fn check_compatible(&self, current: &siesta_vmm::VmmInfo) -> Result<()> {
        current
            .check_compatible(&self.record.vmm)
            .map_err(|e| Error::Incompatible {
                template: self.record.name.clone(),
                detail: e.to_string(),
            })
    }
}

/// Every template under the data directory, by name.
pub fn list(layout: &Layout) -> Result<Vec<Template>> {
    let repo = Repository::open(layout.repo())?;
    let mut out = Vec::new();
    for (alias, _) in repo.aliases()? {
        if let Some(name) = alias.strip_prefix("template:") {
            if let Ok(t) = Template::open(layout, name) {
                out.push(t);
            }
        }
    }
    let root = layout.templates();
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(source) => {
            return Err(Error::Io {
                what: "listing templates",
                path: root,
                source,
            })
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // a build in progress or left by a crash
        }
        if out.iter().any(|t| t.record.name == name) {
            continue; // rebuilt into the repository; the alias wins
        }
        if let Ok(t) = Template::open(layout, &name) {
            out.push(t);
        }
    }
    out.sort_by(|a, b| a.record.name.cmp(&b.record.name));
    Ok(out)
}

/// Deletes template `name`; false if there was none. Its sandboxes keep
/// running (their VMMs hold the files open); new ones cannot start from it.
pub fn delete(layout: &Layout, name: &str) -> Result<bool> {
    validate_name("template", name).map_err(Error::Invalid)?;
    let repo = Repository::open(layout.repo())?;
    let mut found = false;
    match repo.resolve(&alias(name)) {
        Ok(snap) => {
            repo.delete(&snap.id)?;
            found = true;
        }
        Err(RepoError::NotFound(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let legacy = layout.template_dir(name);
    if is_complete(&legacy) {
        std::fs::remove_dir_all(&legacy).map_err(|source| Error::Io {
            what: "removing template directory",
            path: legacy.clone(),
            source,
        })?;
        found = true;
    }
    Ok(found)
}

pub(crate) fn is_complete(dir: &Path) -> bool {
    dir.join(record::RECORD_FILE).exists()
}
