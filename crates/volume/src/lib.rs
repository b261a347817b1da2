//! siesta-volume: persistent volumes.
//!
//! A volume is a named directory on the node that outlives every sandbox
//! (E2B's `Volume` API). This crate holds what a volume *is*, apart from
//! how it reaches a guest:
//!
//! | module | what |
//! |---|---|
//! | [`registry`] | [`Volumes`]: create, list, look up and delete volumes; their records in SQLite (`$SIESTA_HOME/volumes/volumes.db`) and their directories |
//! | [`content`] | [`VolumeFs`]: file operations inside one volume (the volume content API), confined to it |
//! | [`path`] | [`VolumePath`]: a path inside a volume, refused when it could leave it |
//! | [`stat`] | [`EntryStat`]: what a stat or listing reports |
//! | [`nfs`] | a volume served to one sandbox's guest over NFSv3, from inside its network namespace |
//! | [`usage`] | what a volume uses of its size limit (every entry at least 4 KiB) |
//! | [`squash`] | no set-ID bits and no root owner on a volume's files |
//!
//! Layout on disk:
//!
//! ```text
//! $SIESTA_HOME/volumes/  (0700: only the server reaches the files)
//!   volumes.db          one row per volume: id, name, token, size limit
//!   <id>/data/          the volume's files (its root, owned by uid/gid 1000)
//!   <id>/tmp/           uploads being written, renamed into data/ when whole
//! ```
//!
//! Confinement does not rely on checking names alone: every operation
//! resolves paths through `cap-std`, which refuses `..` and symbolic links
//! that lead out of the volume's root, also when a sandbox planted them.

pub mod content;
mod error;
pub mod nfs;
pub mod path;
pub mod registry;
pub mod squash;
pub mod stat;
pub mod usage;

pub use content::{PendingWrite, VolumeFs};
pub use error::{VolumeError, VolumeResult};
pub use path::VolumePath;
pub use registry::{VolumeRecord, Volumes, DEFAULT_SIZE_LIMIT_MIB};
pub use stat::{EntryKind, EntryStat};

/// The owner of a volume's root and, unless a write says otherwise, of what
/// the content API creates: `user` (1000:1000), the user every template has,
/// so that a sandbox can write to what the API put there.
pub const DEFAULT_OWNER: (u32, u32) = (1000, 1000);
