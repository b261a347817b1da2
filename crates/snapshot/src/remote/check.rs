//! `siesta repo check --remote [--repair]`: what a crash or a race left in
//! the object store, found by marking from the records and sweeping the
//! rest.
//!
//! A push uploads chunks and indexes before its record, so an object that
//! no record reaches may belong to a push still running: only those older
//! than a grace period count as leftovers. Aliases naming no record are
//! leftovers of a delete. A record whose index or chunk is missing is
//! damage, reported and never "repaired" away.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::ObjectStoreExt;
use serde::Serialize;

use super::chunks::{chunk_key, index_key, FileIndex};
use super::{store_err, RemoteError, RemoteRecord, RemoteRepo};

/// What the check found (and, with repair, removed).
#[derive(Debug, Default, Serialize)]
pub struct RemoteReport {
    pub records: usize,
    /// Objects no record reaches, older than the grace period.
    pub unreferenced: Vec<String>,
    /// Aliases that name no record.
    pub dangling_aliases: Vec<String>,
    /// Records missing an index or a chunk (not repairable).
    pub damaged: Vec<String>,
    /// Records with a tombstone: a delete that died before it finished
    /// (repair finishes it).
    pub half_deleted: Vec<String>,
}

impl RemoteReport {
    pub fn is_clean(&self) -> bool {
        self.unreferenced.is_empty()
            && self.dangling_aliases.is_empty()
            && self.damaged.is_empty()
            && self.half_deleted.is_empty()
    }
}

impl RemoteRepo {
    /// Checks the object store; with `repair`, deletes the unreferenced
    /// objects older than `grace` and the dangling aliases.
    pub async fn check(&self, repair: bool, grace: Duration) -> Result<RemoteReport, RemoteError> {
        let mut report = RemoteReport::default();
        let mut live = BTreeSet::new();
        let ids = self.list().await?;
        report.records = ids.len();
        for id in &ids {
            if self.is_tombstoned(id).await? {
                // Not marked: once the delete is finished, what only it
                // used is swept like any leftover.
                report.half_deleted.push(id.clone());
                continue;
            }
            let record = match self.remote_record(id).await {
                Ok(r) => r,
                Err(RemoteError::NotFound(_)) => continue, // deleted meanwhile
                Err(e) => return Err(e),
            };
            if let Err(detail) = self.mark(&record, &mut live).await? {
                report.damaged.push(format!("{id}: {detail}"));
            }
        }
        let cutoff = cutoff_before(grace);
        for prefix in ["files", "chunks"] {
            for (key, modified) in self.listing(prefix).await? {
                if !live.contains(&key) && modified < cutoff {
                    report.unreferenced.push(key);
                }
            }
        }
        for (key, _) in self.listing("aliases").await? {
            let alias = key.trim_start_matches("aliases/").to_string();
            let target = self.alias_target(&alias).await?;
            // A half-deleted record's aliases go with its delete.
            if !ids.contains(&target) && !report.half_deleted.contains(&target) {
                report.dangling_aliases.push(alias);
            }
        }
        if repair {
            for id in &report.half_deleted {
                self.finish_delete(id).await?;
            }
            for key in report.unreferenced.iter().chain(
                report
                    .dangling_aliases
                    .iter()
                    .map(|a| format!("aliases/{a}"))
                    .collect::<Vec<_>>()
                    .iter(),
            ) {
                let key = Key::from(key.as_str());
                match self.store.delete(&key).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(store_err("removing", &key)(e)),
                }
            }
        }
        Ok(report)
    }

    /// Adds every object `record` reaches to `live`; `Ok(Err(detail))` when
    /// one is missing.
    async fn mark(
        &self,
        record: &RemoteRecord,
        live: &mut BTreeSet<String>,
    ) -> Result<Result<(), String>, RemoteError> {
        for sha in record.files.values().chain(record.manifest.iter()) {
            let key = index_key(sha);
            live.insert(key.to_string());
            let bytes = match self.store.get(&key).await {
                Ok(got) => got.bytes().await.map_err(store_err("reading", &key))?,
                Err(object_store::Error::NotFound { .. }) => {
                    return Ok(Err(format!("index {key} is missing")))
                }
                Err(e) => return Err(store_err("fetching", &key)(e)),
            };
            let index: FileIndex = match serde_json::from_slice(&bytes) {
                Ok(i) => i,
                Err(e) => return Ok(Err(format!("index {key} is unreadable: {e}"))),
            };
            for chunk in index.chunks.iter().flatten() {
                let ckey = chunk_key(chunk);
                match self.store.head(&ckey).await {
                    Ok(_) => {}
                    Err(object_store::Error::NotFound { .. }) => {
                        return Ok(Err(format!("chunk {ckey} is missing")))
                    }
                    Err(e) => return Err(store_err("reading", &ckey)(e)),
                }
                live.insert(ckey.to_string());
            }
        }
        Ok(Ok(()))
    }

    /// Every object under `prefix/` with its last modification.
    async fn listing(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, std::time::SystemTime)>, RemoteError> {
        let p = Key::from(prefix);
        let metas: Vec<_> = self
            .store
            .list(Some(&p))
            .try_collect()
            .await
            .map_err(store_err("listing", &p))?;
        Ok(metas
            .into_iter()
            .map(|m| (m.location.to_string(), m.last_modified.into()))
            .collect())
    }
}

fn cutoff_before(grace: Duration) -> std::time::SystemTime {
    std::time::SystemTime::now()
        .checked_sub(grace)
        .unwrap_or(std::time::UNIX_EPOCH)
}
