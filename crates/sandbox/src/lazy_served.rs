//! The sandbox manager's side of lazy serving: what waits for a lazily
//! served template's import, and what happens once it is in.

use std::sync::Arc;

use crate::manager::SandboxManager;
use crate::Result;
use siesta_template::Template;

impl SandboxManager {
    /// Once lazily served `template` is whole (its files hashed then) and
    /// imported, records its blobs as checked, so the next create from the
    /// repository does not hash them again.
    pub(crate) fn trust_when_imported(&self, template: &Template) {
        let (Some(remote), Some(snap), Ok(repo)) = (
            self.remote().cloned(),
            template.snapshot.clone(),
            self.repo(),
        ) else {
            return;
        };
        let node = Arc::clone(&self.node);
        self.transfers.spawn(async move {
            if remote.wait_imported(&snap.id).await.is_err() {
                return;
            }
            if let Ok(Some(t)) = Template::open_snapshot(&repo, &snap.id) {
                node.blob_checks.trust(&t.memory, &t.record.memory.sha256);
                node.blob_checks.trust(&t.disk, &t.record.disk.sha256);
            }
        });
    }

    /// Waits, when `template` is being served before it is whole, until it
    /// is in the repository: a pause or snapshot references its files.
    pub(crate) async fn wait_served(&self, template: &Template) -> Result<()> {
        match (self.remote(), &template.snapshot) {
            (Some(remote), Some(snap)) => Ok(remote.wait_imported(&snap.id).await?),
            _ => Ok(()),
        }
    }
}
