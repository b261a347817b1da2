//! Schema and migrations. The database records the versions applied in
//! `schema_version`; each migration runs once, in its own transaction, so a
//! crash mid-migration leaves the previous version intact.

use std::path::Path;

use rusqlite::Connection;

use super::{StoreError, StoreResult};

/// Migrations in order; migration `i` brings the schema to version `i + 1`.
/// Never edit a released one: add a new one.
const MIGRATIONS: &[&str] = &[
    // 1: sandboxes and their metadata.
    "CREATE TABLE sandboxes (
        id            TEXT PRIMARY KEY,
        template      TEXT NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('running', 'paused', 'dead')),
        created_us    INTEGER NOT NULL,
        started_us    INTEGER NOT NULL,
        end_us        INTEGER NOT NULL,
        access_token  TEXT NOT NULL,
        env_vars      TEXT NOT NULL,
        allow_internet INTEGER NOT NULL,
        cpu_count     INTEGER NOT NULL,
        memory_mb     INTEGER NOT NULL,
        disk_size_mb  INTEGER NOT NULL,
        on_timeout    TEXT NOT NULL CHECK (on_timeout IN ('pause', 'kill')),
        auto_resume   INTEGER NOT NULL,
        agent_addr    TEXT,
        vmm_pid       INTEGER,
        timings       TEXT,
        dead_reason   TEXT
    );
    CREATE INDEX sandboxes_by_start ON sandboxes (started_us, id);
    CREATE INDEX sandboxes_by_deadline ON sandboxes (state, end_us);
    CREATE TABLE sandbox_metadata (
        sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
        key        TEXT NOT NULL,
        value      TEXT NOT NULL,
        PRIMARY KEY (sandbox_id, key)
    );
    CREATE INDEX sandbox_metadata_by_pair ON sandbox_metadata (key, value);",
    // 2: the default user and working directory from the template (JSON
    // `GuestDefaults`; NULL is E2B's user `user` in /home/user).
    "ALTER TABLE sandboxes ADD COLUMN guest_defaults TEXT;",
    // 3: the egress policy's address rules (JSON `EgressPolicy`; NULL is
    // `allow_internet` alone).
    "ALTER TABLE sandboxes ADD COLUMN egress_rules TEXT;",
    // 4: the traffic access token its ports require (NULL: public).
    "ALTER TABLE sandboxes ADD COLUMN traffic_token TEXT;",
    // 5: idempotency keys of creates (no foreign key: the key outlives a
    // killed sandbox's row for its TTL).
    "CREATE TABLE idempotency_keys (
        key            TEXT PRIMARY KEY,
        sandbox_id     TEXT NOT NULL,
        request_sha256 TEXT NOT NULL,
        created_us     INTEGER NOT NULL
    );
    CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_us);",
    // 6: volume mounts (JSON array of `VolumeMount`; NULL is none).
    "ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT;",
    // 7: filesystem-only pauses: the lifecycle's choice for timeouts, and
    // whether the present pause kept only the disk (NULL: no).
    "ALTER TABLE sandboxes ADD COLUMN pause_filesystem_only INTEGER;
     ALTER TABLE sandboxes ADD COLUMN paused_disk_only INTEGER;",
];

/// The version this build creates and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

fn sql<'a>(what: &'static str, path: &'a Path) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
    move |source| StoreError::Sql {
        what,
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn current_version(conn: &Connection, path: &Path) -> StoreResult<u32> {
    conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        [],
        |r| r.get(0),
    )
    .map_err(sql("reading schema version", path))
}

/// Applies the migrations the database lacks; refuses a newer database.
pub(super) fn migrate(conn: &mut Connection, path: &Path) -> StoreResult<()> {
    apply(conn, path, MIGRATIONS)
}

fn apply(conn: &mut Connection, path: &Path, migrations: &[&str]) -> StoreResult<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
            version    INTEGER PRIMARY KEY,
            applied_at TEXT NOT NULL
        )",
    )
    .map_err(sql("creating schema_version", path))?;
    let found = current_version(conn, path)?;
    let known = migrations.len() as u32;
    if found > known {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found,
            known,
        });
    }
    for (i, step) in migrations.iter().enumerate().skip(found as usize) {
        let version = i as u32 + 1;
        let tx = conn
            .transaction()
            .map_err(sql("starting migration", path))?;
        tx.execute_batch(step).map_err(sql("migrating", path))?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            rusqlite::params![version, chrono::Utc::now().to_rfc3339()],
        )
        .map_err(sql("recording schema version", path))?;
        tx.commit().map_err(sql("committing migration", path))?;
        tracing::info!(db = %path.display(), version, "state database migrated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_run_once_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut conn = Connection::open(&path).unwrap();
        let first = ["CREATE TABLE a (x INTEGER)"];
        apply(&mut conn, &path, &first).unwrap();
        assert_eq!(current_version(&conn, &path).unwrap(), 1);
        // Re-running is a no-op (would fail: table a exists).
        apply(&mut conn, &path, &first).unwrap();
        let both = [
            "CREATE TABLE a (x INTEGER)",
            "ALTER TABLE a ADD COLUMN y TEXT",
        ];
        apply(&mut conn, &path, &both).unwrap();
        assert_eq!(current_version(&conn, &path).unwrap(), 2);
        conn.execute("INSERT INTO a (x, y) VALUES (1, 'z')", [])
            .unwrap();
    }

    #[test]
    fn a_failed_migration_leaves_the_previous_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut conn = Connection::open(&path).unwrap();
        let bad = ["CREATE TABLE a (x INTEGER)", "CREATE TABLE b (; nonsense"];
        assert!(apply(&mut conn, &path, &bad).is_err());
        assert_eq!(current_version(&conn, &path).unwrap(), 1);
    }

    #[test]
    fn a_newer_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut conn = Connection::open(&path).unwrap();
        apply(&mut conn, &path, &["SELECT 1", "SELECT 2"]).unwrap();
        let err = apply(&mut conn, &path, &["SELECT 1"]).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::TooNew {
                    found: 2,
                    known: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn the_real_schema_applies_to_a_file_database() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::Store::open(&dir.path().join("siesta.db")).unwrap();
        assert_eq!(store.version().unwrap(), SCHEMA_VERSION);
        drop(store);
        // Reopening finds it up to date.
        let store = super::super::Store::open(&dir.path().join("siesta.db")).unwrap();
        assert_eq!(store.version().unwrap(), SCHEMA_VERSION);
    }
}
