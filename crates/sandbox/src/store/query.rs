//! Listing sandboxes: filters (state, metadata, template, started after),
//! ordering by start time, and cursor pagination.
//!
//! The cursor (`next_token`) is opaque to clients: the sort key
//! `(started_at, id)` of the last row returned, base64url encoded. A page
//! continues strictly after it, so rows added or removed between pages
//! neither repeat nor shift the rest.

use base64::Engine;
use chrono::{DateTime, Utc};
use rusqlite::types::Value;

use super::rows::{read_all, COLUMNS};
use super::{Store, StoreError, StoreResult};
use crate::sandbox::{SandboxRecord, SandboxState};

/// Rows per page when the query names no limit, and the most it may ask.
pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortOrder {
    /// Oldest start first.
    #[default]
    Asc,
    Desc,
}

/// A list request. Empty or `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Any of these states; empty: every state (dead ones included).
    pub states: Vec<SandboxState>,
    /// Every pair must be present in the sandbox's metadata.
    pub metadata: Vec<(String, String)>,
    pub template: Option<String>,
    /// Started (created or last resumed) at or after this instant: a
    /// sandbox's own `started_at` finds it (E2B's `startedAfter`).
    pub started_after: Option<DateTime<Utc>>,
    pub order: SortOrder,
    /// Rows per page: default [`DEFAULT_LIMIT`], at most [`MAX_LIMIT`].
    pub limit: Option<u32>,
    /// The `next_token` of the previous page.
    pub next_token: Option<String>,
}

/// Where a page ended: the sort key of its last row.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    started_us: i64,
    id: String,
}

impl Cursor {
    fn encode(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("v1:{}:{}", self.started_us, self.id))
    }

    fn decode(token: &str) -> StoreResult<Self> {
        let bad = |why: &str| StoreError::BadCursor(why.to_string());
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| bad("not base64url"))?;
        let text = String::from_utf8(raw).map_err(|_| bad("not text"))?;
        let rest = text
            .strip_prefix("v1:")
            .ok_or_else(|| bad("unknown version"))?;
        let (us, id) = rest.split_once(':').ok_or_else(|| bad("malformed"))?;
        let started_us = us.parse().map_err(|_| bad("malformed time"))?;
        if id.is_empty() {
            return Err(bad("empty id"));
        }
        Ok(Self {
            started_us,
            id: id.to_string(),
        })
    }
}

impl Store {
    /// One page of sandboxes matching `q`, and the token of the next page
    /// (`None` on the last one).
    pub fn list(&self, q: &ListQuery) -> StoreResult<(Vec<SandboxRecord>, Option<String>)> {
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
        let cursor = q.next_token.as_deref().map(Cursor::decode).transpose()?;
        let (sql, params) = build_sql(q, cursor.as_ref(), limit + 1);
        let mut rows = read_all(&self.lock(), &sql, rusqlite::params_from_iter(params))
            .map_err(self.err("listing sandboxes"))?;
        let next = if rows.len() > limit as usize {
            rows.truncate(limit as usize);
            rows.last().map(|r| {
                Cursor {
                    started_us: r.started_at.timestamp_micros(),
                    id: r.id.clone(),
                }
                .encode()
            })
        } else {
            None
        };
        Ok((rows, next))
    }
}

/// The SELECT for `q`; every value is a bound parameter.
fn build_sql(q: &ListQuery, cursor: Option<&Cursor>, fetch: u32) -> (String, Vec<Value>) {
    let mut wheres: Vec<String> = Vec::new();
    let mut params: Vec<Value> = Vec::new();
    if !q.states.is_empty() {
        let marks = vec!["?"; q.states.len()].join(", ");
        wheres.push(format!("s.state IN ({marks})"));
        params.extend(q.states.iter().map(|s| Value::Text(s.as_str().into())));
    }
    for (k, v) in &q.metadata {
        wheres.push(
            "EXISTS (SELECT 1 FROM sandbox_metadata m \
             WHERE m.sandbox_id = s.id AND m.key = ? AND m.value = ?)"
                .into(),
        );
        params.push(Value::Text(k.clone()));
        params.push(Value::Text(v.clone()));
    }
    if let Some(t) = &q.template {
        wheres.push("s.template = ?".into());
        params.push(Value::Text(t.clone()));
    }
    if let Some(after) = q.started_after {
        wheres.push("s.started_us >= ?".into());
        params.push(Value::Integer(after.timestamp_micros()));
    }
    let (cmp, dir) = match q.order {
        SortOrder::Asc => (">", "ASC"),
        SortOrder::Desc => ("<", "DESC"),
    };
    if let Some(c) = cursor {
        wheres.push(format!(
            "(s.started_us {cmp} ? OR (s.started_us = ? AND s.id {cmp} ?))"
        ));
        params.push(Value::Integer(c.started_us));
        params.push(Value::Integer(c.started_us));
        params.push(Value::Text(c.id.clone()));
    }
    let filter = if wheres.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", wheres.join(" AND "))
    };
    let columns = COLUMNS
        .split(", ")
        .map(|c| format!("s.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT {columns} FROM sandboxes s {filter} \
         ORDER BY s.started_us {dir}, s.id {dir} LIMIT {fetch}"
    );
    (sql, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let c = Cursor {
            started_us: 1_700_000_000_123_456,
            id: "abc:def".into(),
        };
        assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
        for bad in ["", "!!!", "djE6", "eDox", "djE6eDp5"] {
            assert!(Cursor::decode(bad).is_err(), "{bad:?}");
        }
    }
}
