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
//! | [`guard`] | the guest-facing listener: connection cap, timeouts, a window of calls in flight |
//! | [`record`] | RPC record marking, bounded in size and fragments |
//! | [`call`] | each call's lengths checked before `nfsserve` decodes it |
//!
//! File handles are the volume's generation (from its id) and the inode
//! number, so they stay valid across a restart of the server or of siesta:
//! a paused guest resumes with its mount intact. Everything a guest creates
//! belongs to uid/gid 1000 (`user`), as NFS's `all_squash` would have it:
//! the server does not learn the caller's uid, and a volume is shared.
//! An explicit owner of 0 becomes 1000 too, and set-user-ID and
//! set-group-ID bits are dropped, so that a guest cannot plant a
//! setuid-root program in a host directory.
//!
//! # What a guest can make the server allocate
//!
//! `nfsserve` 0.11 trusts lengths on the wire: it zero-fills a buffer of
//! whatever size a record mark announces (up to 2 GiB, before any byte of
//! it arrives), and its XDR decoder `resize`s every opaque and array to
//! the length the message states (an AUTH_UNIX gid count of 0xffffffff is
//! 16 GiB). Its framing, decoder and per-message handler are private;
//! only its TCP listener is public. So siesta puts its own framing in
//! front ([`guard`], [`record`]) and checks, without allocating, every
//! length `nfsserve` will read ([`call`]): a record is at most 1 MiB plus
//! headers (FSINFO advertises 1 MiB reads and writes) in at most 8
//! fragments, every opaque fits in what is left of its record and in its
//! RFC limit (gids: 16), and listing counts are lowered to 1 MiB. READ
//! counts are lowered to 1 MiB by [`VolumeNfs`] itself. What `nfsserve`
//! is sent is then bounded, and so is what it allocates.
//!
//! Replacing `nfsserve`'s protocol code would mean rewriting its NFSv3
//! procedures; patching it would mean carrying a fork. The checks here
//! mirror its decoder field by field instead; `call`'s doc says which
//! fields, and an upgrade of `nfsserve` must be checked against it.

mod attr;
mod call;
mod export;
mod fs;
#[cfg(test)]
mod fuzz;
mod guard;
mod index;
mod record;

pub use export::{NfsExport, NFS_BASE_PORT};
pub use fs::VolumeNfs;
pub use guard::NfsLimits;
