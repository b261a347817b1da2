//! What a guest or a content API caller may make of a host file's owner
//! and mode.
//!
//! A volume's files are host files. A setuid program owned by root in
//! one of them would be a way to root for any host user who can reach
//! it, so both ways in (NFS SETATTR and CREATE, and the content API's
//! `uid`, `gid` and `mode`) go through here:
//!
//! - set-user-ID and set-group-ID bits are dropped from every mode set;
//!   the sticky bit is kept (it only limits who may delete a directory's
//!   entries, and grants nothing);
//! - uid and gid 0 become the volume's default owner, 1000 (`user`), as
//!   `root_squash` would map them to its anonymous id. 1000 rather than
//!   65534: everything a guest creates belongs to 1000 already (the NFS
//!   server does not learn the caller's uid), so a file a guest's root
//!   chowns to root stays writable by the guest's `user`, and no file in
//!   a volume belongs to an id that no template has.

use crate::DEFAULT_OWNER;

/// S_ISUID | S_ISGID.
const SET_ID_BITS: u32 = 0o6000;

/// `mode`'s permission and sticky bits; never set-user-ID or set-group-ID.
pub fn mode(mode: u32) -> u32 {
    mode & 0o7777 & !SET_ID_BITS
}

/// `uid`, with root mapped to the volume's default owner.
pub fn uid(uid: u32) -> u32 {
    if uid == 0 {
        DEFAULT_OWNER.0
    } else {
        uid
    }
}

/// `gid`, with root's group mapped to the volume's default group.
pub fn gid(gid: u32) -> u32 {
    if gid == 0 {
        DEFAULT_OWNER.1
    } else {
        gid
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn set_id_bits_and_root_are_squashed() {
        assert_eq!(super::mode(0o4755), 0o755);
        assert_eq!(super::mode(0o2755), 0o755);
        assert_eq!(super::mode(0o7777), 0o1777);
        assert_eq!(super::mode(0o100644), 0o644);
        assert_eq!((super::uid(0), super::gid(0)), (1000, 1000));
        assert_eq!((super::uid(1001), super::gid(5)), (1001, 5));
    }
}
