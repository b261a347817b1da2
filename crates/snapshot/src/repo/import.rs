//! Installing a snapshot fetched from elsewhere (the object store) under
//! its own id, record and generation, with the same steps and guarantees
//! as a publication: staged, synced, renamed, committed last.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::fsutil::{io, sync_dir};
use super::lock::RepoGate;
use super::{check_name, RepoError, Repository};
use crate::record::{FileLocation, SnapshotRecord, MANIFEST_FILE};

impl Repository {
    /// Installs `record` with its files (`files`: role to a complete file
    /// the caller wrote under [`Repository::import_dir`], moved in) and
    /// its startup manifest. A blob already present is kept (same digest,
    /// same bytes). An id that exists or was deleted here is refused.
    pub fn import(
        &self,
        record: &SnapshotRecord,
        files: &BTreeMap<String, PathBuf>,
        manifest: Option<&Path>,
    ) -> Result<SnapshotRecord, RepoError> {
        check_name("snapshot id", &record.id, false)?;
        if self.is_tombstoned(&record.id) {
            return Err(RepoError::Deleted {
                id: record.id.clone(),
                what: "import",
            });
        }
        if self.snapshot_dir(&record.id).exists() {
            return Err(RepoError::Exists(record.id.clone()));
        }
        let _gate = RepoGate::shared(&self.dir("locks"))?;
        let staging =
            self.dir("staging")
                .join(format!("{}.{:08x}", record.id, rand::random::<u32>()));
        std::fs::create_dir(&staging).map_err(io("creating staging directory", &staging))?;
        let done = self.import_staged(record, files, manifest, &staging);
        if done.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        done
    }

    /// Where an importer writes the files it fetches (inside the
    /// repository, so they are moved in, not copied).
    pub fn import_dir(&self) -> PathBuf {
        self.dir("tmp")
    }

    fn import_staged(
        &self,
        record: &SnapshotRecord,
        files: &BTreeMap<String, PathBuf>,
        manifest: Option<&Path>,
        staging: &Path,
    ) -> Result<SnapshotRecord, RepoError> {
        for (role, f) in &record.files {
            let source = files.get(role).ok_or_else(|| RepoError::NoFile {
                id: record.id.clone(),
                role: role.clone(),
            })?;
            let dest = match &f.location {
                FileLocation::Blob { sha256 } => self.blob_path(sha256),
                FileLocation::Local { name } => {
                    check_name("snapshot file name", name, false)?;
                    staging.join(name)
                }
            };
            if dest.exists() {
                let _ = std::fs::remove_file(source);
                continue;
            }
            std::fs::rename(source, &dest).map_err(io("moving an imported file", &dest))?;
        }
        if let Some(m) = manifest {
            let dest = staging.join(MANIFEST_FILE);
            std::fs::rename(m, &dest).map_err(io("moving an imported manifest", &dest))?;
        }
        sync_dir(&self.dir("blobs"))?;
        self.commit_staged(record, staging, "import")?;
        Ok(record.clone())
    }
}
