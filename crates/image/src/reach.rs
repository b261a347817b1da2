//! Where a registry pull may connect (M7 of the security review).
//!
//! An image build asked for through the HTTP API names its registry, and a
//! pull runs on the host, as root, outside any sandbox: `127.0.0.1:2379`
//! would make the node speak to its own etcd, and a registry's `Bearer
//! realm="http://169.254.169.254/..."` would make it fetch the cloud
//! metadata service. So such a pull gets [`Reach::Public`]: every address
//! it connects to (the registry's, its token service's, any redirect's) must
//! be a public one, or lie in a network the operator opened with
//! `[node] image_registry_private_allow`.
//!
//! How it holds against DNS rebinding: names are resolved once, by
//! [`GuardedResolver`], which checks *every* address the name resolves to
//! and hands the HTTP client only those checked addresses to connect to
//! (there is no second lookup that could answer otherwise). Addresses
//! written as such in a URL are checked before the request
//! ([`Reach::check_url`]) and on each redirect. The operator's own builds
//! (`siesta template build --image` on the host) get [`Reach::Anywhere`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// The setting that opens private networks to API builds, as messages name
/// it.
pub const ALLOW_SETTING: &str = "image_registry_private_allow";
/// Its environment variable (comma-separated networks).
pub const ALLOW_ENV: &str = "SIESTA_IMAGE_REGISTRY_PRIVATE_ALLOW";

/// An IPv4 or IPv6 network: `10.1.2.0/24`, `fd00:1::/64`, or one address
/// (`127.0.0.1` is `127.0.0.1/32`). Host bits are cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// The network of `addr` with `prefix` bits (at most 32 for IPv4, 128
    /// for IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, String> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(format!("prefix /{prefix} is longer than {max} bits"));
        }
        let addr = match addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask32(prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask128(prefix))),
        };
        Ok(Self { addr, prefix })
    }

    /// Whether `addr` is in this network (an IPv4-mapped IPv6 address is
    /// the IPv4 address it maps).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.addr, addr.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                u32::from(a) & mask32(self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                u128::from(a) & mask128(self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }

    /// Whether the two networks share an address.
    fn overlaps(&self, other: &IpNet) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }

    /// The network of one address: `a/32` or `a/128`.
    pub fn host(addr: IpAddr) -> Self {
        let addr = addr.to_canonical();
        Self {
            addr,
            prefix: if addr.is_ipv4() { 32 } else { 128 },
        }
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| {
                format!("{s:?} is not an IP address or network (as 10.1.2.0/24 or fd00::/8)")
            })?;
        let prefix = match prefix {
            Some(p) => p
                .parse()
                .map_err(|_| format!("{s:?}: the prefix {p:?} is not a number of bits"))?,
            None if addr.is_ipv4() => 32,
            None => 128,
        };
        Self::new(addr, prefix).map_err(|e| format!("{s:?}: {e}"))
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Networks an API build's pull does not reach unless the operator opens
/// them, each with what it is.
const CLOSED_V4: [(Ipv4Addr, u8, &str); 10] = [
    (
        Ipv4Addr::new(0, 0, 0, 0),
        8,
        "an unspecified (\"this network\") address",
    ),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "a private address"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "a carrier-grade NAT address",
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "a loopback address"),
    (
        Ipv4Addr::new(169, 254, 0, 0),
        16,
        "a link-local address (where cloud metadata services answer)",
    ),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "a private address"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "an IETF protocol address"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "a private address"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "a multicast address"),
    (
        Ipv4Addr::new(240, 0, 0, 0),
        4,
        "a reserved or broadcast address",
    ),
];

const CLOSED_V6: [(Ipv6Addr, u8, &str); 7] = [
    (Ipv6Addr::UNSPECIFIED, 128, "an unspecified address"),
    (Ipv6Addr::LOCALHOST, 128, "a loopback address"),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        "a link-local address",
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        "a site-local (private) address",
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        "a unique local (private) address",
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        "a multicast address",
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        "a local-use NAT64 address",
    ),
];

/// Networks an operator cannot open: no registry lives where the cloud
/// metadata service answers, and a list that covers it (`0.0.0.0/0`) is a
/// mistake.
const NEVER_OPEN: [(IpAddr, u8); 2] = [
    (IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)), 16),
    (IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10),
];

/// What `addr` is when an API build may not reach it unopened, else `None`.
/// IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`) and NAT64
/// (`64:ff9b::a.b.c.d`) addresses are judged by the IPv4 address they carry.
pub fn closed_range(addr: IpAddr) -> Option<&'static str> {
    match addr.to_canonical() {
        IpAddr::V4(a) => closed_v4(a),
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            if let Some((_, _, what)) = CLOSED_V6
                .iter()
                .find(|(net, prefix, _)| bits & mask128(*prefix) == u128::from(*net))
            {
                return Some(what);
            }
            let nat64 = u128::from(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0));
            let embedded = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
            if bits >> 32 == 0 || bits & mask128(96) == nat64 {
                return closed_v4(embedded);
            }
            None
        }
    }
}

fn closed_v4(a: Ipv4Addr) -> Option<&'static str> {
    CLOSED_V4
        .iter()
        .find(|(net, prefix, _)| u32::from(a) & mask32(*prefix) == u32::from(*net))
        .map(|(_, _, what)| *what)
}

/// Where a pull may connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Reach {
    /// Anywhere: a build the operator started on the host (the CLI), which
    /// may name any registry the host reaches.
    #[default]
    Anywhere,
    /// Public addresses, and the networks in `allow`: a build an API client
    /// asked for. Build it with [`Reach::public`].
    Public { allow: Vec<IpNet> },
}

impl Reach {
    /// [`Reach::Public`] with the networks the operator opened; refuses a
    /// network that overlaps link-local space.
    pub fn public(allow: Vec<IpNet>) -> Result<Self, String> {
        for net in &allow {
            if let Some((a, p)) = NEVER_OPEN
                .iter()
                .find(|&&(a, p)| IpNet { addr: a, prefix: p }.overlaps(net))
            {
                return Err(format!(
                    "{net} overlaps {a}/{p}, link-local space where cloud metadata services \
                     answer: no registry is there, and builds never reach it"
                ));
            }
        }
        Ok(Reach::Public { allow })
    }

    /// Whether a pull may connect to `addr` (of `host`, for the message).
    pub fn check(&self, host: &str, addr: IpAddr) -> Result<(), AddressRefused> {
        let Reach::Public { allow } = self else {
            return Ok(());
        };
        let Some(range) = closed_range(addr) else {
            return Ok(());
        };
        if allow.iter().any(|net| net.contains(addr)) {
            return Ok(());
        }
        Err(AddressRefused {
            host: host.to_string(),
            addr: addr.to_canonical(),
            range,
        })
    }

    /// Checks a URL before a request: an address written in it must be one
    /// this reach allows. A name is checked when it is resolved
    /// ([`GuardedResolver`]); the HTTP client speaks HTTP(S) only.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), AddressRefused> {
        if *self == Reach::Anywhere {
            return Ok(());
        }
        let host = url.host_str().unwrap_or("");
        match literal(host) {
            Some(addr) => self.check(host, addr),
            None => Ok(()),
        }
    }

    /// Resolves `host` (a name or an address, without a port) and checks
    /// every address it has. A name that does not resolve passes: the pull
    /// itself then fails, saying the registry cannot be reached.
    pub async fn check_host(&self, host: &str, port: u16) -> Result<(), AddressRefused> {
        if *self == Reach::Anywhere {
            return Ok(());
        }
        if let Some(addr) = literal(host) {
            return self.check(host, addr);
        }
        let Ok(addrs) = tokio::net::lookup_host((host, port)).await else {
            return Ok(());
        };
        for addr in addrs {
            self.check(host, addr.ip())?;
        }
        Ok(())
    }
}

/// `host` as an address, if it is one (`[::1]` too).
fn literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// A connection a pull may not make: `host` is at `addr`, which is
/// `range` (loopback, private, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRefused {
    pub host: String,
    pub addr: IpAddr,
    pub range: &'static str,
}

impl AddressRefused {
    /// The setting's value that would open this one address.
    pub fn allow_hint(&self) -> String {
        IpNet::host(self.addr).to_string()
    }
}

impl fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.trim_start_matches('[').trim_end_matches(']') == self.addr.to_string() {
            write!(f, "`{}` is {}", self.host, self.range)?;
        } else {
            write!(
                f,
                "`{}` resolves to {}, {}",
                self.host, self.addr, self.range
            )?;
        }
        let net = self.allow_hint();
        write!(
            f,
            "; builds asked for through the API reach only public addresses unless the \
             operator opens the network with `{ALLOW_SETTING} = [\"{net}\"]` under [node] in \
             siesta.toml (or {ALLOW_ENV}={net})"
        )
    }
}

impl std::error::Error for AddressRefused {}

/// The resolver of a [`Reach::Public`] pull's HTTP client: it resolves a
/// name once, refuses it when any of its addresses is closed, and gives the
/// client exactly the addresses it checked.
pub(crate) struct GuardedResolver {
    pub(crate) reach: Reach,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let reach = self.reach.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for addr in &addrs {
                reach.check(&host, addr.ip())?;
            }
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The refusal somewhere in an error's causes (the HTTP client wraps what
/// its resolver or redirect policy returned).
pub(crate) fn refusal_in(e: &(dyn std::error::Error + 'static)) -> Option<AddressRefused> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<AddressRefused>() {
            return Some(r.clone());
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn closed_ranges_cover_the_host_its_networks_and_their_ipv6_forms() {
        for closed in [
            "127.0.0.1",
            "127.8.9.10",
            "0.0.0.0",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.254",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "224.0.0.251",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd00:ec2::254",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.1.2.3",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
        ] {
            assert!(
                closed_range(ip(closed)).is_some(),
                "{closed} must be closed"
            );
        }
        for open in [
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(closed_range(ip(open)), None, "{open} must be open");
        }
        assert_eq!(closed_range(ip("127.0.0.1")), Some("a loopback address"));
    }

    #[test]
    fn public_reach_refuses_closed_addresses_unless_opened_and_anywhere_allows_all() {
        let closed = Reach::public(vec![]).unwrap();
        let e = closed.check("localhost", ip("127.0.0.1")).unwrap_err();
        let text = e.to_string();
        for part in [
            "`localhost` resolves to 127.0.0.1, a loopback address",
            "loopback",
            "image_registry_private_allow = [\"127.0.0.1/32\"]",
            "SIESTA_IMAGE_REGISTRY_PRIVATE_ALLOW=127.0.0.1/32",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        let mapped = closed.check("x", ip("::ffff:127.0.0.1")).unwrap_err();
        assert_eq!(mapped.addr, ip("127.0.0.1"));
        assert!(closed.check("x", ip("8.8.8.8")).is_ok());
        assert!(Reach::Anywhere.check("x", ip("127.0.0.1")).is_ok());

        let opened = Reach::public(vec![
            "127.0.0.1".parse().unwrap(),
            "10.1.2.0/24".parse().unwrap(),
            "fd00:1::/64".parse().unwrap(),
        ])
        .unwrap();
        assert!(opened.check("x", ip("127.0.0.1")).is_ok());
        assert!(opened.check("x", ip("::ffff:127.0.0.1")).is_ok());
        assert!(opened.check("x", ip("127.0.0.2")).is_err());
        assert!(opened.check("x", ip("10.1.2.200")).is_ok());
        assert!(opened.check("x", ip("10.1.3.1")).is_err());
        assert!(opened.check("x", ip("fd00:1::5")).is_ok());
        assert!(opened.check("x", ip("fd00:2::5")).is_err());
        assert!(opened.check("x", ip("::1")).is_err());
    }

    #[test]
    fn metadata_space_cannot_be_opened() {
        for bad in [
            "169.254.169.254",
            "0.0.0.0/0",
            "169.0.0.0/8",
            "fe80::/64",
            "::/0",
        ] {
            let e = Reach::public(vec![bad.parse().unwrap()]).unwrap_err();
            assert!(e.contains("link-local"), "{bad}: {e}");
        }
    }

    #[test]
    fn networks_parse_as_operators_write_them() {
        let n: IpNet = "10.1.2.3/24".parse().unwrap();
        assert_eq!(n.to_string(), "10.1.2.0/24");
        assert_eq!("::1".parse::<IpNet>().unwrap().to_string(), "::1/128");
        assert_eq!("[::1]/128".parse::<IpNet>().unwrap().to_string(), "::1/128");
        assert_eq!(
            "0.0.0.0/0".parse::<IpNet>().unwrap().to_string(),
            "0.0.0.0/0"
        );
        for bad in ["10.1.2", "10.0.0.0/33", "::/129", "x", "10.0.0.0/a"] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_are_checked_by_the_address_they_name() {
        let closed = Reach::public(vec![]).unwrap();
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        for bad in [
            "http://127.0.0.1:5000/v2/",
            "http://[::1]/v2/",
            "http://169.254.169.254/latest/meta-data/",
            // The URL parser reads these as 127.0.0.1, as a browser would.
            "http://2130706433/",
            "http://0x7f.1/",
        ] {
            assert!(closed.check_url(&url(bad)).is_err(), "{bad}");
        }
        assert!(closed
            .check_url(&url("https://auth.docker.io/token"))
            .is_ok());
        let e = closed
            .check_url(&url("http://127.0.0.1:5000/v2/"))
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("`127.0.0.1` is a loopback address;"),
            "{e}"
        );
        assert!(Reach::Anywhere.check_url(&url("http://127.0.0.1/")).is_ok());
    }

    #[tokio::test]
    async fn names_are_judged_by_what_they_resolve_to() {
        let closed = Reach::public(vec![]).unwrap();
        let e = closed.check_host("localhost", 5000).await.unwrap_err();
        assert_eq!(e.host, "localhost");
        assert!(closed_range(e.addr).is_some(), "{e}");
        // A name that does not resolve is left to the pull to report.
        assert!(closed.check_host("no-such-host.invalid", 443).await.is_ok());
    }
}
