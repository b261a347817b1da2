//! `check` and `repair`: find (and remove) what crashes leave behind.
//!
//! `repair` runs under the exclusive repo gate, so no writer is active and
//! everything unfinished is dead: staging directories, snapshot directories
//! without commit marker, snapshots whose deletion was interrupted (tombstone
//! written), unreferenced blobs, temporary files, stale locks and aliases
//! naming nothing. Damage to committed snapshots (unreadable record, missing
//! file) is reported, never "repaired" away.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::fsutil::io;
use super::lock::{read_owner, RepoGate};
use super::{list_names, read_record, RepoError, Repository, COMMIT_MARKER, RECORD_FILE};
use crate::record::FileLocation;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueKind {
    /// A snapshot directory without commit marker, or whose deletion was
    /// interrupted.
    HalfPublished,
    /// A publication's staging directory left by a crash.
    StaleStaging,
    /// A blob no snapshot references.
    OrphanBlob,
    /// A temporary file left by a crash.
    TempFile,
    /// A lock whose holder died or whose lease ran out.
    StaleLock,
    /// An alias naming no snapshot.
    DanglingAlias,
    /// A writer is active; its staging files and new blobs are not judged.
    InProgress,
    /// A committed snapshot whose record cannot be read (not repaired).
    CorruptRecord,
    /// A committed snapshot's file is missing (not repaired).
    MissingFile,
}

impl IssueKind {
    /// Whether `repair` removes it.
    pub fn repairable(self) -> bool {
        !matches!(
            self,
            IssueKind::InProgress | IssueKind::CorruptRecord | IssueKind::MissingFile
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Issue {
    pub kind: IssueKind,
    pub path: PathBuf,
    pub detail: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    /// Committed snapshots seen.
    pub snapshots: usize,
    pub issues: Vec<Issue>,
}

impl CheckReport {
    /// No issue except writers in progress.
    pub fn is_clean(&self) -> bool {
        self.issues.iter().all(|i| i.kind == IssueKind::InProgress)
    }
}

impl Repository {
    /// Reports what is wrong, changing nothing.
    pub fn check(&self) -> Result<CheckReport, RepoError> {
        let gate = RepoGate::try_exclusive(&self.dir("locks"))?;
        self.scan(gate.is_some())
    }

    /// Removes every repairable issue (waiting up to `wait` for writers to
    /// finish) and returns what it removed.
    pub fn repair(&self, wait: Duration) -> Result<CheckReport, RepoError> {
        let _gate = RepoGate::exclusive(&self.dir("locks"), wait)?;
        let report = self.scan(true)?;
        // Directories first: a removed snapshot's blobs then become orphans
        // found by the second pass.
        for pass in 0..2 {
            let report = if pass == 0 {
                report.clone()
            } else {
                self.scan(true)?
            };
            for issue in report.issues.iter().filter(|i| i.kind.repairable()) {
                let p = &issue.path;
                let removed = if p.is_dir() {
                    std::fs::remove_dir_all(p)
                } else {
                    std::fs::remove_file(p)
                };
                match removed {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io("repairing", p)(e)),
                }
            }
        }
        super::fsutil::sync_dir(&self.dir("snapshots"))?;
        let mut repaired = report;
        repaired.issues.retain(|i| i.kind.repairable());
        // Blobs orphaned by the removals above were removed too.
        Ok(repaired)
    }

    fn scan(&self, quiescent: bool) -> Result<CheckReport, RepoError> {
        let mut report = CheckReport::default();
        let mut push =
            |kind, path: PathBuf, detail: String| report.issues.push(Issue { kind, path, detail });
        let mut referenced = std::collections::HashSet::new();
        let mut committed = std::collections::HashSet::new();
        for id in list_names(&self.dir("snapshots"))? {
            let dir = self.snapshot_dir(&id);
            let marker = dir.join(COMMIT_MARKER).exists();
            let record = read_record(&dir.join(RECORD_FILE));
            if !marker {
                push(IssueKind::HalfPublished, dir, "no commit marker".into());
                continue;
            }
            if self.is_tombstoned(&id) {
                push(IssueKind::HalfPublished, dir, "deletion interrupted".into());
                continue;
            }
            let record = match record {
                Ok(r) => r,
                Err(e) => {
                    push(IssueKind::CorruptRecord, dir, e.to_string());
                    continue;
                }
            };
            committed.insert(id.clone());
            for (role, f) in &record.files {
                let path = match &f.location {
                    FileLocation::Blob { sha256 } => {
                        referenced.insert(sha256.clone());
                        self.blob_path(sha256)
                    }
                    FileLocation::Local { name } => dir.join(name),
                };
                if !path.exists() {
                    push(IssueKind::MissingFile, path, format!("{id}: file {role}"));
                }
            }
            for name in hidden_names(&dir)? {
                let kind = if quiescent {
                    IssueKind::TempFile
                } else {
                    IssueKind::InProgress
                };
                push(kind, dir.join(name), String::new());
            }
        }
        report_unfinished(self, quiescent, &referenced, &mut push)?;
        for (alias, id) in self.aliases()? {
            if !committed.contains(&id) {
                let p = self.dir("aliases").join(&alias);
                push(IssueKind::DanglingAlias, p, format!("names {id}"));
            }
        }
        for name in list_names(&self.dir("locks"))? {
            let p = self.dir("locks").join(&name);
            if !name.ends_with(".lock") {
                continue;
            }
            // Unreadable: the taker crashed between create and write.
            let owner = read_owner(&p);
            if owner.as_ref().is_none_or(|o| o.is_stale()) {
                let detail = owner.map_or("unreadable".into(), |o| format!("pid {}", o.pid));
                push(IssueKind::StaleLock, p, detail);
            }
        }
        report.snapshots = committed.len();
        Ok(report)
    }
}

/// Staging directories, temporary files and unreferenced blobs: dead when
/// the repository is quiescent, possibly a live writer's otherwise.
fn report_unfinished(
    repo: &Repository,
    quiescent: bool,
    referenced: &std::collections::HashSet<String>,
    push: &mut impl FnMut(IssueKind, PathBuf, String),
) -> Result<(), RepoError> {
    let kind = |k| if quiescent { k } else { IssueKind::InProgress };
    for name in all_names(&repo.dir("staging"))? {
        push(
            kind(IssueKind::StaleStaging),
            repo.dir("staging").join(name),
            String::new(),
        );
    }
    for name in all_names(&repo.dir("tmp"))? {
        push(
            kind(IssueKind::TempFile),
            repo.dir("tmp").join(name),
            String::new(),
        );
    }
    for name in hidden_names(&repo.dir("aliases"))? {
        push(
            kind(IssueKind::TempFile),
            repo.dir("aliases").join(name),
            String::new(),
        );
    }
    for name in list_names(&repo.dir("blobs"))? {
        if !referenced.contains(&name) {
            push(
                kind(IssueKind::OrphanBlob),
                repo.blob_path(&name),
                String::new(),
            );
        }
    }
    Ok(())
}

fn all_names(dir: &std::path::Path) -> Result<Vec<String>, RepoError> {
    let mut out = list_names(dir)?;
    out.extend(hidden_names(dir)?);
    Ok(out)
}

fn hidden_names(dir: &std::path::Path) -> Result<Vec<String>, RepoError> {
    let entries = std::fs::read_dir(dir).map_err(io("listing", dir))?;
    Ok(entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect())
}
