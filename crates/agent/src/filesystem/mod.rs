//! The `filesystem.Filesystem` service: stat, list, create, move, remove and
//! watch paths on behalf of a guest user.
//!
//! Paths are resolved against the user's home ([`paths::resolve`]); what the
//! service creates belongs to that user; a non-root user is held to the mode
//! bits ([`perm::Caller`]). Blocking filesystem calls run on tokio's blocking
//! pool so a slow disk cannot stall other requests.

pub mod entry;
pub mod paths;
pub mod perm;
pub mod watch;
pub mod watchers;
pub mod xattr;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::stream::BoxStream;
use siesta_envd_proto::filesystem::*;

use crate::rpc::{Code, RequestContext, RpcError};
use crate::users::UserDb;
use entry::Names;
use perm::Caller;

/// The filesystem service; one per agent, shared by all requests.
pub struct FilesystemService {
    users: Arc<UserDb>,
    watchers: watchers::WatcherTable,
}

impl FilesystemService {
    pub fn new(users: Arc<UserDb>) -> Self {
        Self {
            users,
            watchers: watchers::WatcherTable::default(),
        }
    }

    /// The request's user and the absolute path it means by `raw`.
    fn resolve(&self, ctx: &RequestContext, raw: &str) -> Result<(Caller, PathBuf), RpcError> {
        let caller = Caller::lookup(&self.users, &ctx.user)?;
        let path = paths::resolve(raw, &caller.user.home);
        Ok((caller, path))
    }

    /// Runs `f` on the blocking pool with this service's user database.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&UserDb) -> Result<T, RpcError> + Send + 'static,
    ) -> Result<T, RpcError> {
        let users = Arc::clone(&self.users);
        tokio::task::spawn_blocking(move || f(&users))
            .await
            .map_err(|e| RpcError::internal(format!("filesystem task failed: {e}")))?
    }

    pub async fn stat(
        &self,
        ctx: &RequestContext,
        req: StatRequest,
    ) -> Result<StatResponse, RpcError> {
        let (_, path) = self.resolve(ctx, &req.path)?;
        self.blocking(move |db| {
            let entry = describe(&path, &mut Names::new(db))?;
            Ok(StatResponse { entry: Some(entry) })
        })
        .await
    }

    pub async fn make_dir(
        &self,
        ctx: &RequestContext,
        req: MakeDirRequest,
    ) -> Result<MakeDirResponse, RpcError> {
        let (caller, path) = self.resolve(ctx, &req.path)?;
        self.blocking(move |db| {
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => {
                    // The SDK turns this code into `make_dir() == False`.
                    return Err(RpcError::new(
                        Code::AlreadyExists,
                        format!("directory {} already exists", path.display()),
                    ));
                }
                Ok(_) => {
                    return Err(RpcError::invalid_argument(format!(
                        "{} exists and is not a directory",
                        path.display()
                    )))
                }
                Err(_) => {}
            }
            caller
                .check_write(&path, false)
                .map_err(|e| io_err(&e, &path))?;
            caller.ensure_dirs(&path).map_err(|e| io_err(&e, &path))?;
            let entry = describe(&path, &mut Names::new(db))?;
            Ok(MakeDirResponse { entry: Some(entry) })
        })
        .await
    }

    pub async fn move_(
        &self,
        ctx: &RequestContext,
        req: MoveRequest,
    ) -> Result<MoveResponse, RpcError> {
        let (caller, source) = self.resolve(ctx, &req.source)?;
        let (_, destination) = self.resolve(ctx, &req.destination)?;
        self.blocking(move |db| {
            std::fs::symlink_metadata(&source).map_err(|e| io_err(&e, &source))?;
            caller
                .check_write(&source, false)
                .map_err(|e| io_err(&e, &source))?;
            caller
                .check_write(&destination, false)
                .map_err(|e| io_err(&e, &destination))?;
            if let Some(parent) = destination.parent() {
                caller.ensure_dirs(parent).map_err(|e| io_err(&e, parent))?;
            }
            std::fs::rename(&source, &destination).map_err(|e| io_err(&e, &source))?;
            let entry = describe(&destination, &mut Names::new(db))?;
            Ok(MoveResponse { entry: Some(entry) })
        })
        .await
    }

    pub async fn list_dir(
        &self,
        ctx: &RequestContext,
        req: ListDirRequest,
    ) -> Result<ListDirResponse, RpcError> {
        let (caller, path) = self.resolve(ctx, &req.path)?;
        // envd treats depth 0 as 1: the direct children.
        let depth = req.depth.max(1);
        self.blocking(move |db| {
            let meta = std::fs::metadata(&path).map_err(|e| io_err(&e, &path))?;
            if !meta.is_dir() {
                return Err(RpcError::invalid_argument(format!(
                    "{} is not a directory",
                    path.display()
                )));
            }
            caller.check_read(&path).map_err(|e| io_err(&e, &path))?;
            let mut entries = Vec::new();
            walk(&path, depth, &mut Names::new(db), &mut entries)?;
            Ok(ListDirResponse { entries })
        })
        .await
    }

    pub async fn remove(
        &self,
        ctx: &RequestContext,
        req: RemoveRequest,
    ) -> Result<RemoveResponse, RpcError> {
        let (caller, path) = self.resolve(ctx, &req.path)?;
        self.blocking(move |_| {
            // Removing what is not there succeeds, as in envd: the goal
            // (it is gone) holds.
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RemoveResponse {}),
                Err(e) => return Err(io_err(&e, &path)),
            };
            caller
                .check_write(&path, false)
                .map_err(|e| io_err(&e, &path))?;
            let res = if meta.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            res.map_err(|e| io_err(&e, &path))?;
            Ok(RemoveResponse {})
        })
        .await
    }

    /// Starts an inotify watch for a request carrying watch options.
    fn start_watch(
        &self,
        ctx: &RequestContext,
        raw: &str,
        opts: watch::WatchOptions,
    ) -> Result<tokio::sync::mpsc::Receiver<FilesystemEvent>, RpcError> {
        let (caller, path) = self.resolve(ctx, raw)?;
        caller.check_read(&path).map_err(|e| io_err(&e, &path))?;
        watch::start(path, opts, Arc::clone(&self.users))
    }

    pub async fn watch_dir(
        &self,
        ctx: &RequestContext,
        req: WatchDirRequest,
    ) -> Result<BoxStream<'static, Result<WatchDirResponse, RpcError>>, RpcError> {
        let opts = watch::WatchOptions {
            recursive: req.recursive,
            include_entry: req.include_entry,
            allow_network_mounts: req.allow_network_mounts,
        };
        let rx = self.start_watch(ctx, &req.path, opts)?;
        let keepalive = ctx.keepalive.unwrap_or(watchers::DEFAULT_KEEPALIVE);
        Ok(watchers::stream(rx, keepalive))
    }

    pub async fn create_watcher(
        &self,
        ctx: &RequestContext,
        req: CreateWatcherRequest,
    ) -> Result<CreateWatcherResponse, RpcError> {
        let opts = watch::WatchOptions {
            recursive: req.recursive,
            include_entry: req.include_entry,
            allow_network_mounts: req.allow_network_mounts,
        };
        let rx = self.start_watch(ctx, &req.path, opts)?;
        Ok(CreateWatcherResponse {
            watcher_id: self.watchers.insert(rx),
        })
    }

    pub async fn get_watcher_events(
        &self,
        _ctx: &RequestContext,
        req: GetWatcherEventsRequest,
    ) -> Result<GetWatcherEventsResponse, RpcError> {
        Ok(GetWatcherEventsResponse {
            events: self.watchers.drain(&req.watcher_id)?,
        })
    }

    pub async fn remove_watcher(
        &self,
        _ctx: &RequestContext,
        req: RemoveWatcherRequest,
    ) -> Result<RemoveWatcherResponse, RpcError> {
        self.watchers.remove(&req.watcher_id)?;
        Ok(RemoveWatcherResponse {})
    }
}

fn io_err(e: &std::io::Error, path: &Path) -> RpcError {
    RpcError::from_io(e, &path.display().to_string())
}

fn describe(path: &Path, names: &mut Names<'_>) -> Result<EntryInfo, RpcError> {
    entry::describe(path, names).map_err(|e| io_err(&e, path))
}

/// Appends the entries below `dir` down to `depth` levels (1 = children),
/// depth-first in name order so listings are stable. Symlinked directories
/// are listed but not entered; entries that vanish mid-walk are skipped.
fn walk(
    dir: &Path,
    depth: u32,
    names: &mut Names<'_>,
    out: &mut Vec<EntryInfo>,
) -> Result<(), RpcError> {
    let mut children: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| io_err(&e, dir))?
        .filter_map(Result::ok)
        .collect();
    children.sort_by_key(|c| c.file_name());
    for child in children {
        let path = child.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        out.push(entry::from_metadata(&path, &meta, names));
        if depth > 1 && entry::is_real_dir(&meta.file_type()) {
            // An unreadable subdirectory is listed but not entered.
            let _ = walk(&path, depth - 1, names, out);
        }
    }
    Ok(())
}
