//! Egress policy of a slot and the record of what was last applied.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::egress::DomainPattern;

/// What a guest may reach. Default: the internet is allowed (as in E2B).
///
/// Precedence, as E2B documents it: an address in `allow_out` is reachable
/// even when `deny_out` covers it or the internet is off; otherwise one in
/// `deny_out` is not; otherwise `allow_internet` decides. Replies to
/// connections the host opened to the guest always pass.
///
/// Domain rules (`allow_domains`, only ever an allow list, as in E2B) apply
/// to TCP on ports 80 and 443: the egress proxy ([`crate::egress`]) reads
/// the name the guest asked for (TLS SNI or HTTP `Host`), resolves it
/// itself and connects to what the name resolves to, never to the address
/// the guest picked. A domain rule overrides only a deny rule as broad as
/// `0.0.0.0/0` (or the internet being off): an address that a narrower deny
/// rule covers is never reached through a name. Other ports and UDP follow
/// the address rules alone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EgressPolicy {
    pub allow_internet: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<Cidr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<Cidr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_domains: Vec<DomainPattern>,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        Self::internet(true)
    }
}

impl EgressPolicy {
    /// The internet on or off, with no address rules.
    pub fn internet(allow: bool) -> Self {
        Self {
            allow_internet: allow,
            allow_out: Vec::new(),
            deny_out: Vec::new(),
            allow_domains: Vec::new(),
        }
    }

    /// Whether the policy has rules beyond internet on/off.
    pub fn has_rules(&self) -> bool {
        !self.allow_out.is_empty() || !self.deny_out.is_empty() || self.has_domains()
    }

    /// Whether connections on ports 80 and 443 go through the egress proxy.
    pub fn has_domains(&self) -> bool {
        !self.allow_domains.is_empty()
    }

    /// Whether the address rules alone let the guest reach `addr`.
    pub fn allows_address(&self, addr: Ipv4Addr) -> bool {
        if self.allow_out.iter().any(|c| c.contains(addr)) {
            return true;
        }
        if self.deny_out.iter().any(|c| c.contains(addr)) {
            return false;
        }
        self.allow_internet
    }

    /// Whether `addr`, which an allowed name resolved to, may be reached:
    /// yes unless a deny rule narrower than `0.0.0.0/0` covers it (and no
    /// allow rule does).
    pub fn allows_named_address(&self, addr: Ipv4Addr) -> bool {
        self.allow_out.iter().any(|c| c.contains(addr))
            || !self
                .deny_out
                .iter()
                .any(|c| c.prefix > 0 && c.contains(addr))
    }

    /// The domain rule that allows `host` (normalised), if any.
    pub fn allowed_domain(&self, host: &str) -> Option<&DomainPattern> {
        self.allow_domains.iter().find(|d| d.matches(host))
    }
}

/// An IPv4 network in CIDR notation (`10.0.0.0/8`; a bare address is a
/// `/32`). Host bits are cleared, so `10.1.2.3/8` is `10.0.0.0/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    addr: Ipv4Addr,
    prefix: u8,
}

impl Cidr {
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Result<Self, String> {
        if prefix > 32 {
            return Err(format!("prefix /{prefix} is longer than 32"));
        }
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        Ok(Self {
            addr: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        })
    }

    /// The network's first address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// Whether `addr` is inside this network.
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0);
        u32::from(addr) & mask == u32::from(self.addr)
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = s.split_once('/').unwrap_or((s, "32"));
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IPv4 address or CIDR"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| format!("{s:?} has no valid prefix length"))?;
        Self::new(addr, prefix).map_err(|e| format!("{s:?}: {e}"))
    }
}

impl TryFrom<String> for Cidr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> String {
        c.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Result of [`crate::Slot::apply_policy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyUpdate {
    /// The chain was rewritten.
    Applied,
    /// The slot already had this policy; no nft call was made.
    Skipped,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_normalise() {
        assert_eq!(
            "10.1.2.3/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!("1.2.3.4".parse::<Cidr>().unwrap().to_string(), "1.2.3.4/32");
        assert_eq!(
            "0.0.0.0/0".parse::<Cidr>().unwrap().to_string(),
            "0.0.0.0/0"
        );
        for bad in [
            "example.com",
            "10.0.0.0/33",
            "10.0.0/8",
            "::1/128",
            "1.2.3.4/x",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn address_and_name_precedence() {
        let a = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let policy = EgressPolicy {
            allow_internet: true,
            allow_out: vec!["10.9.0.7".parse().unwrap()],
            deny_out: vec!["10.9.0.0/24".parse().unwrap(), "0.0.0.0/0".parse().unwrap()],
            allow_domains: vec!["*.allowed.test".parse().unwrap()],
        };
        assert!(policy.has_domains() && policy.has_rules());
        assert!(policy.allows_address(a("10.9.0.7")));
        assert!(!policy.allows_address(a("10.9.0.8")));
        assert!(!policy.allows_address(a("192.0.2.1")));
        // A name overrides the catch-all deny, never the narrower one.
        assert!(policy.allows_named_address(a("192.0.2.1")));
        assert!(!policy.allows_named_address(a("10.9.0.8")));
        assert!(policy.allows_named_address(a("10.9.0.7")));
        assert!(policy.allowed_domain("x.allowed.test").is_some());
        assert!(policy.allowed_domain("allowed.test").is_none());
        // Old records without the field still read.
        let old: EgressPolicy =
            serde_json::from_str(r#"{"allow_internet":false,"deny_out":["1.2.3.4/32"]}"#).unwrap();
        assert!(old.allow_domains.is_empty() && !old.has_domains());
    }
}
