//! Fixed addresses and name derivation: everything that decides *where* a slot
//! lives, as pure functions so it can be unit-tested without root.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;

use crate::error::NetError;

/// Address of every guest inside its own namespace.
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 21);
/// Address of the tap (the guest's gateway) inside every namespace.
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 22);
/// Prefix length of the guest/tap link.
pub const GUEST_PREFIX: u8 = 30;
/// Network of the guest/tap link (169.254.0.20/30).
pub const GUEST_NET: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 20);
/// MAC of the guest NIC; baked into templates.
pub const GUEST_MAC: &str = "02:fc:00:00:00:15";
/// MAC of the tap: fixed so the ARP entry a guest cached in a snapshot stays
/// valid in every slot.
pub const TAP_MAC: &str = "02:fc:00:00:00:16";
/// Name of the tap inside every namespace; the VMM opens it by this name.
pub const TAP_NAME: &str = "tap0";
/// Name of the namespace side of the slot's veth pair (private to the ns).
pub const NS_VETH_NAME: &str = "veth0";
/// MAC of the namespace side of every slot's veth pair. Each pair is a link
/// of its own, so one address serves all; being fixed, the host holds it
/// as a permanent neighbour of the slot address and never resolves it (see
/// `slot::build`).
pub const NS_VETH_MAC: &str = "02:fc:00:00:00:01";
/// Name of the guest side of the test-only veth that replaces the tap.
pub const FAKE_GUEST_IF: &str = "eth0";
/// Port of the guest agent (envd).
pub const AGENT_PORT: u16 = 49983;
/// Port of a slot's egress proxy on `GATEWAY_ADDR` (see [`crate::egress`]).
pub const EGRESS_PROXY_PORT: u16 = 15001;
/// The name servers a guest's `/etc/resolv.conf` lists (set by the agent
/// at boot); reachable on port 53 whenever a policy has domain rules, so
/// that names still resolve under a deny-all rule.
pub const GUEST_NAMESERVERS: [std::net::Ipv4Addr; 2] = [
    std::net::Ipv4Addr::new(1, 1, 1, 1),
    std::net::Ipv4Addr::new(8, 8, 8, 8),
];
/// Name of the per-namespace nftables table.
pub const NS_TABLE: &str = "siesta";
/// Tag used when the caller gives none.
pub const DEFAULT_TAG: &str = "s";
/// Default /16 the slot /30s are carved from.
pub const DEFAULT_SUBNET: Subnet = Subnet {
    base: Ipv4Addr::new(10, 250, 0, 0),
    prefix: 16,
};
/// Linux IFNAMSIZ - 1.
pub const MAX_IFNAME: usize = 15;
/// Longest accepted instance tag.
pub const MAX_TAG: usize = 6;
/// Where `ip netns add` bind-mounts namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Short instance tag: 1..=6 lowercase ASCII letters. Letters only, so that
/// `<tag><index>` is unambiguous (no tag's names can be another tag's).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tag(String);

impl Tag {
    pub fn new(tag: &str) -> Result<Self, NetError> {
        if tag.is_empty() || tag.len() > MAX_TAG || !tag.bytes().all(|b| b.is_ascii_lowercase()) {
            return Err(NetError::Config(format!(
                "tag {tag:?} must be 1..={MAX_TAG} lowercase ASCII letters"
            )));
        }
        Ok(Self(tag.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Name of the root-namespace nftables table owned by this instance.
    pub fn root_table(&self) -> String {
        format!("siesta-{}", self.0)
    }

    /// Namespace name of slot `index`.
    pub fn netns_name(&self, index: usize) -> String {
        format!("siesta-{}-{index}", self.0)
    }

    /// Namespace name of the test-only fake guest of slot `index`.
    pub fn guest_netns_name(&self, index: usize) -> String {
        format!("siesta-{}-{index}-guest", self.0)
    }

    /// Host (root namespace) side of slot `index`'s veth pair.
    pub fn host_veth(&self, index: usize) -> String {
        format!("svh{}{index}", self.0)
    }

    /// Parses a namespace name produced by [`Tag::netns_name`] or
    /// [`Tag::guest_netns_name`] for exactly this tag; returns the index.
    pub fn parse_netns(&self, name: &str) -> Option<usize> {
        let rest = name
            .strip_prefix("siesta-")?
            .strip_prefix(self.0.as_str())?;
        let rest = rest.strip_prefix('-')?;
        let digits = rest.strip_suffix("-guest").unwrap_or(rest);
        parse_index(digits)
    }

    /// Parses a host veth name produced by [`Tag::host_veth`] for exactly this
    /// tag; returns the index.
    pub fn parse_host_veth(&self, name: &str) -> Option<usize> {
        let rest = name.strip_prefix("svh")?.strip_prefix(self.0.as_str())?;
        parse_index(rest)
    }
}

impl Default for Tag {
    fn default() -> Self {
        Self(DEFAULT_TAG.to_owned())
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Canonical decimal index (no sign, no leading zeros).
fn parse_index(digits: &str) -> Option<usize> {
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

/// An IPv4 network the slot /30s are carved from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet {
    base: Ipv4Addr,
    prefix: u8,
}

impl Subnet {
    /// `base` must be aligned to `prefix`; prefix 8..=30.
    pub fn new(base: Ipv4Addr, prefix: u8) -> Result<Self, NetError> {
        if !(8..=30).contains(&prefix) {
            return Err(NetError::Config(format!(
                "subnet prefix /{prefix} must be within /8../30"
            )));
        }
        let mask = u32::MAX << (32 - prefix);
        if u32::from(base) & !mask != 0 {
            return Err(NetError::Config(format!(
                "subnet {base}/{prefix} has host bits set"
            )));
        }
        Ok(Self { base, prefix })
    }

    /// `10.<second_octet>.0.0/16`, as the default `10.250.0.0/16` is.
    pub fn ten_slash_16(second_octet: u8) -> Self {
        Self {
            base: Ipv4Addr::new(10, second_octet, 0, 0),
            prefix: 16,
        }
    }

    pub fn base(&self) -> Ipv4Addr {
        self.base
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether network `addr`/`prefix` shares an address with this one.
    pub fn overlaps(&self, addr: Ipv4Addr, prefix: u8) -> bool {
        let range = |base: u32, prefix: u8| {
            let size = 1u64 << (32 - u32::from(prefix.min(32)));
            let start = u64::from(base) & !(size - 1);
            (start, start + size)
        };
        let (a0, a1) = range(u32::from(self.base), self.prefix);
        let (b0, b1) = range(u32::from(addr), prefix);
        a0 < b1 && b0 < a1
    }

    /// How many /30 slots fit.
    pub fn max_slots(&self) -> usize {
        1usize << (32 - u32::from(self.prefix) - 2)
    }

    /// Host-side (.1) and namespace-side (.2) addresses of slot `index`.
    pub fn slot_addrs(&self, index: usize) -> Result<(Ipv4Addr, Ipv4Addr), NetError> {
        if index >= self.max_slots() {
            return Err(NetError::Config(format!(
                "slot {index} does not fit in {self} ({} slots)",
                self.max_slots()
            )));
        }
        // index < 2^22, so 4 * index fits in u32.
        let net = u32::from(self.base) + 4 * index as u32;
        Ok((Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2)))
    }
}

impl Default for Subnet {
    fn default() -> Self {
        DEFAULT_SUBNET
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

impl FromStr for Subnet {
    type Err = NetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || NetError::Config(format!("subnet {s:?} is not of the form A.B.C.D/N"));
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        Self::new(addr, prefix)
    }
}

/// Names and addresses of one slot: everything needed to create, use or
/// delete it, derived from (tag, subnet, index) alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    pub index: usize,
    pub netns_name: String,
    pub host_veth: String,
    pub host_addr: Ipv4Addr,
    pub slot_addr: Ipv4Addr,
    /// Only used with the test-only veth guest link.
    pub guest_netns_name: String,
}

impl SlotLayout {
    pub fn new(tag: &Tag, subnet: &Subnet, index: usize) -> Result<Self, NetError> {
        let (host_addr, slot_addr) = subnet.slot_addrs(index)?;
        let host_veth = tag.host_veth(index);
        check_ifname(&host_veth)?;
        Ok(Self {
            index,
            netns_name: tag.netns_name(index),
            host_veth,
            host_addr,
            slot_addr,
            guest_netns_name: tag.guest_netns_name(index),
        })
    }

    pub fn netns_path(&self) -> PathBuf {
        netns_path(&self.netns_name)
    }

    pub fn guest_netns_path(&self) -> PathBuf {
        netns_path(&self.guest_netns_name)
    }

    /// Human-readable scope for error messages.
    pub fn scope(&self) -> String {
        format!("slot {} ({})", self.index, self.netns_name)
    }
}

pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// Rejects interface names the kernel would refuse or truncate.
pub fn check_ifname(name: &str) -> Result<(), NetError> {
    if name.is_empty() || name.len() > MAX_IFNAME {
        return Err(NetError::Config(format!(
            "interface name {name:?} is {} bytes, must be 1..={MAX_IFNAME}",
            name.len()
        )));
    }
    Ok(())
}

/// Validates that `capacity` slots fit the subnet and that every derived
/// interface name fits IFNAMSIZ.
pub fn check_capacity(tag: &Tag, subnet: &Subnet, capacity: usize) -> Result<(), NetError> {
    if capacity == 0 {
        return Err(NetError::Config("capacity must be at least 1".into()));
    }
    if capacity > subnet.max_slots() {
        return Err(NetError::Config(format!(
            "capacity {capacity} exceeds the {} slots of {subnet}",
            subnet.max_slots()
        )));
    }
    // The longest names belong to the highest index.
    SlotLayout::new(tag, subnet, capacity - 1).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_addresses_are_consecutive_slash30s() {
        let s = Subnet::default();
        assert_eq!(
            s.slot_addrs(0).unwrap(),
            (Ipv4Addr::new(10, 250, 0, 1), Ipv4Addr::new(10, 250, 0, 2))
        );
        assert_eq!(
            s.slot_addrs(1).unwrap(),
            (Ipv4Addr::new(10, 250, 0, 5), Ipv4Addr::new(10, 250, 0, 6))
        );
        assert_eq!(
            s.slot_addrs(64).unwrap(),
            (Ipv4Addr::new(10, 250, 1, 1), Ipv4Addr::new(10, 250, 1, 2))
        );
        assert_eq!(s.max_slots(), 16384);
        assert_eq!(
            s.slot_addrs(16383).unwrap(),
            (
                Ipv4Addr::new(10, 250, 255, 253),
                Ipv4Addr::new(10, 250, 255, 254)
            )
        );
        assert!(s.slot_addrs(16384).is_err());
    }

    #[test]
    fn subnet_parsing_and_validation() {
        let s: Subnet = "10.9.0.0/24".parse().unwrap();
        assert_eq!(s.max_slots(), 64);
        assert_eq!(s.to_string(), "10.9.0.0/24");
        assert!("10.9.0.1/24".parse::<Subnet>().is_err());
        assert!("10.9.0.0".parse::<Subnet>().is_err());
        assert!("10.9.0.0/31".parse::<Subnet>().is_err());
        assert!("10.9.0.0/x".parse::<Subnet>().is_err());
        assert!("300.9.0.0/16".parse::<Subnet>().is_err());
    }

    #[test]
    fn tags_are_short_lowercase_letters() {
        assert!(Tag::new("s").is_ok());
        assert!(Tag::new("abcdef").is_ok());
        for bad in ["", "abcdefg", "a1", "A", "a-b", "a.b"] {
            assert!(Tag::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn names_fit_ifnamsiz_and_round_trip() {
        let tag = Tag::new("abcdef").unwrap();
        let subnet: Subnet = "10.0.0.0/8".parse().unwrap();
        // 6 letters + 7 digits + "svh" = 16 > 15: rejected.
        assert!(check_capacity(&tag, &subnet, subnet.max_slots()).is_err());
        check_capacity(&tag, &subnet, 1_000_000).unwrap();
        let l = SlotLayout::new(&tag, &subnet, 999_999).unwrap();
        assert_eq!(l.host_veth, "svhabcdef999999");
        assert!(l.host_veth.len() <= MAX_IFNAME);
        check_capacity(&Tag::default(), &Subnet::default(), 16384).unwrap();
        assert!(check_capacity(&Tag::default(), &Subnet::default(), 16385).is_err());
        assert!(check_capacity(&Tag::default(), &Subnet::default(), 0).is_err());

        let t = Tag::new("ab").unwrap();
        assert_eq!(t.netns_name(7), "siesta-ab-7");
        assert_eq!(t.parse_netns("siesta-ab-7"), Some(7));
        assert_eq!(t.parse_netns("siesta-ab-7-guest"), Some(7));
        assert_eq!(t.parse_host_veth("svhab12"), Some(12));
        assert_eq!(t.root_table(), "siesta-ab");
        assert_eq!(
            SlotLayout::new(&t, &Subnet::default(), 3)
                .unwrap()
                .netns_path(),
            PathBuf::from("/run/netns/siesta-ab-3")
        );
    }

    #[test]
    fn parsing_never_matches_other_tags() {
        let t = Tag::new("ab").unwrap();
        for other in [
            "siesta-abc-1",
            "siesta-a-1",
            "siesta-ab-",
            "siesta-ab-01",
            "siesta-ab-1x",
            "siesta-ab-1-guestx",
            "siesta-ab-+1",
            "xsiesta-ab-1",
        ] {
            assert_eq!(t.parse_netns(other), None, "{other}");
        }
        for other in ["svhabc1", "svha1", "svhab", "svhab01", "svhab1h"] {
            assert_eq!(t.parse_host_veth(other), None, "{other}");
        }
    }
}
