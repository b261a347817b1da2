//! The snapshot record: what a snapshot is made of, stored as
//! `snapshots/<id>/record.json` in the repository.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::manifest::ManifestDescriptor;

/// Well-known file roles.
pub const MEMORY: &str = "memory";
pub const STATE: &str = "state";
pub const DISK: &str = "disk";
pub const MANIFEST_FILE: &str = "startup.manifest";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// A booted, ready VM that sandboxes are created from.
    Template,
    /// A sandbox paused to disk.
    Paused,
    /// A snapshot a user asked for.
    User,
}

impl std::fmt::Display for SnapshotKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SnapshotKind::Template => "template",
            SnapshotKind::Paused => "paused",
            SnapshotKind::User => "user",
        })
    }
}

/// Where one file of a snapshot lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "in")]
pub enum FileLocation {
    /// Shared, content-addressed: `blobs/<sha256>`. A template's memory and
    /// disk live here so children reference them instead of copying.
    Blob { sha256: String },
    /// Private to the snapshot: `snapshots/<id>/<name>`.
    Local { name: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    #[serde(flatten)]
    pub location: FileLocation,
    /// Apparent size in bytes.
    pub size: u64,
    /// SHA-256 of a private file, when its publisher gave it (a saved VM
    /// state, which must never be loaded damaged); a blob's digest is its
    /// name.
    /// (Not `sha256`: that key is the blob location's.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_sha256: Option<String>,
}

impl FileRef {
    /// The content digest the record promises, if any.
    pub fn digest(&self) -> Option<&str> {
        match &self.location {
            FileLocation::Blob { sha256 } => Some(sha256),
            FileLocation::Local { .. } => self.content_sha256.as_deref(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub id: String,
    pub kind: SnapshotKind,
    /// Chosen at publication, never reused: a background task that started
    /// on one incarnation of an id can tell it is no longer there.
    pub generation: u64,
    pub created_at_unix_ms: u64,
    /// The snapshot this one was taken from (a paused sandbox's template).
    #[serde(default)]
    pub parent: Option<String>,
    /// Files by role (`memory`, `state`, `disk`, ...).
    pub files: BTreeMap<String, FileRef>,
    /// Bytes of guest memory the snapshot restores.
    pub guest_memory_size: u64,
    /// The startup manifest (`startup.manifest` beside the record), once
    /// recorded.
    #[serde(default)]
    pub manifest: Option<ManifestDescriptor>,
    /// Whatever the layer above keeps with it (a template's build record).
    #[serde(default)]
    pub meta: serde_json::Value,
}

impl SnapshotRecord {
    /// Digests of the blobs this record references.
    pub fn blobs(&self) -> impl Iterator<Item = &str> {
        self.files.values().filter_map(|f| match &f.location {
            FileLocation::Blob { sha256 } => Some(sha256.as_str()),
            FileLocation::Local { .. } => None,
        })
    }
}
