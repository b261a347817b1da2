//! siesta-snapshot: where snapshots live and how their memory is warmed.
//!
//! - [`repo`]: the POSIX snapshot repository. Templates, paused sandboxes and
//!   user snapshots are all [`SnapshotRecord`]s in one directory tree, with
//!   aliases, content-addressed shared blobs, atomic publication, lock files
//!   that a crashed holder cannot keep, tombstones that stop a late
//!   background task from resurrecting a deleted snapshot, and `check` /
//!   `repair`.
//! - [`manifest`]: the startup manifest, the guest-memory ranges a resumed VM
//!   touches until its agent is ready, in a versioned, bounded binary format
//!   with a SHA-256 descriptor.
//! - [`pagemap`]: records a manifest by sampling `/proc/<pid>/pagemap` of
//!   the VMM over its guest-memory mapping.
//! - [`prefetch`]: reads a manifest's ranges of the memory file into the page
//!   cache while a restore runs, shared between concurrent resumes; chunks
//!   already cached ([`pagecache`]) are skipped.
//!
//! - [`remote`]: the shared copy in object storage (S3 API): push, pull,
//!   aliases by compare-and-swap.
//!
//! The on-disk layout and the manifest format are documented in
//! `docs/snapshots.md`.

pub mod manifest;
pub mod pagecache;
pub mod pagemap;
pub mod prefetch;
pub mod record;
pub mod remote;
pub mod repo;

pub use manifest::{Manifest, ManifestDescriptor, ManifestError};
pub use prefetch::{PrefetchHandle, PrefetchOutcome, Prefetcher};
pub use record::{FileLocation, FileRef, SnapshotKind, SnapshotRecord};
pub use repo::{CheckReport, RepoError, Repository};
