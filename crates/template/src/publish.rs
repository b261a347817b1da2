//! Publishing a frozen template into the snapshot repository.

use std::path::Path;

use siesta_snapshot::record::{DISK, MEMORY, STATE};
use siesta_snapshot::repo::{new_id, Placement, PublishFile, PublishRequest};
use siesta_snapshot::{RepoError, Repository, SnapshotKind};

use crate::error::Result;
use crate::record::{TemplateRecord, DISK_FILE, MEMORY_FILE, STATE_FILE};
use crate::{alias, Template};
use siesta_host::layout::Layout;

/// [`publish_template`] on a blocking thread: it moves and fsyncs the
/// template's files.
pub(crate) async fn publish_off_thread(
    layout: &Layout,
    record: TemplateRecord,
    work: &Path,
) -> Result<Template> {
    let (layout, work) = (layout.clone(), work.to_path_buf());
    siesta_host::blocking::run("publishing a template", move || {
        publish_template(&layout, &record, &work)
    })
    .await
}

/// Moves the files of a template frozen in `work` into the repository as a
/// new snapshot (memory and disk become shared blobs, renamed, not copied),
/// points `template:<name>` at it, and deletes the snapshot the alias named
/// before (a rebuild). Children of the old one keep their blobs: a blob is
/// only collected when no record references it.
pub(crate) fn publish_template(
    layout: &Layout,
    record: &TemplateRecord,
    work: &Path,
) -> Result<Template> {
    let repo = Repository::open(layout.repo())?;
    let name = &record.name;
    let previous = repo.alias_target(&alias(name))?;
    let meta = serde_json::to_value(record)
        .map_err(|e| crate::error::internal("encoding a template record", e))?;
    let file = |role: &str, name: &str, placement, sha: &str| PublishFile {
        role: role.to_string(),
        source: work.join(name),
        placement,
        sha256: Some(sha.to_string()),
    };
    let req = PublishRequest {
        id: new_id(&format!("tpl-{name}")),
        kind: SnapshotKind::Template,
        parent: None,
        guest_memory_size: record.memory.size,
        files: vec![
            file(
                MEMORY,
                MEMORY_FILE,
                Placement::BlobMove,
                &record.memory.sha256,
            ),
            file(DISK, DISK_FILE, Placement::BlobMove, &record.disk.sha256),
            file(
                STATE,
                STATE_FILE,
                Placement::LocalMove,
                &record.state.sha256,
            ),
        ],
        existing: vec![],
        aliases: vec![alias(name)],
        meta,
    };
    let snap = repo.publish(req)?;
    if let Some(old) = previous.filter(|old| *old != snap.id) {
        match repo.delete(&old) {
            Ok(()) | Err(RepoError::NotFound(_)) => {}
            Err(e) => tracing::warn!(template = %name, "removing the replaced snapshot {old}: {e}"),
        }
    }
    Template::open(layout, name)
}
