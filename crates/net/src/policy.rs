//! Egress policy of a slot and the record of what was last applied.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a guest may reach. Default: the internet is allowed (as in E2B).
///
/// Precedence, as E2B documents it: an address in `allow_out` is reachable
/// even when `deny_out` covers it or the internet is off; otherwise one in
/// `deny_out` is not; otherwise `allow_internet` decides. Replies to
/// connections the host opened to the guest always pass.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EgressPolicy {
    pub allow_internet: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<Cidr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<Cidr>,
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
        }
    }

    /// Whether the policy has address rules beyond internet on/off.
    pub fn has_rules(&self) -> bool {
        !self.allow_out.is_empty() || !self.deny_out.is_empty()
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
}
