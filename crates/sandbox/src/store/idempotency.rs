//! Idempotency keys of creates (E2B's `Idempotency-Key`): which sandbox a
//! key made, and a digest of the request it came with, kept for
//! [`IDEMPOTENCY_TTL_HOURS`] so that a retried create finds its sandbox
//! even after a server restart.

use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension};

use super::{Store, StoreResult};

/// How long a key is remembered.
pub const IDEMPOTENCY_TTL_HOURS: i64 = 24;

/// What a key made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedCreate {
    pub sandbox_id: String,
    /// SHA-256 (hex) of the request body the key first came with.
    pub request_sha256: String,
    pub created_at: DateTime<Utc>,
}

impl Store {
    /// The sandbox `key` made, unless that was longer ago than the TTL.
    pub fn keyed_create(&self, key: &str, now: DateTime<Utc>) -> StoreResult<Option<KeyedCreate>> {
        let oldest = (now - chrono::Duration::hours(IDEMPOTENCY_TTL_HOURS)).timestamp_micros();
        self.lock()
            .query_row(
                "SELECT sandbox_id, request_sha256, created_us FROM idempotency_keys \
                 WHERE key = ?1 AND created_us >= ?2",
                params![key, oldest],
                |row| {
                    let us: i64 = row.get(2)?;
                    Ok(KeyedCreate {
                        sandbox_id: row.get(0)?,
                        request_sha256: row.get(1)?,
                        created_at: DateTime::from_timestamp_micros(us).unwrap_or(now),
                    })
                },
            )
            .optional()
            .map_err(self.err("reading idempotency key"))
    }

    /// Remembers that `key` made `made`, and forgets keys past the TTL.
    pub fn put_keyed_create(&self, key: &str, made: &KeyedCreate) -> StoreResult<()> {
        let oldest =
            (made.created_at - chrono::Duration::hours(IDEMPOTENCY_TTL_HOURS)).timestamp_micros();
        let mut conn = self.lock();
        let tx = conn.transaction().map_err(self.err("starting write"))?;
        tx.execute(
            "DELETE FROM idempotency_keys WHERE created_us < ?1",
            [oldest],
        )
        .map_err(self.err("pruning idempotency keys"))?;
        tx.execute(
            "INSERT OR REPLACE INTO idempotency_keys (key, sandbox_id, request_sha256, created_us) \
             VALUES (?1, ?2, ?3, ?4)",
            params![
                key,
                made.sandbox_id,
                made.request_sha256,
                made.created_at.timestamp_micros()
            ],
        )
        .map_err(self.err("writing idempotency key"))?;
        tx.commit().map_err(self.err("committing idempotency key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_kept_until_its_ttl() {
        let s = Store::in_memory().unwrap();
        let t0 = Utc::now();
        let made = KeyedCreate {
            sandbox_id: "sb1".into(),
            request_sha256: "ab".into(),
            created_at: t0,
        };
        s.put_keyed_create("k1", &made).unwrap();
        let got = s.keyed_create("k1", t0).unwrap().unwrap();
        assert_eq!(got.sandbox_id, "sb1");
        assert_eq!(got.request_sha256, "ab");
        assert!(s.keyed_create("k2", t0).unwrap().is_none());
        let later = t0 + chrono::Duration::hours(IDEMPOTENCY_TTL_HOURS + 1);
        assert!(s.keyed_create("k1", later).unwrap().is_none());
        // A put after the TTL prunes the old key.
        let newer = KeyedCreate {
            created_at: later,
            ..made
        };
        s.put_keyed_create("k3", &newer).unwrap();
        assert!(s.keyed_create("k1", t0).unwrap().is_none());
    }
}
