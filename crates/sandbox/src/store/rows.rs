//! Sandbox rows: write a whole record (row and metadata) in one
//! transaction, read records back.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension, Row};

use siesta_net::EgressPolicy;

use super::{Store, StoreResult};
use crate::sandbox::{Lifecycle, SandboxRecord, SandboxState};

/// The columns every read selects, in the order [`from_row`] expects.
pub(super) const COLUMNS: &str = "id, template, state, created_us, started_us, end_us, \
     access_token, env_vars, allow_internet, cpu_count, memory_mb, disk_size_mb, \
     on_timeout, auto_resume, agent_addr, vmm_pid, timings, dead_reason, guest_defaults, \
     egress_rules, traffic_token, volume_mounts, pause_filesystem_only, paused_disk_only";

impl Store {
    /// Inserts or replaces `rec` and its metadata, atomically.
    pub fn put(&self, rec: &SandboxRecord) -> StoreResult<()> {
        let mut conn = self.lock();
        let tx = conn.transaction().map_err(self.err("starting write"))?;
        upsert(&tx, rec).map_err(self.err("writing sandbox row"))?;
        tx.execute(
            "DELETE FROM sandbox_metadata WHERE sandbox_id = ?1",
            [&rec.id],
        )
        .map_err(self.err("clearing sandbox metadata"))?;
        for (k, v) in &rec.metadata {
            tx.execute(
                "INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES (?1, ?2, ?3)",
                params![rec.id, k, v],
            )
            .map_err(self.err("writing sandbox metadata"))?;
        }
        tx.commit().map_err(self.err("committing sandbox row"))?;
        self.track_token(&rec.id, Some(rec));
        // Still under the lock: observers see changes in commit order.
        if let Some(observer) = self.observer.get() {
            observer.changed(&rec.id, Some(rec));
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> StoreResult<Option<SandboxRecord>> {
        let conn = self.lock();
        let sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1");
        let rec = conn
            .query_row(&sql, [id], from_row)
            .optional()
            .map_err(self.err("reading sandbox row"))?;
        match rec {
            Some(mut rec) => {
                rec.metadata = metadata_of(&conn, id).map_err(self.err("reading metadata"))?;
                Ok(Some(rec))
            }
            None => Ok(None),
        }
    }

    /// Every sandbox, oldest first.
    pub fn all(&self) -> StoreResult<Vec<SandboxRecord>> {
        all_in(&self.lock()).map_err(self.err("reading sandbox rows"))
    }

    /// How many sandboxes are in `state`: every row, not a page.
    pub fn count(&self, state: SandboxState) -> StoreResult<u64> {
        let n: i64 = self
            .lock()
            .query_row(
                "SELECT COUNT(*) FROM sandboxes WHERE state = ?1",
                [state.as_str()],
                |row| row.get(0),
            )
            .map_err(self.err("counting sandboxes"))?;
        Ok(n.max(0) as u64)
    }

    /// Deletes the row (its metadata goes with it); false if there was none.
    pub fn delete(&self, id: &str) -> StoreResult<bool> {
        let conn = self.lock();
        let n = conn
            .execute("DELETE FROM sandboxes WHERE id = ?1", [id])
            .map_err(self.err("deleting sandbox row"))?;
        self.track_token(id, None);
        if let (true, Some(observer)) = (n > 0, self.observer.get()) {
            observer.changed(id, None);
        }
        Ok(n > 0)
    }

    /// Ids of running sandboxes whose deadline is at or before `now`.
    pub fn expired(&self, now: DateTime<Utc>) -> StoreResult<Vec<String>> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT id FROM sandboxes WHERE state = 'running' AND end_us <= ?1 ORDER BY end_us",
            )
            .map_err(self.err("preparing deadline query"))?;
        let ids = stmt
            .query_map([now.timestamp_micros()], |r| r.get(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
            .map_err(self.err("reading deadlines"))?;
        Ok(ids)
    }
}

fn upsert(conn: &Connection, r: &SandboxRecord) -> rusqlite::Result<usize> {
    let env = serde_json::to_string(&r.env_vars).map_err(to_sql_err)?;
    let timings = r
        .timings
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(to_sql_err)?;
    let defaults = serde_json::to_string(&r.guest_defaults).map_err(to_sql_err)?;
    let egress_rules = r
        .egress
        .has_rules()
        .then(|| serde_json::to_string(&r.egress))
        .transpose()
        .map_err(to_sql_err)?;
    let volume_mounts = (!r.volume_mounts.is_empty())
        .then(|| serde_json::to_string(&r.volume_mounts))
        .transpose()
        .map_err(to_sql_err)?;
    conn.execute(
        &format!(
            "INSERT OR REPLACE INTO sandboxes ({COLUMNS}) VALUES \
             (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)"
        ),
        params![
            r.id,
            r.template,
            r.state.as_str(),
            r.created_at.timestamp_micros(),
            r.started_at.timestamp_micros(),
            r.end_at.timestamp_micros(),
            r.access_token,
            env,
            r.egress.allow_internet,
            r.cpu_count,
            r.memory_mb,
            r.disk_size_mb as i64,
            r.lifecycle.on_timeout.as_str(),
            r.lifecycle.auto_resume,
            r.agent_addr.map(|a| a.to_string()),
            r.vmm_pid,
            timings,
            r.dead_reason,
            defaults,
            egress_rules,
            r.traffic_token,
            volume_mounts,
            r.lifecycle.filesystem_only,
            r.paused_disk_only,
        ],
    )
}

/// The egress policy: its rules (column `rules`, absent before schema 3)
/// with the internet switch of column `allow`.
fn egress(row: &Row<'_>, allow: usize, rules: usize) -> rusqlite::Result<EgressPolicy> {
    let mut policy: EgressPolicy = json(row, rules)?.unwrap_or_default();
    policy.allow_internet = row.get(allow)?;
    Ok(policy)
}

fn to_sql_err(e: serde_json::Error) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

/// Runs a `SELECT {COLUMNS} ...` and attaches each row's metadata.
/// Every sandbox, oldest first.
pub(super) fn all_in(conn: &Connection) -> rusqlite::Result<Vec<SandboxRecord>> {
    let sql = format!("SELECT {COLUMNS} FROM sandboxes ORDER BY created_us, id");
    read_all(conn, &sql, [])
}

pub(super) fn read_all(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<SandboxRecord>> {
    let mut stmt = conn.prepare(sql)?;
    let mut out = stmt
        .query_map(params, from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for rec in &mut out {
        rec.metadata = metadata_of(conn, &rec.id)?;
    }
    Ok(out)
}

fn metadata_of(conn: &Connection, id: &str) -> rusqlite::Result<HashMap<String, String>> {
    let mut stmt =
        conn.prepare_cached("SELECT key, value FROM sandbox_metadata WHERE sandbox_id = ?1")?;
    let pairs = stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    pairs.collect()
}

fn parsed<T: std::str::FromStr>(row: &Row, idx: usize) -> rusqlite::Result<T>
where
    T::Err: std::fmt::Display,
{
    let s: String = row.get(idx)?;
    s.parse::<T>().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, e.to_string().into())
    })
}

fn json<T: serde::de::DeserializeOwned>(row: &Row, idx: usize) -> rusqlite::Result<Option<T>> {
    let s: Option<String> = row.get(idx)?;
    s.map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
}

fn time(row: &Row, idx: usize) -> rusqlite::Result<DateTime<Utc>> {
    let us: i64 = row.get(idx)?;
    DateTime::from_timestamp_micros(us).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(idx, Type::Integer, "time out of range".into())
    })
}

/// One row in [`COLUMNS`] order; metadata is read separately.
pub(super) fn from_row(row: &Row) -> rusqlite::Result<SandboxRecord> {
    let disk: i64 = row.get(11)?;
    let addr: Option<String> = row.get(14)?;
    let agent_addr =
        addr.map(|a| a.parse())
            .transpose()
            .map_err(|e: std::net::AddrParseError| {
                rusqlite::Error::FromSqlConversionFailure(14, Type::Text, Box::new(e))
            })?;
    Ok(SandboxRecord {
        id: row.get(0)?,
        template: row.get(1)?,
        state: parsed(row, 2)?,
        created_at: time(row, 3)?,
        started_at: time(row, 4)?,
        end_at: time(row, 5)?,
        access_token: row.get(6)?,
        env_vars: json(row, 7)?.unwrap_or_default(),
        egress: egress(row, 8, 19)?,
        cpu_count: row.get(9)?,
        memory_mb: row.get(10)?,
        disk_size_mb: disk.max(0) as u64,
        lifecycle: Lifecycle {
            on_timeout: parsed(row, 12)?,
            auto_resume: row.get(13)?,
            filesystem_only: row.get::<_, Option<bool>>(22)?.unwrap_or(false),
        },
        agent_addr,
        vmm_pid: row.get(15)?,
        timings: json(row, 16)?,
        dead_reason: row.get(17)?,
        guest_defaults: json(row, 18)?.unwrap_or_default(),
        traffic_token: row.get(20)?,
        volume_mounts: json(row, 21)?.unwrap_or_default(),
        paused_disk_only: row.get::<_, Option<bool>>(23)?.unwrap_or(false),
        metadata: HashMap::new(),
    })
}
