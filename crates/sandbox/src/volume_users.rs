//! Which sandboxes use a volume: the manager's answer to a volume delete
//! (kept apart from [`crate::volumes`], which the launch path uses and
//! which must not reach into the manager).

use crate::manager::SandboxManager;
use crate::sandbox::SandboxState;

impl SandboxManager {
    /// Sandboxes (running or paused) that mount volume `volume_id`: a
    /// volume they mount cannot be deleted.
    pub async fn mounting(&self, volume_id: &str) -> Vec<String> {
        let entries: Vec<_> = self.sandboxes.lock().await.values().cloned().collect();
        let mut ids = Vec::new();
        for entry in entries {
            let sb = entry.lock().await;
            let alive = !matches!(sb.record.state, SandboxState::Dead);
            if alive
                && sb
                    .record
                    .volume_mounts
                    .iter()
                    .any(|m| m.volume_id == volume_id)
            {
                ids.push(sb.record.id.clone());
            }
        }
        ids.sort();
        ids
    }
}
