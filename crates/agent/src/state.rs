//! State shared by every request the agent serves.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::RwLock;

use crate::filesystem::FilesystemService;
use crate::process::ProcessService;
use crate::users::UserDb;

/// What `POST /init` sets: the defaults every later request inherits.
#[derive(Debug, Clone, Default)]
pub struct Defaults {
    /// Environment variables added to every process (after PATH/HOME/USER).
    pub env_vars: HashMap<String, String>,
    /// The user a request acts as when it names none (`root` until set).
    pub user: Option<String>,
    /// The working directory of processes that name none (the user's home
    /// until set).
    pub workdir: Option<String>,
    /// Once set, every request but `/health` must carry it as `X-Access-Token`.
    pub access_token: Option<String>,
}

/// Cloned into every handler; all fields are shared handles.
#[derive(Clone)]
pub struct AgentState {
    pub defaults: Arc<RwLock<Defaults>>,
    pub users: Arc<UserDb>,
    /// The `filesystem.Filesystem` service and its watcher table.
    pub filesystem: Arc<FilesystemService>,
    /// The `process.Process` service and its process table.
    pub processes: Arc<ProcessService>,
}

impl AgentState {
    /// Fresh state: no `/init` yet (no token, user `root`), no processes.
    pub fn new(users: UserDb) -> Self {
        let users = Arc::new(users);
        let defaults = Arc::new(RwLock::new(Defaults::default()));
        Self {
            filesystem: Arc::new(FilesystemService::new(users.clone())),
            processes: Arc::new(ProcessService::new(users.clone(), defaults.clone())),
            defaults,
            users,
        }
    }
}
