//! The node's volumes: records in SQLite, files in a directory each.
//!
//! A create makes the volume's directories first and then commits its row;
//! a delete removes the row first and then the files. So a crash in the
//! middle leaves at most a directory without a row, which [`Volumes::open`]
//! removes: a volume exists exactly when its row does.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, OptionalExtension};

use crate::content::VolumeFs;
use crate::error::{io, VolumeError, VolumeResult};
use crate::DEFAULT_OWNER;

/// Size limit of a volume created without one (10 GiB).
pub const DEFAULT_SIZE_LIMIT_MIB: u64 = 10 * 1024;

const DB_FILE: &str = "volumes.db";
/// Volume ids start with this (and 80 random bits follow).
const ID_PREFIX: &str = "vol-";
const MAX_NAME_LEN: usize = 64;

/// One volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: String,
    pub name: String,
    /// The bearer token of the volume content API for this volume.
    pub token: String,
    pub size_limit_bytes: u64,
    pub created_at: DateTime<Utc>,
}

impl VolumeRecord {
    /// Whether `given` is this volume's token (in constant time).
    pub fn token_matches(&self, given: &str) -> bool {
        use subtle::ConstantTimeEq;
        self.token.as_bytes().ct_eq(given.as_bytes()).into()
    }
}

/// The registry of a node's volumes under one directory.
pub struct Volumes {
    root: PathBuf,
    db_path: PathBuf,
    db: Mutex<Connection>,
    default_limit_bytes: u64,
}

impl std::fmt::Debug for Volumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volumes").field("root", &self.root).finish()
    }
}

impl Volumes {
    /// Opens (creating) the registry under `root`, removing what a crash
    /// left: directories of volumes that have no row, and half uploads.
    pub fn open(root: &Path, default_limit_mib: u64) -> VolumeResult<Self> {
        if default_limit_mib == 0 {
            return Err(VolumeError::BadLimit(
                "the default size limit must be at least 1 MiB".into(),
            ));
        }
        std::fs::create_dir_all(root).map_err(io("creating volume directory", root))?;
        // Only the server goes in: volume files are whatever guests and
        // token holders made them, and no other host user should run,
        // read or link to them. Also when an older siesta made it 0755.
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
            .map_err(io("restricting the volume directory to its owner", root))?;
        let db_path = root.join(DB_FILE);
        let sql = |what| {
            let path = db_path.clone();
            move |source| VolumeError::Sql { what, path, source }
        };
        let conn = Connection::open(&db_path).map_err(sql("opening"))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
             CREATE TABLE IF NOT EXISTS volumes (
                 id TEXT PRIMARY KEY,
                 name TEXT NOT NULL UNIQUE,
                 token TEXT NOT NULL,
                 size_limit_bytes INTEGER NOT NULL,
                 created_at TEXT NOT NULL
             );",
        )
        .map_err(sql("creating the volumes table"))?;
        let volumes = Self {
            root: root.to_path_buf(),
            db_path,
            db: Mutex::new(conn),
            default_limit_bytes: default_limit_mib * 1024 * 1024,
        };
        volumes.remove_leftovers()?;
        Ok(volumes)
    }

    /// Creates volume `name`, with `size_limit_mib` or the default limit.
    pub fn create(&self, name: &str, size_limit_mib: Option<u64>) -> VolumeResult<VolumeRecord> {
        validate_name(name)?;
        let size_limit_bytes = match size_limit_mib {
            Some(0) => {
                return Err(VolumeError::BadLimit(
                    "a volume needs at least 1 MiB".into(),
                ))
            }
            Some(mib) => mib
                .checked_mul(1024 * 1024)
                .ok_or_else(|| VolumeError::BadLimit(format!("{mib} MiB is too large")))?,
            None => self.default_limit_bytes,
        };
        let record = VolumeRecord {
            id: format!("{ID_PREFIX}{}", hex::encode(rand::random::<[u8; 10]>())),
            name: name.to_string(),
            token: hex::encode(rand::random::<[u8; 32]>()),
            size_limit_bytes,
            created_at: Utc::now(),
        };
        let db = self.db();
        if self.find(&db, name)?.is_some() {
            return Err(VolumeError::NameTaken(name.to_string()));
        }
        self.make_dirs(&record.id)?;
        let inserted = db.execute(
            "INSERT INTO volumes (id, name, token, size_limit_bytes, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                record.id,
                record.name,
                record.token,
                record.size_limit_bytes as i64,
                record.created_at.to_rfc3339()
            ],
        );
        if let Err(source) = inserted {
            let _ = std::fs::remove_dir_all(self.dir(&record.id));
            return Err(VolumeError::Sql {
                what: "adding a volume",
                path: self.db_path.clone(),
                source,
            });
        }
        Ok(record)
    }

    /// Every volume, oldest first.
    pub fn list(&self) -> VolumeResult<Vec<VolumeRecord>> {
        let db = self.db();
        let mut stmt = db
            .prepare("SELECT id, name, token, size_limit_bytes, created_at FROM volumes ORDER BY created_at, id")
            .map_err(|source| self.sql("listing volumes", source))?;
        let rows = stmt
            .query_map([], row_to_record)
            .map_err(|source| self.sql("listing volumes", source))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|source| self.sql("listing volumes", source))
    }

    /// The volume with this id or name.
    pub fn get(&self, id_or_name: &str) -> VolumeResult<VolumeRecord> {
        let db = self.db();
        self.find(&db, id_or_name)?
            .ok_or_else(|| VolumeError::NotFound(id_or_name.to_string()))
    }

    /// Deletes a volume and its files; gives what it was.
    pub fn delete(&self, id_or_name: &str) -> VolumeResult<VolumeRecord> {
        let record = {
            let db = self.db();
            let record = self
                .find(&db, id_or_name)?
                .ok_or_else(|| VolumeError::NotFound(id_or_name.to_string()))?;
            db.execute("DELETE FROM volumes WHERE id = ?1", params![record.id])
                .map_err(|source| self.sql("deleting a volume", source))?;
            record
        };
        let dir = self.dir(&record.id);
        std::fs::remove_dir_all(&dir).map_err(io("removing volume directory", &dir))?;
        Ok(record)
    }

    /// The files of `record`'s volume.
    pub fn content(&self, record: &VolumeRecord) -> VolumeResult<VolumeFs> {
        let open = |sub: &str| {
            let path = self.dir(&record.id).join(sub);
            Dir::open_ambient_dir(&path, ambient_authority())
                .map_err(io("opening volume directory", path))
        };
        Ok(VolumeFs::new(
            record.name.clone(),
            open("data")?,
            open("tmp")?,
            record.size_limit_bytes,
        ))
    }

    /// The volume as an NFS file system, for one mount in one sandbox.
    pub fn nfs(&self, record: &VolumeRecord) -> VolumeResult<crate::nfs::VolumeNfs> {
        let path = self.dir(&record.id).join("data");
        let root = Dir::open_ambient_dir(&path, ambient_authority())
            .map_err(io("opening volume directory", &path))?;
        crate::nfs::VolumeNfs::new(&record.name, &record.id, root, record.size_limit_bytes)
            .map_err(io("serving volume directory", path))
    }

    /// The host directory holding the volume's files (what an NFS export
    /// serves).
    pub fn data_dir(&self, record: &VolumeRecord) -> PathBuf {
        self.dir(&record.id).join("data")
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    fn make_dirs(&self, id: &str) -> VolumeResult<()> {
        let data = self.dir(id).join("data");
        let tmp = self.dir(id).join("tmp");
        for dir in [&data, &tmp] {
            std::fs::create_dir_all(dir).map_err(io("creating volume directory", dir))?;
        }
        std::os::unix::fs::chown(&data, Some(DEFAULT_OWNER.0), Some(DEFAULT_OWNER.1))
            .map_err(io("setting the owner of", &data))?;
        Ok(())
    }

    fn find(&self, db: &Connection, id_or_name: &str) -> VolumeResult<Option<VolumeRecord>> {
        db.query_row(
            "SELECT id, name, token, size_limit_bytes, created_at FROM volumes WHERE id = ?1 OR name = ?1",
            params![id_or_name],
            row_to_record,
        )
        .optional()
        .map_err(|source| self.sql("looking up a volume", source))
    }

    /// Removes volume directories without a row and stale uploads.
    fn remove_leftovers(&self) -> VolumeResult<()> {
        let known: Vec<String> = self.list()?.into_iter().map(|r| r.id).collect();
        let entries = std::fs::read_dir(&self.root).map_err(io("listing", &self.root))?;
        for entry in entries {
            let entry = entry.map_err(io("listing", &self.root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(ID_PREFIX) {
                continue;
            }
            let path = entry.path();
            if known.contains(&name) {
                let tmp = path.join("tmp");
                let _ = std::fs::remove_dir_all(&tmp);
                std::fs::create_dir_all(&tmp).map_err(io("creating volume directory", &tmp))?;
            } else {
                tracing::warn!(
                    path = %path.display(),
                    "removing a volume directory without a record (a create or delete that did not finish)"
                );
                std::fs::remove_dir_all(&path)
                    .map_err(io("removing the remains of a volume", &path))?;
            }
        }
        Ok(())
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite half-written
        // (each statement is atomic), so a poisoned lock is still usable.
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sql(&self, what: &'static str, source: rusqlite::Error) -> VolumeError {
        VolumeError::Sql {
            what,
            path: self.db_path.clone(),
            source,
        }
    }
}

fn row_to_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<VolumeRecord> {
    let created: String = row.get(4)?;
    Ok(VolumeRecord {
        id: row.get(0)?,
        name: row.get(1)?,
        token: row.get(2)?,
        size_limit_bytes: row.get::<_, i64>(3)?.max(0) as u64,
        created_at: DateTime::parse_from_rfc3339(&created)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default(),
    })
}

/// Names: 1-64 of `A-Z a-z 0-9 - _ .`, starting with a letter or digit.
/// A name equal to an existing volume's id is taken (look-ups match both).
fn validate_name(name: &str) -> VolumeResult<()> {
    let bad = |why| {
        Err(VolumeError::BadName {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return bad("a name has 1 to 64 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return bad("use letters, digits, '-', '_' and '.'");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return bad("a name starts with a letter or a digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["data", "my-vol_1.2", "A"] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "-x", ".x", "a/b", "a b", &"x".repeat(65), "ü"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
