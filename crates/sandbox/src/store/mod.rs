//! The node's state in SQLite (`$SIESTA_HOME/siesta.db`): one row per
//! sandbox, its metadata in a table of its own so lists can filter on it.
//!
//! - [`schema`]: the schema version table and the migrations;
//! - [`rows`]: reading and writing sandbox rows;
//! - [`query`]: list filters, ordering and cursor pagination.
//!
//! The database runs in WAL mode with `synchronous=FULL`: a committed state
//! change (a pause above all) survives a `kill -9` of the server and a power
//! loss. Calls are short and synchronous; one connection behind a mutex is
//! plenty for one node.

mod idempotency;
mod query;
mod rows;
mod schema;

pub use idempotency::{KeyedCreate, IDEMPOTENCY_TTL_HOURS};
pub use query::{ListQuery, SortOrder, DEFAULT_LIMIT, MAX_LIMIT};
pub use schema::SCHEMA_VERSION;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rusqlite::Connection;

use crate::sandbox::{SandboxRecord, SandboxState};

/// File name of the database in the data directory.
pub const DB_FILE: &str = "siesta.db";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database {path}: {what}: {source}")]
    Sql {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("state database {path} has schema version {found}, newer than this siesta knows ({known}); upgrade siesta")]
    TooNew {
        path: PathBuf,
        found: u32,
        known: u32,
    },
    #[error("invalid list cursor (next token): {0}")]
    BadCursor(String),
}

pub type StoreResult<T> = std::result::Result<T, StoreError>;

/// Told of every committed row change, in commit order (the cluster
/// directory mirrors the rows into etcd, see `siesta-cluster`).
pub trait RowObserver: Send + Sync {
    /// Sandbox `id`'s row is now `row`; `None`: it was deleted.
    fn changed(&self, id: &str, row: Option<&crate::sandbox::SandboxRecord>);

    /// Paused sandbox `id`'s pause is in the object store as `snapshot`;
    /// `None`: no longer (resumed or killed). By default ignored.
    fn pause_stored(&self, _id: &str, _snapshot: Option<&str>) {}
}

pub struct Store {
    path: PathBuf,
    conn: Mutex<Connection>,
    observer: OnceLock<Arc<dyn RowObserver>>,
    /// The access token of every sandbox that is not dead, by id, kept in
    /// step with each write: a signed `/files` URL that names no sandbox is
    /// checked against these, so a keyless request reads no table (review
    /// M1.3).
    live_tokens: Mutex<HashMap<String, String>>,
}

impl Store {
    /// Opens (creating if needed) the database at `path` and brings its
    /// schema up to date.
    pub fn open(path: &Path) -> StoreResult<Self> {
        let conn = Connection::open(path).map_err(|source| StoreError::Sql {
            what: "opening",
            path: path.to_path_buf(),
            source,
        })?;
        Self::init(conn, path.to_path_buf())
    }

    /// A private in-memory database: benches and tests that keep no state.
    pub fn in_memory() -> StoreResult<Self> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Sql {
            what: "opening",
            path: path.clone(),
            source,
        })?;
        Self::init(conn, path)
    }

    fn init(mut conn: Connection, path: PathBuf) -> StoreResult<Self> {
        let sql = |what| {
            let path = path.clone();
            move |source| StoreError::Sql { what, path, source }
        };
        // WAL: readers never block the writer; FULL: a commit is on disk
        // when it returns (a paused sandbox must survive kill -9).
        let _mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(sql("enabling WAL"))?;
        conn.execute_batch(
            "PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; PRAGMA busy_timeout=5000;",
        )
        .map_err(sql("setting pragmas"))?;
        schema::migrate(&mut conn, &path)?;
        let live_tokens = rows::all_in(&conn)
            .map_err(sql("reading sandbox rows"))?
            .into_iter()
            .filter_map(|rec| live_token(&rec).map(|t| (rec.id.clone(), t.to_string())))
            .collect();
        Ok(Self {
            path,
            conn: Mutex::new(conn),
            observer: OnceLock::new(),
            live_tokens: Mutex::new(live_tokens),
        })
    }

    /// `(id, access token)` of every sandbox that is not dead and has a
    /// token, from memory.
    pub fn live_tokens(&self) -> Vec<(String, String)> {
        let tokens = self.live_tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens
            .iter()
            .map(|(id, token)| (id.clone(), token.clone()))
            .collect()
    }

    /// Keeps [`Store::live_tokens`] in step with a written (`Some`) or
    /// deleted (`None`) row.
    fn track_token(&self, id: &str, rec: Option<&SandboxRecord>) {
        let mut tokens = self.live_tokens.lock().unwrap_or_else(|p| p.into_inner());
        match rec.and_then(live_token) {
            Some(token) => tokens.insert(id.to_string(), token.to_string()),
            None => tokens.remove(id),
        };
    }

    /// Reports every row change from now on to `observer`, starting with
    /// the rows already there. Set once; a second observer is refused.
    pub fn set_observer(&self, observer: Arc<dyn RowObserver>) -> StoreResult<bool> {
        // Under the connection's lock: no write slips between the replay
        // and the observer taking over.
        let conn = self.lock();
        if self.observer.set(observer.clone()).is_err() {
            return Ok(false);
        }
        let rows = rows::all_in(&conn).map_err(self.err("reading sandbox rows"))?;
        for row in &rows {
            observer.changed(&row.id, Some(row));
        }
        Ok(true)
    }

    /// The observer set by [`Store::set_observer`], if any.
    pub fn observer(&self) -> Option<Arc<dyn RowObserver>> {
        self.observer.get().cloned()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version the database is at.
    pub fn version(&self) -> StoreResult<u32> {
        schema::current_version(&self.lock(), &self.path)
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves the connection usable:
        // every write is one transaction, rolled back if it did not finish.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, what: &'static str) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sql {
            what,
            path: self.path.clone(),
            source,
        }
    }
}

/// The token a signed URL of `rec` is made with, while it is alive.
fn live_token(rec: &SandboxRecord) -> Option<&str> {
    let alive = rec.state != SandboxState::Dead && !rec.access_token.is_empty();
    alive.then_some(rec.access_token.as_str())
}

/// Runs `f` with the state database on a blocking thread: SQLite waits
/// for its fsyncs, which must not stall an async worker.
pub async fn db<T, F>(store: &Arc<Store>, what: &str, f: F) -> crate::Result<T>
where
    F: FnOnce(&Store) -> StoreResult<T> + Send + 'static,
    T: Send + 'static,
{
    let store = Arc::clone(store);
    crate::blocking::run(what, move || Ok(f(&store)?)).await
}

#[cfg(test)]
mod tests;
