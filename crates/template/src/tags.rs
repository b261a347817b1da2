//! Template tags (`name:tag`), as the E2B API has them.
//!
//! A template here holds one build, the one its name resolves to; a tag
//! records which build it was given to and when. `Sandbox.create("name:tag")`
//! starts from template `name`. Tags live in `$SIESTA_HOME/template-tags.json`,
//! written atomically (temporary file, fsync, rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use siesta_host::layout::{validate_name, Layout};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tag {
    pub build_id: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Template name -> tag -> what it names.
type Tags = BTreeMap<String, BTreeMap<String, Tag>>;

fn file(layout: &Layout) -> PathBuf {
    layout.home().join("template-tags.json")
}

fn load(path: &Path) -> Result<Tags> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::CorruptSnapshot {
            path: path.to_path_buf(),
            detail: format!("bad tags file: {e}"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Tags::new()),
        Err(e) => Err(e).ctx("reading template tags", path),
    }
}

fn store(path: &Path, tags: &Tags) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(tags)
        .map_err(|e| crate::error::internal("encoding template tags", e))?;
    std::fs::write(&tmp, bytes).ctx("writing template tags", &tmp)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .ctx("syncing template tags", &tmp)?;
    std::fs::rename(&tmp, path).ctx("publishing template tags", path)
}

/// A tag must be a name too (no `:` or `/`, not empty).
pub fn validate_tag(tag: &str) -> Result<()> {
    validate_name("tag", tag).map_err(Error::Invalid)
}

/// Gives `tags` to build `build_id` of template `name`.
pub fn assign(layout: &Layout, name: &str, build_id: &str, tags: &[String]) -> Result<()> {
    for t in tags {
        validate_tag(t)?;
    }
    let path = file(layout);
    let mut all = load(&path)?;
    let now = chrono::Utc::now();
    let of = all.entry(name.to_string()).or_default();
    for t in tags {
        of.insert(
            t.clone(),
            Tag {
                build_id: build_id.to_string(),
                created_at: now,
            },
        );
    }
    store(&path, &all)
}

/// Removes `tags` from template `name`; false if it had none of them.
pub fn remove(layout: &Layout, name: &str, tags: &[String]) -> Result<bool> {
    let path = file(layout);
    let mut all = load(&path)?;
    let Some(of) = all.get_mut(name) else {
        return Ok(false);
    };
    let before = of.len();
    of.retain(|t, _| !tags.contains(t));
    let removed = of.len() != before;
    if of.is_empty() {
        all.remove(name);
    }
    store(&path, &all)?;
    Ok(removed)
}

/// The tags of template `name`, by tag.
pub fn of_template(layout: &Layout, name: &str) -> Result<BTreeMap<String, Tag>> {
    Ok(load(&file(layout))?.remove(name).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assign_list_remove() {
        let home = tempfile::tempdir().unwrap();
        let layout = Layout::new(home.path());
        assign(&layout, "app", "b1", &["v1".into(), "prod".into()]).unwrap();
        assign(&layout, "app", "b2", &["prod".into()]).unwrap();
        let tags = of_template(&layout, "app").unwrap();
        assert_eq!(tags["v1"].build_id, "b1");
        assert_eq!(
            tags["prod"].build_id, "b2",
            "a tag moves to the newer build"
        );
        assert!(remove(&layout, "app", &["prod".into()]).unwrap());
        assert!(!remove(&layout, "app", &["prod".into()]).unwrap());
        assert!(!remove(&layout, "other", &["x".into()]).unwrap());
        assert_eq!(of_template(&layout, "app").unwrap().len(), 1);
        assert!(assign(&layout, "app", "b1", &[":bad".into()]).is_err());
    }
}
