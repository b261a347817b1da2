//! Volumes served to guests over NFSv3.
//!
//! Each mount of a volume in a sandbox gets its own NFSv3 server (the
//! `nfsserve` crate: NFS and MOUNT on one TCP port), listening *inside that
//! sandbox's network namespace* on the guest's gateway address. Only that
//! guest can reach it: other sandboxes have their own namespaces, and the
//! host's side of the slot is never routed there. The guest's kernel NFS
//! client mounts it (the agent does, from `/init`).
//!
//! | module | what |
//! |---|---|
//! | [`fs`] | [`VolumeNfs`]: the NFS operations on one volume's directory, confined to it (`cap-std`) |
//! | [`index`] | file ids (host inode numbers) back to paths, rebuilt after a restart |
//! | [`attr`] | host metadata as NFS attributes, errors as NFS status codes |
//! | [`export`] | [`NfsExport`]: a server bound in a network namespace, on a thread of its own |
//!
//! File handles are the volume's generation (from its id) and the inode
//! number, so they stay valid across a restart of the server or of siesta:
//! a paused guest resumes with its mount intact. Everything a guest creates
//! belongs to uid/gid 1000 (`user`), as NFS's `all_squash` would have it:
//! the server does not learn the caller's uid, and a volume is shared.

mod attr;
mod export;
mod fs;
mod index;

pub use export::{NfsExport, NFS_BASE_PORT};
pub use fs::VolumeNfs;
