//! The cluster's state as one node reaches it: the etcd client and the
//! cluster key that seals what the node writes there ([`crate::seal`]).

use std::sync::Arc;

use crate::error::Result;
use crate::etcd::{Etcd, KeyValue, Op};
use crate::seal::ClusterKey;

#[derive(Clone)]
pub(crate) struct ClusterState {
    pub etcd: Etcd,
    pub key: Arc<ClusterKey>,
}

impl ClusterState {
    /// The value at `key`, opened; `None` when there is none.
    pub async fn get_sealed(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self.etcd.get(key).await? {
            Some(kv) => self.open(&kv).map(Some),
            None => Ok(None),
        }
    }

    /// A value read from etcd, opened.
    pub fn open(&self, kv: &KeyValue) -> Result<Vec<u8>> {
        self.key.open(&kv.key, &kv.value)
    }

    /// A put of `value` sealed for `key`.
    pub fn sealed_put(&self, key: String, value: &[u8], lease: Option<i64>) -> Result<Op> {
        let value = self.key.seal(&key, value)?;
        Ok(Op::Put { key, value, lease })
    }
}
