//! What a stat or a directory listing reports (the SDK's `VolumeEntryStat`).

use cap_std::fs::MetadataExt;

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;

use crate::path::VolumePath;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Unknown,
}

/// One entry, as the volume content API answers it. `mode` holds the
/// permission bits only (`0o644`), as the SDK compares them.
#[derive(Debug, Clone, Serialize)]
pub struct EntryStat {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EntryKind,
    pub path: String,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: DateTime<Utc>,
    pub mtime: DateTime<Utc>,
    pub ctime: DateTime<Utc>,
    /// Where a symbolic link points, as written in the link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl EntryStat {
    /// From the metadata of `path` itself (not following a final link).
    pub fn new(path: &VolumePath, meta: &cap_std::fs::Metadata, target: Option<String>) -> Self {
        let file_type = meta.file_type();
        let kind = if file_type.is_symlink() {
            EntryKind::Symlink
        } else if file_type.is_dir() {
            EntryKind::Directory
        } else if file_type.is_file() {
            EntryKind::File
        } else {
            EntryKind::Unknown
        };
        Self {
            name: path.name().to_string(),
            kind,
            path: path.to_string(),
            size: meta.len(),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            target,
        }
    }
}

fn time(secs: i64, nsec: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, nsec.clamp(0, 999_999_999) as u32)
        .single()
        .unwrap_or_default()
}
