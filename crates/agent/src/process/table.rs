//! The processes the agent tracks, by pid, from start until their `end` event
//! has been delivered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use siesta_envd_proto::process::{process_selector::Selector, ProcessSelector};

use super::handle::Process;
use crate::rpc::RpcError;

#[derive(Default)]
pub struct ProcessTable {
    by_pid: Mutex<HashMap<u32, Arc<Process>>>,
}

impl ProcessTable {
    fn map(&self) -> MutexGuard<'_, HashMap<u32, Arc<Process>>> {
        self.by_pid.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, process: Arc<Process>) {
        self.map().insert(process.pid, process);
    }

    /// Removes `process` (only that instance: the pid may already belong to
    /// a newer process).
    pub fn remove(&self, process: &Arc<Process>) {
        let mut map = self.map();
        if map
            .get(&process.pid)
            .is_some_and(|p| Arc::ptr_eq(p, process))
        {
            map.remove(&process.pid);
        }
    }

    pub fn all(&self) -> Vec<Arc<Process>> {
        let mut all: Vec<_> = self.map().values().cloned().collect();
        all.sort_by_key(|p| p.pid);
        all
    }

    /// The process a selector names; `not_found` if none.
    pub fn select(&self, selector: Option<&ProcessSelector>) -> Result<Arc<Process>, RpcError> {
        let map = self.map();
        match selector.and_then(|s| s.selector.as_ref()) {
            Some(Selector::Pid(pid)) => map
                .get(pid)
                .cloned()
                .ok_or_else(|| RpcError::not_found(format!("process with pid {pid} not found"))),
            Some(Selector::Tag(tag)) => map
                .values()
                .find(|p| p.tag.as_deref() == Some(tag.as_str()))
                .cloned()
                .ok_or_else(|| RpcError::not_found(format!("process with tag {tag:?} not found"))),
            None => Err(RpcError::invalid_argument(
                "no process selector (pid or tag) given",
            )),
        }
    }
}
