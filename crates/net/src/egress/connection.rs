//! One proxied connection: find the name it asks for, decide, connect from
//! the slot's namespace, then copy bytes both ways.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

use super::resolve::Resolver;
use super::sniff::{sniff, Sniff, MAX_HEAD};
use crate::boundary::Boundary;
use crate::policy::EgressPolicy;

/// How long a guest may take to send the bytes that name its destination.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long resolving a name and connecting to one address may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection of one slot's proxy shares.
pub(super) struct Context {
    pub scope: String,
    pub netns: PathBuf,
    pub resolver: Arc<Resolver>,
    pub boundary: Arc<Boundary>,
    pub policy: watch::Receiver<Arc<EgressPolicy>>,
}

/// Where a connection may go, decided from the policy in force.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// An allowed name: resolve it and connect to what it resolves to.
    Name(String),
    /// No allowed name, but the address rules allow the original address.
    Original(SocketAddrV4),
    /// Neither: close (with a 403 for plain HTTP).
    Refuse(String),
}

pub(super) fn decide(
    policy: &EgressPolicy,
    name: Option<&str>,
    original: Option<SocketAddrV4>,
) -> Verdict {
    if let Some(name) = name {
        if policy.allowed_domain(name).is_some() {
            return Verdict::Name(name.to_string());
        }
    }
    match original {
        Some(to) if policy.allows_address(*to.ip()) => Verdict::Original(to),
        Some(to) => Verdict::Refuse(match name {
            Some(n) => format!(
                "host {n:?} is not in allowOut and {} is not allowed",
                to.ip()
            ),
            None => format!(
                "{} is not allowed and the connection names no host",
                to.ip()
            ),
        }),
        None => Verdict::Refuse("the connection names no allowed host".to_string()),
    }
}

/// Serves one accepted connection to its end; errors are logged by the
/// caller.
pub(super) async fn handle(ctx: &Context, mut guest: TcpStream) -> io::Result<()> {
    let original = original_destination(&guest);
    let head = read_head(&mut guest).await?;
    let name = match sniff(&head) {
        Sniff::Name(n) => Some(n),
        Sniff::NeedMore | Sniff::NoName => None,
    };
    let is_tls = head.first() == Some(&0x16);
    let policy = ctx.policy.borrow().clone();
    let upstream = match decide(&policy, name.as_deref(), original) {
        Verdict::Name(host) => {
            let port = original.map_or(if is_tls { 443 } else { 80 }, |o| o.port());
            connect_named(ctx, &policy, &host, port).await
        }
        Verdict::Original(to) => connect_in_slot(ctx, to).await,
        Verdict::Refuse(why) => Err(io::Error::new(io::ErrorKind::PermissionDenied, why)),
    };
    let mut upstream = match upstream {
        Ok(s) => s,
        Err(e) => {
            if !is_tls && !head.is_empty() {
                let _ = guest.write_all(forbidden(&e.to_string()).as_bytes()).await;
            }
            return Err(e);
        }
    };
    upstream.write_all(&head).await?;
    tokio::io::copy_bidirectional(&mut guest, &mut upstream).await?;
    Ok(())
}

/// Reads until the bytes name a host (or cannot), the head limit, EOF or
/// the timeout, whichever comes first.
async fn read_head(guest: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let read = async {
        let mut buf = [0u8; 4096];
        while head.len() < MAX_HEAD && sniff(&head) == Sniff::NeedMore {
            let n = guest.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, io::Error>(())
    };
    match tokio::time::timeout(HEAD_TIMEOUT, read).await {
        Ok(r) => r.map(|()| head),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no request head within 10 s",
        )),
    }
}

/// Resolves `host` with the node's resolver and connects to the first
/// address the policy allows.
async fn connect_named(
    ctx: &Context,
    policy: &EgressPolicy,
    host: &str,
    port: u16,
) -> io::Result<TcpStream> {
    let addrs = tokio::time::timeout(RESOLVE_TIMEOUT, ctx.resolver.lookup_v4(host))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("resolving {host}")))??;
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{host} has no IPv4 address"),
    );
    for addr in addrs {
        if !reachable_by_name(&ctx.boundary, policy, addr) {
            last = io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{host} resolves to {addr}, which the egress rules deny"),
            );
            continue;
        }
        match connect_in_slot(ctx, SocketAddrV4::new(addr, port)).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Names never lead where the guest's own packets may not go: the node's
/// surroundings ([`Boundary`]: the host, metadata, private networks the
/// operator did not open, the slots), whatever the rules say; the root
/// table would drop the connection anyway, this says why.
fn reachable_by_name(boundary: &Boundary, policy: &EgressPolicy, addr: Ipv4Addr) -> bool {
    boundary.allows(addr) && policy.allows_named_address(addr)
}

/// Connects from a socket made inside the slot's namespace, so the
/// connection leaves as the guest's own would: SNATed to the slot address,
/// masqueraded by the host, and kept away from the host and other slots by
/// the root table.
async fn connect_in_slot(ctx: &Context, to: SocketAddrV4) -> io::Result<TcpStream> {
    let socket = crate::netns::in_netns(&ctx.scope, ctx.netns.clone(), "egress socket", || {
        // SAFETY: plain socket(2); the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })
    .await
    .map_err(io::Error::other)?;
    let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(socket));
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(to.into())).await {
        Ok(r) => r.map_err(|e| io::Error::new(e.kind(), format!("connecting to {to}: {e}"))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connecting to {to}"),
        )),
    }
}

/// Where the guest meant to go before nftables redirected it here; `None`
/// when it connected to the proxy's address directly.
fn original_destination(stream: &TcpStream) -> Option<SocketAddrV4> {
    let raw = nix::sys::socket::getsockopt(&stream.as_fd(), nix::sys::socket::sockopt::OriginalDst)
        .ok()?;
    let addr = SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(raw.sin_addr.s_addr)),
        u16::from_be(raw.sin_port),
    );
    let local = stream.local_addr().ok()?;
    (std::net::SocketAddr::V4(addr) != local).then_some(addr)
}

fn forbidden(why: &str) -> String {
    let body = format!("siesta egress proxy: {why}\n");
    format!(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> EgressPolicy {
        EgressPolicy {
            allow_internet: false,
            allow_out: vec!["198.18.0.2".parse().unwrap()],
            deny_out: vec!["198.18.0.3".parse().unwrap()],
            allow_domains: vec!["allowed.test".parse().unwrap()],
        }
    }

    fn at(a: &str) -> Option<SocketAddrV4> {
        Some(SocketAddrV4::new(a.parse().unwrap(), 443))
    }

    #[test]
    fn an_allowed_name_wins_whatever_address_the_guest_chose() {
        assert_eq!(
            decide(&policy(), Some("allowed.test"), at("198.18.0.3")),
            Verdict::Name("allowed.test".into())
        );
    }

    #[test]
    fn other_names_fall_back_to_the_address_rules() {
        let p = policy();
        assert_eq!(
            decide(&p, Some("other.test"), at("198.18.0.2")),
            Verdict::Original(at("198.18.0.2").unwrap())
        );
        assert!(matches!(
            decide(&p, Some("other.test"), at("198.18.0.9")),
            Verdict::Refuse(why) if why.contains("\"other.test\" is not in allowOut")
        ));
        assert!(matches!(decide(&p, None, None), Verdict::Refuse(_)));
    }

    #[test]
    fn names_never_lead_to_local_private_or_denied_addresses() {
        let p = policy();
        let node = Boundary::default();
        for bad in [
            "127.0.0.1",
            "169.254.0.22",
            "169.254.169.254",
            "0.0.0.0",
            "198.18.0.3",
            "224.0.0.1",
            "10.0.0.5",
            "192.168.1.1",
            "100.64.0.1",
        ] {
            assert!(!reachable_by_name(&node, &p, bad.parse().unwrap()), "{bad}");
        }
        assert!(reachable_by_name(&node, &p, "192.0.2.7".parse().unwrap()));
        let opened = Boundary::new(vec!["10.0.0.0/24".parse().unwrap()]).unwrap();
        assert!(reachable_by_name(&opened, &p, "10.0.0.5".parse().unwrap()));
    }

    #[test]
    fn refusals_of_plain_http_explain_themselves() {
        let r = forbidden("host \"x\" is not allowed");
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        let (_, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(r.contains(&format!("Content-Length: {}\r\n", body.len())));
    }
}
