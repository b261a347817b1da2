//! A volume served over NFS on the loopback, and a small RPC client that
//! can also send what a well-behaved client never would.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use siesta_volume::nfs::{NfsExport, NfsLimits};
use siesta_volume::{VolumeRecord, Volumes};

pub const NFS: u32 = 100_003;
pub const MOUNT: u32 = 100_005;
/// How long a test waits for any one answer before it fails (a bound
/// against hanging, not a timing check).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// setns and chown need root; under `make test` (SIESTA_TESTS_MUST_RUN)
/// or CI a non-root run fails rather than passing without checking.
pub fn need_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("SIESTA_TESTS_MUST_RUN").is_some() || std::env::var_os("CI").is_some() {
        panic!("these tests enter a network namespace and chown: run them as root");
    }
    eprintln!("skipped: not root");
    false
}

/// A volume and its export on 127.0.0.1 (in this process's own network
/// namespace); everything goes away on drop.
pub struct Served {
    // Declared first: dropped (stopped) before the directory goes.
    export: NfsExport,
    pub volumes: Volumes,
    pub record: VolumeRecord,
    _home: tempfile::TempDir,
}

impl Served {
    pub fn new(limit_mib: u64, limits: NfsLimits) -> Self {
        let home = tempfile::tempdir().unwrap();
        let volumes = Volumes::open(&home.path().join("volumes"), 64).unwrap();
        let record = volumes.create("v", Some(limit_mib)).unwrap();
        let fs = volumes.nfs(&record).unwrap();
        let export = NfsExport::start_with(
            Path::new("/proc/self/ns/net"),
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
            fs,
            limits,
        )
        .unwrap();
        Self {
            export,
            volumes,
            record,
            _home: home,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(self.export.addr())
    }

    pub fn data(&self) -> PathBuf {
        self.volumes.data_dir(&self.record)
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr())
    }
}

/// XDR, written.
#[derive(Default, Clone)]
pub struct Xdr(pub Vec<u8>);

impl Xdr {
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn opaque(mut self, data: &[u8]) -> Self {
        self = self.u32(data.len() as u32);
        self.0.extend_from_slice(data);
        self.0.resize(self.0.len().next_multiple_of(4), 0);
        self
    }
    pub fn bytes(mut self, data: &[u8]) -> Self {
        self.0.extend_from_slice(data);
        self
    }
}

/// AUTH_NULL credentials.
pub fn auth_null() -> Xdr {
    Xdr::default().u32(0).u32(0)
}

/// AUTH_UNIX credentials for root, whose gid count says `count` and which
/// carry `gids` of them.
pub fn auth_unix(count: u32, gids: u32) -> Xdr {
    let mut body = Xdr::default()
        .u32(0)
        .opaque(b"guest")
        .u32(0)
        .u32(0)
        .u32(count);
    for g in 0..gids {
        body = body.u32(g);
    }
    Xdr::default().u32(1).opaque(&body.0)
}

/// A whole call record: mark, header, `cred`, AUTH_NULL verifier, `args`.
pub fn call(xid: u32, prog: u32, vers: u32, proc: u32, cred: &Xdr, args: &[u8]) -> Vec<u8> {
    let msg = Xdr::default()
        .u32(xid)
        .u32(0)
        .u32(2)
        .u32(prog)
        .u32(vers)
        .u32(proc)
        .bytes(&cred.0)
        .u32(0)
        .u32(0)
        .bytes(args);
    let mut record = ((msg.0.len() as u32) | 1 << 31).to_be_bytes().to_vec();
    record.extend_from_slice(&msg.0);
    record
}

/// A reply, as far as the tests look.
#[derive(Debug)]
pub enum Reply {
    /// Accepted: accept_stat (0 is SUCCESS) and the results.
    Accepted { xid: u32, stat: u32, body: Vec<u8> },
    /// Denied: reject_stat and what follows it.
    Denied { xid: u32, stat: u32, detail: u32 },
}

impl Reply {
    /// The results of a successful call.
    pub fn results(self) -> Vec<u8> {
        match self {
            Reply::Accepted { stat: 0, body, .. } => body,
            other => panic!("call failed: {other:?}"),
        }
    }
}

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

pub struct Client {
    pub stream: TcpStream,
    next_xid: u32,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect_timeout(&addr, PATIENCE).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream.set_write_timeout(Some(PATIENCE)).unwrap();
        Self {
            stream,
            next_xid: 1,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// One reply record, whole.
    pub fn receive(&mut self) -> std::io::Result<Reply> {
        let mut mark = [0u8; 4];
        self.stream.read_exact(&mut mark)?;
        let len = (u32::from_be_bytes(mark) & !(1 << 31)) as usize;
        let mut msg = vec![0u8; len];
        self.stream.read_exact(&mut msg)?;
        let xid = word(&msg, 0);
        assert_eq!(word(&msg, 4), 1, "a reply");
        if word(&msg, 8) == 1 {
            return Ok(Reply::Denied {
                xid,
                stat: word(&msg, 12),
                detail: word(&msg, 16),
            });
        }
        let verf_len = word(&msg, 16) as usize;
        let at = 20 + verf_len.next_multiple_of(4);
        Ok(Reply::Accepted {
            xid,
            stat: word(&msg, at),
            body: msg[at + 4..].to_vec(),
        })
    }

    /// Whether the server closed this connection (reading gets nothing).
    pub fn closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }

    /// Sends a call with AUTH_NULL and returns its reply.
    pub fn call(&mut self, prog: u32, vers: u32, proc: u32, args: &[u8]) -> Reply {
        let xid = self.next_xid;
        self.next_xid += 1;
        self.send(&call(xid, prog, vers, proc, &auth_null(), args))
            .unwrap();
        let reply = self.receive().unwrap();
        let got = match &reply {
            Reply::Accepted { xid, .. } | Reply::Denied { xid, .. } => *xid,
        };
        assert_eq!(got, xid);
        reply
    }

    /// NFS NULL: whether the server answers it correctly.
    pub fn null_works(&mut self) -> bool {
        let xid = self.next_xid;
        self.next_xid += 1;
        if self.send(&call(xid, NFS, 3, 0, &auth_null(), &[])).is_err() {
            return false;
        }
        matches!(self.receive(), Ok(Reply::Accepted { xid: x, stat: 0, ref body }) if x == xid && body.is_empty())
    }

    /// MOUNT's MNT of the export: the root's file handle.
    pub fn mount_root(&mut self) -> Vec<u8> {
        let body = self
            .call(MOUNT, 3, 1, &Xdr::default().opaque(b"/").0)
            .results();
        assert_eq!(word(&body, 0), 0, "MNT status");
        let len = word(&body, 4) as usize;
        body[8..8 + len].to_vec()
    }

    /// NFS status and results of procedure `proc`.
    pub fn nfs(&mut self, proc: u32, args: &[u8]) -> (u32, Vec<u8>) {
        let body = self.call(NFS, 3, proc, args).results();
        (word(&body, 0), body[4..].to_vec())
    }

    /// GETATTR: status and file type (2: a directory).
    pub fn getattr(&mut self, fh: &[u8]) -> (u32, u32) {
        let (status, rest) = self.nfs(1, &Xdr::default().opaque(fh).0);
        let ftype = if status == 0 { word(&rest, 0) } else { 0 };
        (status, ftype)
    }

    /// LOOKUP of `name` in `dir`: its handle.
    pub fn lookup(&mut self, dir: &[u8], name: &str) -> Vec<u8> {
        let (status, rest) = self.nfs(3, &Xdr::default().opaque(dir).opaque(name.as_bytes()).0);
        assert_eq!(status, 0, "LOOKUP {name}");
        let len = word(&rest, 0) as usize;
        rest[4..4 + len].to_vec()
    }

    /// SETATTR of mode, uid and gid (each only if given): the status.
    pub fn setattr(
        &mut self,
        fh: &[u8],
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> u32 {
        let mut args = Xdr::default().opaque(fh);
        for v in [mode, uid, gid] {
            args = match v {
                Some(v) => args.u32(1).u32(v),
                None => args.u32(0),
            };
        }
        // No size, times unchanged, no guard.
        let args = args.u32(0).u32(0).u32(0).u32(0);
        self.nfs(2, &args.0).0
    }

    /// MKDIR of `name` in `dir` with no attributes: the status.
    pub fn mkdir(&mut self, dir: &[u8], name: &str) -> u32 {
        let args = Xdr::default()
            .opaque(dir)
            .opaque(name.as_bytes())
            .u32(0)
            .u32(0)
            .u32(0)
            .u32(0)
            .u32(0)
            .u32(0);
        self.nfs(9, &args.0).0
    }
}

/// This process's resident memory now, and at its peak since the last
/// [`reset_peak`], in bytes.
pub fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap();
        kib * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Makes the peak start again from the current resident size (Linux
/// 4.0+: "5" to clear_refs).
pub fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}
