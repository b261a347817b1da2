//! Resuming a template this node lacks before it is whole (docs/cluster.md,
//! §2). The memory file and the disk of a template fetched from the object
//! store are served through a FUSE file system (`<home>/lazy/mnt/<sha256>`)
//! whose reads wait only for the 4 MiB chunks they touch; a create waits
//! for the record, the file indexes, the state file and the startup
//! manifest (small, fetched whole and checked), then resumes at once.
//!
//! Meanwhile a background fill fetches the startup manifest's chunks
//! first, then every other chunk of the memory file, then the disk's. Once
//! both are whole and match their SHA-256, the snapshot is imported into
//! the repository as an ordinary fetched one (the files are moved in: the
//! FUSE files keep serving the same inodes), and later creates resume it
//! locally. A pause or snapshot of a sandbox started from the FUSE files
//! waits for that import (the repository must hold what it references).
//! The mount lives as long as the node; a node that died leaves it behind
//! and the next start detaches it.
//!
//! Chunks are fetched on a runtime of this tier's own, through an S3
//! client of its own: a FUSE read blocks its thread until the chunk is in,
//! and the node's own runtime may have a worker blocked in a call on a
//! FUSE file meanwhile (a `stat`), so a fetch must never need one of its
//! workers.

mod file;
mod fs;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use siesta_snapshot::record::{DISK, MEMORY, STATE};
use siesta_snapshot::remote::{RemoteRepo, RemoteView};
use siesta_snapshot::{Manifest, Repository, SnapshotKind, SnapshotRecord};
use tokio::sync::watch;

use crate::error::{Error, IoContext, Result};
pub use file::LazyFile;
use fs::{Files, LazyFs};
use siesta_template::Template;

/// Chunks the background fill fetches at once.
const FILL_THREADS: usize = 8;

/// The outcome of a view's background fill: `None` while it runs.
type Outcome = Option<std::result::Result<SnapshotRecord, String>>;

/// Called once a view's snapshot is in the repository (sets its alias,
/// marks it fetched).
pub type OnImported = Box<dyn FnOnce(&SnapshotRecord) -> Result<()> + Send>;

/// A template being served before it is whole.
pub struct View {
    /// Its memory and disk are the FUSE files, its state a local copy.
    pub template: Template,
    memory: Arc<LazyFile>,
    disk: Arc<LazyFile>,
    done: watch::Receiver<Outcome>,
}

impl View {
    /// Bytes of memory and disk fetched so far, and of both in all.
    pub fn fetched(&self) -> (u64, u64) {
        let (m, d) = (&self.memory, &self.disk);
        (m.fetched_bytes() + d.fetched_bytes(), m.size() + d.size())
    }

    /// Waits until the snapshot is whole and in the repository.
    pub async fn imported(&self) -> Result<SnapshotRecord> {
        let mut done = self.done.clone();
        let outcome = done
            .wait_for(Option::is_some)
            .await
            .map_err(|e| crate::error::internal("waiting for the lazy fetch", e))?
            .clone();
        match outcome {
            Some(Ok(record)) => Ok(record),
            Some(Err(detail)) => Err(Error::Remote {
                name: self.template.record.name.clone(),
                detail,
            }),
            None => unreachable!("waited for Some"),
        }
    }
}

/// The node's lazily served templates and their FUSE mount.
pub struct LazyTier {
    root: PathBuf,
    mount: PathBuf,
    files: Arc<Files>,
    session: Mutex<Option<fuser::BackgroundSession>>,
    views: Mutex<HashMap<String, Arc<View>>>,
    /// Tests hold the background fill until this turns true.
    gate: Option<watch::Receiver<bool>>,
    /// Where chunk fetches run (see the module documentation); taken at
    /// drop, which may happen on an async thread.
    runtime: Option<tokio::runtime::Runtime>,
}

impl LazyTier {
    /// Mounts the file system at `root/mnt`, after detaching what a node
    /// that died there left.
    pub fn mount(root: &Path) -> Result<Self> {
        let mount = root.join("mnt");
        detach(&mount);
        if root.exists() {
            std::fs::remove_dir_all(root).ctx("clearing the lazy-fetch directory", root)?;
        }
        std::fs::create_dir_all(&mount).ctx("creating the lazy-fetch mount point", &mount)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("siesta-lazy-fetch")
            .enable_all()
            .build()
            .ctx("starting the lazy-fetch runtime", &mount)?;
        let files = Arc::new(Files::default());
        let mut config = fuser::Config::default();
        config.mount_options = vec![fuser::MountOption::FSName("siesta-lazy".into())];
        config.n_threads = Some(4);
        let session = fuser::spawn_mount(LazyFs(Arc::clone(&files)), &mount, &config)
            .ctx("mounting the lazy-fetch file system (FUSE)", &mount)?;
        Ok(Self {
            root: root.to_path_buf(),
            mount,
            files,
            session: Mutex::new(Some(session)),
            views: Mutex::new(HashMap::new()),
            gate: None,
            runtime: Some(runtime),
        })
    }

    /// Holds every background fill until `gate` turns true (tests).
    pub fn with_fill_gate(mut self, gate: watch::Receiver<bool>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Where the FUSE files are.
    pub fn mount_dir(&self) -> &Path {
        &self.mount
    }

    /// The view of snapshot `id` whose fill has not failed, if any.
    pub fn view(&self, id: &str) -> Option<Arc<View>> {
        let views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        views.get(id).cloned()
    }

    /// Serves template snapshot `id` from `remote` (see the module
    /// documentation); `Ok(None)` when it is not a template with memory,
    /// state and disk (the caller fetches it whole). `on_imported` runs
    /// once it is in `repo`.
    pub async fn open(
        &self,
        remote: &RemoteRepo,
        repo: &Repository,
        id: &str,
        on_imported: OnImported,
    ) -> Result<Option<Arc<View>>> {
        if let Some(view) = self.view(id) {
            let evicted = matches!(&*view.done.borrow(), Some(Ok(_))) && repo.get(id).is_err();
            if !evicted {
                return Ok(Some(view));
            }
            // Imported, then evicted from the repository: served again,
            // and imported again.
            self.views
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(id);
        }
        let err = |e: siesta_snapshot::remote::RemoteError| Error::Remote {
            name: id.to_string(),
            detail: e.to_string(),
        };
        let view = remote.view(id).await.map_err(err)?;
        let servable = view.record.kind == SnapshotKind::Template
            && [MEMORY, DISK, STATE]
                .iter()
                .all(|r| view.files.contains_key(*r));
        if !servable {
            return Ok(None);
        }
        let small = self.root.join("files");
        std::fs::create_dir_all(&small).ctx("creating the lazy-fetch directory", &small)?;
        let state = small.join(&view.files[STATE].sha256);
        remote
            .fetch_file(&view.files[STATE], &state)
            .await
            .map_err(err)?;
        let manifest = match &view.manifest {
            Some(index) => {
                let path = small.join(&index.sha256);
                remote.fetch_file(index, &path).await.map_err(err)?;
                Some(path)
            }
            None => None,
        };
        let fetcher = remote.separate_client().map_err(err)?;
        let Some(runtime) = self.runtime.as_ref().map(|r| r.handle().clone()) else {
            return Ok(None);
        };
        let lazy = |role: &str| -> Result<Arc<LazyFile>> {
            let index = view.files[role].clone();
            let path = repo
                .import_dir()
                .join(format!("lazy-{id}-{role}.{:08x}", rand::random::<u32>()));
            let file = LazyFile::create(index, &path, fetcher.clone(), runtime.clone())
                .ctx("creating a lazily fetched file", &path)?;
            Ok(Arc::new(file))
        };
        let (memory, disk) = (lazy(MEMORY)?, lazy(DISK)?);
        self.files.add(Arc::clone(&memory));
        self.files.add(Arc::clone(&disk));
        let template = Template::served(
            repo,
            view.record.clone(),
            self.mount.join(memory.sha256()),
            state.clone(),
            self.mount.join(disk.sha256()),
        )?
        .served_lazily();
        let (tx, done) = watch::channel(None);
        let served = Arc::new(View {
            template,
            memory: Arc::clone(&memory),
            disk: Arc::clone(&disk),
            done,
        });
        self.views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), Arc::clone(&served));
        let fill = Fill {
            view,
            memory,
            disk,
            state,
            manifest,
            repo: repo.clone(),
            gate: self.gate.clone(),
        };
        tokio::spawn(fill.run(tx, on_imported));
        Ok(Some(served))
    }

    /// Forgets a view whose fill failed, so the next create fetches again.
    fn drop_failed(&self, id: &str) {
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if views
            .get(id)
            .is_some_and(|v| matches!(&*v.done.borrow(), Some(Err(_))))
        {
            views.remove(id);
        }
    }

    /// Detaches the mount: its paths are gone, but what VMs opened or
    /// mapped through it is still served until this tier is dropped.
    pub fn detach(&self) {
        detach(&self.mount);
    }

    /// Waits for the import of template snapshot `id` when it is being
    /// served lazily; a failed fill is an error (and forgotten).
    pub async fn wait_imported(&self, id: &str) -> Result<()> {
        let Some(view) = self.view(id) else {
            return Ok(());
        };
        let imported = view.imported().await;
        if imported.is_err() {
            self.drop_failed(id);
        }
        imported.map(|_| ())
    }
}

impl Drop for LazyTier {
    fn drop(&mut self) {
        detach(&self.mount);
        let session = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(session);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Lazily detaches a mount at `path`, if there is one.
fn detach(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a valid NUL-terminated path; umount2 only reads it.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc == 0 {
        tracing::info!(mount = %path.display(), "detached the lazy-fetch mount");
    }
}

/// One view's background work: every chunk, then the import.
struct Fill {
    view: RemoteView,
    memory: Arc<LazyFile>,
    disk: Arc<LazyFile>,
    state: PathBuf,
    manifest: Option<PathBuf>,
    repo: Repository,
    gate: Option<watch::Receiver<bool>>,
}

impl Fill {
    async fn run(self, tx: watch::Sender<Outcome>, on_imported: OnImported) {
        if let Some(mut gate) = self.gate.clone() {
            let _ = gate.wait_for(|open| *open).await;
        }
        let id = self.view.record.id.clone();
        let started = std::time::Instant::now();
        let outcome = match tokio::task::spawn_blocking(move || self.fill_and_import()).await {
            Ok(Ok(record)) => on_imported(&record)
                .map(|()| record)
                .map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(format!("the background fill stopped: {e}")),
        };
        match &outcome {
            Ok(_) => tracing::info!(snapshot = %id, ms = started.elapsed().as_millis() as u64,
                "lazily served snapshot is whole and imported"),
            Err(e) => tracing::error!(snapshot = %id, "lazy fetch failed: {e}"),
        }
        let _ = tx.send(Some(outcome));
    }

    fn fill_and_import(&self) -> std::result::Result<SnapshotRecord, String> {
        let order = self.order();
        let next = AtomicUsize::new(0);
        let failed = Mutex::new(None::<String>);
        std::thread::scope(|s| {
            for _ in 0..FILL_THREADS {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((file, chunk)) = order.get(i) else {
                        return;
                    };
                    if let Err(e) = file.ensure(*chunk) {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        next.store(order.len(), Ordering::Relaxed);
                        return;
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        self.memory.verify_whole()?;
        self.disk.verify_whole()?;
        self.import().map_err(|e| e.to_string())
    }

    /// The startup manifest's chunks of the memory file first (the pages a
    /// resume touches), then the rest of it, then the disk.
    fn order(&self) -> Vec<(&LazyFile, usize)> {
        let mut first = Vec::new();
        if let Some(manifest) = self.startup_manifest() {
            for run in &manifest.runs {
                for c in self.memory.chunk_of(run.offset)..=self.memory.chunk_of(run.end() - 1) {
                    if !first.contains(&c) {
                        first.push(c);
                    }
                }
            }
        }
        let rest = (0..self.memory.chunk_count()).filter(|c| !first.contains(c));
        let memory = first
            .iter()
            .copied()
            .chain(rest)
            .map(|c| (&*self.memory, c));
        let disk = (0..self.disk.chunk_count()).map(|c| (&*self.disk, c));
        memory.chain(disk).collect()
    }

    fn startup_manifest(&self) -> Option<Manifest> {
        let (path, desc) = (self.manifest.as_ref()?, self.view.record.manifest.as_ref()?);
        let bytes = std::fs::read(path).ok()?;
        Manifest::verify(&bytes, desc, self.view.record.guest_memory_size).ok()
    }

    /// Moves the whole files into the repository under the snapshot's id;
    /// the state and manifest are linked (the view keeps its copies).
    fn import(&self) -> Result<SnapshotRecord> {
        let tmp = self.repo.import_dir();
        let link = |from: &Path, what: &str| -> Result<PathBuf> {
            let to = tmp.join(format!(
                "lazy-{}-{what}.{:08x}",
                self.view.record.id,
                rand::random::<u32>()
            ));
            std::fs::hard_link(from, &to).ctx("linking a lazily fetched file", &to)?;
            Ok(to)
        };
        let files = BTreeMap::from([
            (MEMORY.to_string(), self.memory.path().to_path_buf()),
            (DISK.to_string(), self.disk.path().to_path_buf()),
            (STATE.to_string(), link(&self.state, "state")?),
        ]);
        let manifest = match &self.manifest {
            Some(m) => Some(link(m, "manifest")?),
            None => None,
        };
        Ok(self
            .repo
            .import(&self.view.record, &files, manifest.as_deref())?)
    }
}
