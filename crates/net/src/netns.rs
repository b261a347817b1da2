//! Entering a network namespace on a dedicated thread, listing namespaces,
//! and flushing a namespace's conntrack table over netlink.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use nix::sched::{setns, CloneFlags};

use crate::error::{NetError, Result};

/// Runs `f` on a fresh OS thread that has joined the network namespace at
/// `path` (e.g. `/run/netns/NAME`). Sockets it opens belong to that
/// namespace, also after the thread ends. The thread never returns to a
/// pool, so no other code runs in the wrong namespace.
pub fn spawn_in_netns<T, F>(path: &Path, f: F) -> JoinHandle<io::Result<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let path = path.to_owned();
    std::thread::spawn(move || {
        enter(&path)?;
        Ok(f())
    })
}

fn enter(path: &Path) -> io::Result<()> {
    let ns = File::open(path)?;
    setns(&ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// Async wrapper of [`spawn_in_netns`] for fallible work.
pub(crate) async fn in_netns<T, F>(scope: &str, path: PathBuf, what: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> io::Result<T> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let _detached = spawn_in_netns(&path, move || {
        let _ = tx.send(f());
    });
    match rx.await {
        Ok(r) => r.map_err(|e| NetError::io(scope, what, e)),
        // The sender was dropped without sending: entering the ns failed or
        // the closure panicked.
        Err(_) => match _detached.join() {
            Ok(Err(e)) => Err(NetError::io(
                scope,
                format!("{what}: enter {}", path.display()),
                e,
            )),
            _ => Err(NetError::io(
                scope,
                what,
                io::Error::other("worker thread died"),
            )),
        },
    }
}

/// Names from `ip netns list` output (`NAME` or `NAME (id: N)` per line).
pub fn parse_netns_list(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Interface names from `ip -o link show` output
/// (`N: NAME[@PEER]: <FLAGS> ...` per line).
pub fn parse_link_names(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .collect()
}

/// The `dev` of `ip route show default` output, if any.
pub fn parse_default_dev(out: &str) -> Option<String> {
    let line = out.lines().find(|l| l.starts_with("default"))?;
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == "dev" {
            return words.next().map(str::to_owned);
        }
    }
    None
}

/// Turns IPv6 off on every interface of the calling thread's namespace,
/// present and future: slots filter IPv4 only, so a guest must have no
/// IPv6 path out of its namespace at all. A kernel without IPv6 has
/// nothing to turn off.
pub(crate) fn disable_ipv6() -> io::Result<()> {
    for knob in ["all", "default"] {
        let path = format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6");
        match std::fs::write(&path, "1") {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io::Error::new(e.kind(), format!("{path}: {e}"))),
        }
    }
    Ok(())
}

/// Deletes every IPv4 conntrack entry of the calling thread's namespace
/// (one IPCTNL_MSG_CT_DELETE without attributes, as `conntrack -F` does).
pub(crate) fn flush_conntrack() -> io::Result<()> {
    const NFNL_SUBSYS_CTNETLINK: u16 = 1;
    const IPCTNL_MSG_CT_DELETE: u16 = 2;
    // SAFETY: plain socket syscall; the fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = sock.as_raw_fd();

    let mut msg = Vec::with_capacity(20);
    msg.extend_from_slice(&20u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE).to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: kernel assigns
    msg.push(libc::AF_INET as u8); // nfgen_family
    msg.push(0); // NFNETLINK_V0
    msg.extend_from_slice(&0u16.to_be_bytes()); // res_id

    // SAFETY: zeroed sockaddr_nl addresses the kernel.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: msg and addr outlive the call; lengths match.
    let sent = unsafe {
        libc::sendto(
            raw,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 4096];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    parse_ack(&buf[..n as usize])
}

/// Checks a netlink reply is an ACK (NLMSG_ERROR with error 0).
fn parse_ack(reply: &[u8]) -> io::Result<()> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "short netlink reply");
    let ty = u16::from_ne_bytes(
        reply
            .get(4..6)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    if ty != libc::NLMSG_ERROR as u16 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected netlink reply type {ty}"),
        ));
    }
    let err = i32::from_ne_bytes(
        reply
            .get(16..20)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    match err {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(-e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ip_outputs() {
        assert_eq!(
            parse_netns_list("siesta-a-1 (id: 3)\nsiesta-a-0\n\n"),
            ["siesta-a-1", "siesta-a-0"]
        );
        assert_eq!(
            parse_link_names(
                "1: lo: <LOOPBACK,UP> mtu 65536\n7: svha0@if2: <BROADCAST> mtu 1500\n"
            ),
            ["lo", "svha0"]
        );
        assert_eq!(
            parse_default_dev("default via 192.0.2.1 dev eth0 proto dhcp\n").as_deref(),
            Some("eth0")
        );
        assert_eq!(parse_default_dev(""), None);
    }

    #[test]
    fn parses_netlink_ack() {
        let mut ack = vec![0u8; 36];
        ack[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        assert!(parse_ack(&ack).is_ok());
        ack[16..20].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert_eq!(
            parse_ack(&ack).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        assert!(parse_ack(&ack[..8]).is_err());
    }
}
