//! Which node holds which sandbox.
//!
//! Keys per sandbox: `/siesta/owners/<id>` holds the owning node's id
//! (plain, so transactions can compare it), `/siesta/sandboxes/<id>` its
//! row as the owner last wrote it (JSON [`SandboxRecord`]), and, while it
//! is paused and its pause is in the object store, `/siesta/stored/<id>`
//! the id of that snapshot (what a node taking it over fetches). Only the owner
//! writes the row, and only while the owner key still names it: every write
//! is a transaction on that key, so a node that was taken over (its lease
//! ran out while it was cut off) cannot overwrite the new owner's row.
//!
//! The row and the stored pause are sealed with the cluster key
//! ([`crate::seal`]); a value that does not open is not believed.
//!
//! Rows reach etcd from the node's SQLite store through [`RowWriter`] (the
//! store's [`RowObserver`]), in the order they were committed, by one
//! background task: SQLite stays the node's own truth and a slow etcd
//! never holds up a create or a pause.

use siesta_sandbox::sandbox::SandboxRecord;
use siesta_sandbox::store::RowObserver;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::etcd::{Compare, Etcd, Op};
use crate::state::ClusterState;

const OWNERS: &str = "/siesta/owners/";
const ROWS: &str = "/siesta/sandboxes/";
const STORED: &str = "/siesta/stored/";

pub(crate) fn owner_key(id: &str) -> String {
    format!("{OWNERS}{id}")
}

pub(crate) fn row_key(id: &str) -> String {
    format!("{ROWS}{id}")
}

pub(crate) fn stored_key(id: &str) -> String {
    format!("{STORED}{id}")
}

/// A sandbox as the cluster knows it.
#[derive(Debug, Clone)]
pub struct Owned {
    /// The id of the node that holds it.
    pub node: String,
    /// Its row as that node last wrote it (none yet right after a create).
    pub row: Option<SandboxRecord>,
    /// The object store's snapshot of its pause, once shared there.
    pub stored: Option<String>,
}

/// The owner and row of sandbox `id`, if any node holds it.
pub(crate) async fn lookup(st: &ClusterState, id: &str) -> Result<Option<Owned>> {
    let Some(owner) = st.etcd.get(&owner_key(id)).await? else {
        return Ok(None);
    };
    let row = match st.get_sealed(&row_key(id)).await? {
        Some(value) => Some(parse_row(&row_key(id), &value)?),
        None => None,
    };
    let stored = st
        .get_sealed(&stored_key(id))
        .await?
        .map(|value| String::from_utf8_lossy(&value).into_owned());
    Ok(Some(Owned {
        node: String::from_utf8_lossy(&owner.value).into_owned(),
        row,
        stored,
    }))
}

fn parse_row(key: &str, value: &[u8]) -> Result<SandboxRecord> {
    let row: SandboxRecord = serde_json::from_slice(value).map_err(|e| Error::BadRecord {
        key: key.to_string(),
        detail: e.to_string(),
    })?;
    // Sealed for this key, so written by a node for this sandbox; checked
    // anyway, since takeover joins the id into paths.
    if key.strip_prefix(ROWS) != Some(row.id.as_str()) {
        return Err(Error::BadRecord {
            key: key.to_string(),
            detail: format!("it names sandbox {:?}", row.id),
        });
    }
    Ok(row)
}

/// A sandbox row as the cluster holds it.
#[derive(Debug, Clone)]
pub struct ClusterRow {
    pub owner: String,
    /// Whether the owner's lease is alive.
    pub owner_alive: bool,
    /// Whether its pause is in the object store (it can move).
    pub stored: bool,
    pub row: SandboxRecord,
}

/// Every row in etcd (three range reads), `live` naming the live nodes.
pub(crate) async fn all_rows(
    st: &ClusterState,
    live: &std::collections::HashSet<String>,
) -> Result<Vec<ClusterRow>> {
    let text = |kv: crate::etcd::KeyValue, prefix: &str| {
        let id = kv.key.strip_prefix(prefix).unwrap_or(&kv.key).to_string();
        (id, String::from_utf8_lossy(&kv.value).into_owned())
    };
    let owners: std::collections::HashMap<String, String> = st
        .etcd
        .get_prefix(OWNERS)
        .await?
        .into_iter()
        .map(|kv| text(kv, OWNERS))
        .collect();
    let stored: std::collections::HashSet<String> = st
        .etcd
        .get_prefix(STORED)
        .await?
        .into_iter()
        .filter(|kv| st.open(kv).is_ok())
        .map(|kv| text(kv, STORED).0)
        .collect();
    let mut out = Vec::new();
    for kv in st.etcd.get_prefix(ROWS).await? {
        let row = match st.open(&kv).and_then(|v| parse_row(&kv.key, &v)) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(key = kv.key, "skipping an unreadable cluster row: {e}");
                continue;
            }
        };
        let Some(owner) = owners.get(&row.id) else {
            continue; // deleted between the reads
        };
        out.push(ClusterRow {
            owner_alive: live.contains(owner),
            stored: stored.contains(&row.id),
            owner: owner.clone(),
            row,
        });
    }
    Ok(out)
}

/// Makes `to` the owner of sandbox `id` if `from` still is; returns
/// whether it did (another node may have been faster).
pub(crate) async fn take_over(etcd: &Etcd, id: &str, from: &str, to: &str) -> Result<bool> {
    let key = owner_key(id);
    let put = Op::Put {
        key: key.clone(),
        value: to.as_bytes().to_vec(),
        lease: None,
    };
    if etcd
        .txn(
            &[Compare::ValueIs(key.clone(), from.as_bytes().to_vec())],
            &[put],
        )
        .await?
    {
        return Ok(true);
    }
    // A retried call whose first attempt was applied fails its comparison:
    // ours is ours.
    is_owner(etcd, id, to).await
}

async fn is_owner(etcd: &Etcd, id: &str, node: &str) -> Result<bool> {
    Ok(etcd
        .get(&owner_key(id))
        .await?
        .is_some_and(|kv| kv.value == node.as_bytes()))
}

enum Change {
    Row(String, Option<Box<SandboxRecord>>),
    Stored(String, Option<String>),
    Flush(oneshot::Sender<()>),
}

/// Sends the node's committed rows to etcd, in order (see the module docs).
pub struct RowWriter {
    tx: mpsc::UnboundedSender<Change>,
}

impl RowWriter {
    /// Starts the writer task for node `me`.
    pub(crate) fn start(st: ClusterState, me: String) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(change) = rx.recv().await {
                match change {
                    Change::Row(id, row) => write(&st, &me, &id, row.as_deref()).await,
                    Change::Stored(id, snap) => {
                        if let Err(e) = write_stored(&st, &me, &id, snap).await {
                            tracing::warn!(sandbox = id, "recording its stored pause: {e}");
                        }
                    }
                    Change::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        Self { tx }
    }

    /// Waits until every row sent so far has been written (or failed).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Change::Flush(done)).is_ok() {
            let _ = wait.await;
        }
    }
}

impl RowObserver for RowWriter {
    fn changed(&self, id: &str, row: Option<&SandboxRecord>) {
        let change = Change::Row(id.to_string(), row.cloned().map(Box::new));
        // The task only ends with the runtime; nothing to do if it did.
        let _ = self.tx.send(change);
    }

    fn pause_stored(&self, id: &str, snapshot: Option<&str>) {
        let _ = self
            .tx
            .send(Change::Stored(id.to_string(), snapshot.map(String::from)));
    }
}

async fn write(st: &ClusterState, me: &str, id: &str, row: Option<&SandboxRecord>) {
    let result = match row {
        Some(row) => put_row(st, me, id, row).await,
        None => delete_row(&st.etcd, me, id).await,
    };
    match result {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            sandbox = id,
            node = me,
            "not writing its cluster row: another node owns it now"
        ),
        Err(e) => tracing::warn!(sandbox = id, "writing its cluster row: {e}"),
    }
}

async fn put_row(st: &ClusterState, me: &str, id: &str, row: &SandboxRecord) -> Result<bool> {
    let value = serde_json::to_vec(row).map_err(|e| Error::BadRecord {
        key: row_key(id),
        detail: e.to_string(),
    })?;
    let put_row = st.sealed_put(row_key(id), &value, None)?;
    let etcd = &st.etcd;
    let mine = Compare::ValueIs(owner_key(id), me.as_bytes().to_vec());
    if etcd.txn(&[mine], std::slice::from_ref(&put_row)).await? {
        return Ok(true);
    }
    let claim = Op::Put {
        key: owner_key(id),
        value: me.as_bytes().to_vec(),
        lease: None,
    };
    if etcd
        .txn(&[Compare::Absent(owner_key(id))], &[claim, put_row])
        .await?
    {
        return Ok(true);
    }
    // A retried claim whose first attempt was applied: the row is written.
    is_owner(etcd, id, me).await
}

/// Records (or clears) the stored pause of sandbox `id`, if `me` owns it.
async fn write_stored(
    st: &ClusterState,
    me: &str,
    id: &str,
    snapshot: Option<String>,
) -> Result<bool> {
    let mine = Compare::ValueIs(owner_key(id), me.as_bytes().to_vec());
    let op = match snapshot {
        Some(snap) => st.sealed_put(stored_key(id), snap.as_bytes(), None)?,
        None => Op::Delete(stored_key(id)),
    };
    st.etcd.txn(&[mine], &[op]).await
}

async fn delete_row(etcd: &Etcd, me: &str, id: &str) -> Result<bool> {
    let mine = Compare::ValueIs(owner_key(id), me.as_bytes().to_vec());
    let ops = [
        Op::Delete(owner_key(id)),
        Op::Delete(row_key(id)),
        Op::Delete(stored_key(id)),
    ];
    if etcd.txn(&[mine], &ops).await? {
        return Ok(true);
    }
    // Nobody's (never written, or already gone) is fine too.
    Ok(etcd.get(&owner_key(id)).await?.is_none())
}
