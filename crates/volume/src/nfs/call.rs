//! Checks one RPC call before `nfsserve` decodes it.
//!
//! `nfsserve`'s XDR decoder sizes every variable-length field from the
//! length the message states (`Vec::resize` before reading), so a 60-byte
//! call can make it allocate 16 GiB. This module walks the same fields in
//! the same order, without allocating, and refuses a call in which any
//! length is larger than what is left of the record or than the RFC's own
//! limit. It walks only up to the last variable-length field that
//! `nfsserve` reads for a given procedure: fixed-size fields after it
//! cannot make the decoder allocate.
//!
//! It also lowers the counts of READDIR and READDIRPLUS to [`MAX_COUNT`]
//! (RFC 1813 lets the server answer less than asked), so that no reply
//! can be larger than a record.

/// Largest READ, WRITE and directory listing, as FSINFO advertises them.
pub const MAX_COUNT: u32 = 1 << 20;
/// RFC 5531: credentials and verifiers have at most 400 bytes.
const MAX_AUTH_BYTES: u32 = 400;
/// RFC 5531: AUTH_UNIX machine names and supplementary groups.
const MAX_MACHINE_NAME: u32 = 255;
const MAX_GIDS: u32 = 16;
/// RFC 1813: NFS3_FHSIZE.
const MAX_FH: u32 = 64;
/// RFC 1813 (MOUNT): MNTPATHLEN.
const MAX_DIRPATH: u32 = 1024;
/// Linux's PATH_MAX: a longer symbolic link target cannot be stored.
const MAX_LINK_TARGET: u32 = 4096;
/// `nfsserve` subtracts 128 from a listing's count; less would wrap.
const MIN_DIR_COUNT: u32 = 128;

const AUTH_UNIX: u32 = 1;
const NFS_PROGRAM: u32 = 100_003;
const MOUNT_PROGRAM: u32 = 100_005;

/// Why a call was refused, and how to answer it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not a call at all (or not even an xid): the connection is closed.
    #[error("not an RPC call: {0}")]
    NotACall(&'static str),
    /// Bad credentials: answered AUTH_ERROR (AUTH_BADCRED).
    #[error("call {xid:#x}: bad credentials: {why}")]
    Credentials { xid: u32, why: Bound },
    /// Bad arguments: answered GARBAGE_ARGS.
    #[error("call {xid:#x}: bad arguments: {why}")]
    Arguments { xid: u32, why: Bound },
}

/// The field that broke a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Bound {
    #[error("{field} is cut short")]
    Truncated { field: &'static str },
    #[error("{field} has length {len}, more than {max}")]
    TooLong {
        field: &'static str,
        len: u32,
        max: u32,
    },
    #[error("{field} is {value}, less than {min}")]
    TooSmall {
        field: &'static str,
        value: u32,
        min: u32,
    },
    #[error("{field} has the unknown value {value}")]
    BadValue { field: &'static str, value: u32 },
}

/// A call that may go on to `nfsserve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc: u32,
    /// Where its arguments start in the message.
    pub args: usize,
}

/// Checks the RPC message `msg` (one whole record, without its record
/// marks), lowering counts in place where the server may.
pub fn check_call(msg: &mut [u8]) -> Result<Call, Refused> {
    let mut x = Xdr { buf: msg, pos: 0 };
    let xid = x.u32("xid").map_err(|_| Refused::NotACall("no xid"))?;
    match x.u32("message type") {
        Ok(0) => {}
        _ => return Err(Refused::NotACall("a reply, or no message type")),
    }
    let args = |why| Refused::Arguments { xid, why };
    let rpcvers = x.u32("rpcvers").map_err(args)?;
    let prog = x.u32("program").map_err(args)?;
    let vers = x.u32("version").map_err(args)?;
    let proc = x.u32("procedure").map_err(args)?;
    check_auth(&mut x, "credentials").map_err(|why| Refused::Credentials { xid, why })?;
    x.u32("verifier flavor")
        .and_then(|_| x.opaque("verifier", MAX_AUTH_BYTES))
        .map_err(|why| Refused::Credentials { xid, why })?;
    let call = Call {
        xid,
        prog,
        vers,
        proc,
        args: x.pos,
    };
    // nfsserve answers RPC_MISMATCH before it reads any argument.
    if rpcvers == 2 {
        match prog {
            NFS_PROGRAM if vers == 3 => check_nfs3(&mut x, proc).map_err(args)?,
            MOUNT_PROGRAM if proc == 1 || proc == 3 => {
                x.opaque("dirpath", MAX_DIRPATH).map_err(args)?;
            }
            // PORTMAP's GETPORT has fixed-size arguments; nfsserve reads no
            // arguments of any other program or procedure.
            _ => {}
        }
    }
    Ok(call)
}

/// `opaque_auth` (flavor, body); an AUTH_UNIX body is checked inside too:
/// nfsserve decodes it, gid list included, for every call.
fn check_auth(x: &mut Xdr<'_>, field: &'static str) -> Result<(), Bound> {
    let flavor = x.u32(field)?;
    let start = x.pos;
    let len = x.opaque(field, MAX_AUTH_BYTES)?;
    if flavor != AUTH_UNIX {
        return Ok(());
    }
    let mut b = Xdr {
        buf: &mut x.buf[start + 4..start + 4 + len],
        pos: 0,
    };
    b.u32("AUTH_UNIX stamp")?;
    b.opaque("AUTH_UNIX machine name", MAX_MACHINE_NAME)?;
    b.u32("AUTH_UNIX uid")?;
    b.u32("AUTH_UNIX gid")?;
    let gids = b.u32("AUTH_UNIX gids")?;
    if gids > MAX_GIDS {
        return Err(Bound::TooLong {
            field: "AUTH_UNIX gids",
            len: gids,
            max: MAX_GIDS,
        });
    }
    b.skip("AUTH_UNIX gids", gids as usize * 4)
}

/// The arguments of NFSv3 procedure `proc`, up to their last
/// variable-length field. Procedures nfsserve does not implement (MKNOD,
/// LINK, COMMIT) are answered PROC_UNAVAIL without reading them.
fn check_nfs3(x: &mut Xdr<'_>, proc: u32) -> Result<(), Bound> {
    match proc {
        // GETATTR, SETATTR, ACCESS, READLINK, READ, FSSTAT, FSINFO,
        // PATHCONF: a handle, then fixed-size fields.
        1 | 2 | 4 | 5 | 6 | 18 | 19 | 20 => x.handle(),
        // LOOKUP, CREATE, MKDIR, REMOVE, RMDIR: a directory and a name
        // (CREATE's and MKDIR's attributes have no lengths).
        3 | 8 | 9 | 12 | 13 => x.dirop(),
        7 => {
            x.handle()?;
            x.skip("WRITE offset, count and stable", 16)?;
            x.opaque("WRITE data", MAX_COUNT).map(drop)
        }
        10 => {
            x.dirop()?;
            x.sattr3()?;
            x.opaque("SYMLINK target", MAX_LINK_TARGET).map(drop)
        }
        14 => {
            x.dirop()?;
            x.dirop()
        }
        16 => {
            x.handle()?;
            x.skip("READDIR cookie and verifier", 16)?;
            x.count("READDIR count")
        }
        17 => {
            x.handle()?;
            x.skip("READDIRPLUS cookie and verifier", 16)?;
            x.count("READDIRPLUS dircount")?;
            x.count("READDIRPLUS maxcount")
        }
        _ => Ok(()),
    }
}

/// A cursor over XDR data: every read is checked against what is left.
struct Xdr<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Xdr<'_> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, Bound> {
        let bytes = self
            .buf
            .get(self.pos..self.pos + 4)
            .ok_or(Bound::Truncated { field })?;
        let value = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        self.pos += 4;
        Ok(value)
    }

    fn skip(&mut self, field: &'static str, n: usize) -> Result<(), Bound> {
        if n > self.left() {
            return Err(Bound::Truncated { field });
        }
        self.pos += n;
        Ok(())
    }

    /// A variable-length opaque of at most `max` bytes, padded to 4: its
    /// length (unpadded).
    fn opaque(&mut self, field: &'static str, max: u32) -> Result<usize, Bound> {
        let len = self.u32(field)?;
        if len > max {
            return Err(Bound::TooLong { field, len, max });
        }
        let padded = (len as usize).div_ceil(4) * 4;
        self.skip(field, padded)?;
        Ok(len as usize)
    }

    fn handle(&mut self) -> Result<(), Bound> {
        self.opaque("file handle", MAX_FH).map(drop)
    }

    /// `diropargs3`: a directory handle and a name. The name's own limit
    /// (255 bytes) is the file system's to answer, with NAMETOOLONG.
    fn dirop(&mut self) -> Result<(), Bound> {
        self.handle()?;
        self.opaque("file name", u32::MAX).map(drop)
    }

    /// `sattr3`, read as nfsserve reads it: a set flag is any non-zero word.
    fn sattr3(&mut self) -> Result<(), Bound> {
        for (field, size) in [("mode", 4), ("uid", 4), ("gid", 4), ("size", 8)] {
            if self.u32(field)? != 0 {
                self.skip(field, size)?;
            }
        }
        for field in ["atime", "mtime"] {
            match self.u32(field)? {
                0 | 1 => {}
                2 => self.skip(field, 8)?,
                value => return Err(Bound::BadValue { field, value }),
            }
        }
        Ok(())
    }

    /// A listing's byte count: at least what nfsserve needs, lowered to
    /// [`MAX_COUNT`] in place.
    fn count(&mut self, field: &'static str) -> Result<(), Bound> {
        let at = self.pos;
        let value = self.u32(field)?;
        if value < MIN_DIR_COUNT {
            return Err(Bound::TooSmall {
                field,
                value,
                min: MIN_DIR_COUNT,
            });
        }
        if value > MAX_COUNT {
            self.buf[at..at + 4].copy_from_slice(&MAX_COUNT.to_be_bytes());
        }
        Ok(())
    }
}
