//! Templates: a booted, ready VM frozen to disk. Sandboxes are born by
//! resuming one.

mod build;
pub mod record;

pub use build::{build_template, cold_boot, BuildOptions};
pub use record::TemplateRecord;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::layout::{validate_name, Layout};

/// A template that exists on disk, with its record loaded.
#[derive(Debug, Clone)]
pub struct Template {
    pub dir: PathBuf,
    pub record: TemplateRecord,
}

impl Template {
    /// Opens template `name`; a missing one is `TemplateNotFound`.
    pub fn open(layout: &Layout, name: &str) -> Result<Self> {
        validate_name("template", name).map_err(Error::Invalid)?;
        let dir = layout.template_dir(name);
        if !dir.join(record::RECORD_FILE).exists() {
            return Err(Error::TemplateNotFound {
                name: name.to_string(),
            });
        }
        let record = TemplateRecord::load(&dir)?;
        Ok(Self { dir, record })
    }

    pub fn memory_path(&self) -> PathBuf {
        self.dir.join(record::MEMORY_FILE)
    }
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(record::STATE_FILE)
    }
    pub fn disk_path(&self) -> PathBuf {
        self.dir.join(record::DISK_FILE)
    }

    /// Refuses a snapshot made by another VMM kind, version, machine type
    /// or accelerator than `current`, naming each difference.
    pub fn check_compatible(&self, current: &siesta_vmm::VmmInfo) -> Result<()> {
        current
            .check_compatible(&self.record.vmm)
            .map_err(|e| Error::Incompatible {
                template: self.record.name.clone(),
                detail: e.to_string(),
            })
    }
}

/// Every template under the data directory, by name.
pub fn list(layout: &Layout) -> Result<Vec<Template>> {
    let root = layout.templates();
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(source) => {
            return Err(Error::Io {
                what: "listing templates",
                path: root,
                source,
            })
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // a build in progress or left by a crash
        }
        if let Ok(t) = Template::open(layout, &name) {
            out.push(t);
        }
    }
    out.sort_by(|a, b| a.record.name.cmp(&b.record.name));
    Ok(out)
}

pub(crate) fn is_complete(dir: &Path) -> bool {
    dir.join(record::RECORD_FILE).exists()
}
