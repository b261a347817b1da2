//! Which template a sandbox runs on, and opening a template by name
//! (fetched from the object store when this node lacks it).

use crate::error::Result;
use crate::manager::SandboxManager;
use crate::sandbox::Sandbox;
use siesta_template::Template;

impl SandboxManager {
    /// Template `name`, fetched from the object store first when this node
    /// lacks it and one is configured (a snapshot fetched from another node
    /// needs its template too).
    pub(crate) async fn open_template(&self, name: &str) -> Result<Template> {
        let layout = self.node.config.layout();
        match (Template::open(&layout, name), self.remote()) {
            (Err(siesta_template::Error::TemplateNotFound { .. }), Some(remote)) => {
                remote.fetch_template(&self.repo()?, name).await?;
                self.prune_fetched_later().await;
                Ok(Template::open(&layout, name)?)
            }
            (opened, _) => {
                if let Some((id, _)) = opened.as_ref().ok().and_then(Template::shared_memory) {
                    self.used_fetched(&id);
                }
                Ok(opened?)
            }
        }
    }

    /// The template sandbox `sb` runs on: the one it was resumed on while
    /// it runs (and is still in the repository: a rebuild deletes the
    /// build it replaced; or is served lazily, and will be: the caller
    /// waits for that before it references its files, and its VM maps
    /// those FUSE files, so a save of changed pages is taken over them);
    /// for a paused one, the template its pause was
    /// saved over, by id (what its name names may be another build, and a
    /// template fetched by id has no name here); else the template of its
    /// name.
    pub(crate) async fn template_for(&self, sb: &Sandbox) -> Result<Template> {
        let repo = self.repo()?;
        if let Some(running) = &sb.running {
            let id = running.template.snapshot.as_ref().map(|s| s.id.as_str());
            if running.template.lazy || id.is_some_and(|id| repo.get(id).is_ok()) {
                return Ok(running.template.clone());
            }
        }
        let parent = crate::paused::for_resume(&repo, &sb.record.id)
            .ok()
            .and_then(|r| r.parent);
        if let Some(parent) = parent {
            if let Some(t) = Template::open_snapshot(&repo, &parent)? {
                return Ok(t);
            }
        }
        self.open_template(&sb.record.template).await
    }
}
