//! What no guest reaches, whatever its egress rules say.
//!
//! A guest's own rules (`allowOut`, `denyOut`, internet on or off) live in
//! its slot's namespace and decide where it may go *out there*. The node's
//! own surroundings are another matter: the cloud metadata service, the
//! LAN or VPC the node sits in (etcd, S3, peer nodes, databases), the
//! host's loopback and the slots of every siesta instance on the host. The
//! root table of each instance drops guest traffic to all of them before
//! any guest rule could let it through (see [`crate::nft::root_table`]),
//! and the egress proxy refuses names that resolve there. An operator
//! opens chosen private networks with `[node] guest_private_allow`.

use std::net::Ipv4Addr;

use crate::policy::Cidr;

/// Destinations no guest reaches unless the operator allows them:
/// "this network", RFC 1918 private space, CGNAT, loopback, link-local
/// (the cloud metadata service at 169.254.169.254), IETF protocol
/// assignments, and multicast, reserved and broadcast space.
pub const BLOCKED_RANGES: [(Ipv4Addr, u8); 9] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(224, 0, 0, 0), 3),
];

/// Ranges that stay closed even when an operator lists them: loopback and
/// link-local are the host itself and the metadata service, never a
/// network a guest has business on.
const NEVER_ALLOWED: [(Ipv4Addr, u8); 2] = [
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
];

/// The node's guest boundary: the blocked ranges less what the operator
/// opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Boundary {
    private_allow: Vec<Cidr>,
}

impl Boundary {
    /// A boundary that lets guests reach `private_allow` (networks inside
    /// the blocked ranges the operator chose to open). Refuses a network
    /// that overlaps loopback or link-local.
    pub fn new(private_allow: Vec<Cidr>) -> Result<Self, String> {
        for cidr in &private_allow {
            if let Some(range) = NEVER_ALLOWED
                .iter()
                .map(|&r| cidr_of(r))
                .find(|r| overlaps(r, cidr))
            {
                return Err(format!(
                    "{cidr} overlaps {range}, which no guest may reach (the host's loopback \
                     and link-local addresses, where the cloud metadata service answers)"
                ));
            }
        }
        Ok(Self { private_allow })
    }

    /// The networks the operator opened.
    pub fn private_allow(&self) -> &[Cidr] {
        &self.private_allow
    }

    /// The blocked ranges as CIDRs.
    pub fn blocked() -> Vec<Cidr> {
        BLOCKED_RANGES.iter().map(|&r| cidr_of(r)).collect()
    }

    /// Whether a guest may reach `addr` as far as the node is concerned
    /// (its own egress rules are checked separately).
    pub fn allows(&self, addr: Ipv4Addr) -> bool {
        if NEVER_ALLOWED.iter().any(|&r| cidr_of(r).contains(addr)) {
            return false;
        }
        self.private_allow.iter().any(|c| c.contains(addr))
            || !BLOCKED_RANGES.iter().any(|&r| cidr_of(r).contains(addr))
    }
}

fn cidr_of((addr, prefix): (Ipv4Addr, u8)) -> Cidr {
    // The table holds valid prefixes only.
    Cidr::new(addr, prefix).unwrap_or_else(|_| unreachable!("prefix {prefix} <= 32"))
}

/// Whether two networks share an address (one contains the other's base).
fn overlaps(a: &Cidr, b: &Cidr) -> bool {
    a.contains(b.addr()) || b.contains(a.addr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn the_node_s_surroundings_are_closed_and_the_internet_open() {
        let b = Boundary::default();
        for closed in [
            "169.254.169.254",
            "10.0.0.5",
            "10.250.0.6",
            "172.16.3.4",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.254",
            "127.0.0.1",
            "0.0.0.0",
            "224.0.0.251",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.0.170",
        ] {
            assert!(!b.allows(a(closed)), "{closed} must be closed");
        }
        for open in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "198.18.0.2",
        ] {
            assert!(b.allows(a(open)), "{open} must be open");
        }
    }

    #[test]
    fn an_operator_opens_private_networks_but_never_the_host_or_metadata() {
        let b = Boundary::new(vec!["10.1.2.0/24".parse().unwrap()]).unwrap();
        assert!(b.allows(a("10.1.2.7")));
        assert!(!b.allows(a("10.1.3.7")));
        for bad in [
            "169.254.169.254/32",
            "127.0.0.0/8",
            "0.0.0.0/0",
            "169.0.0.0/8",
        ] {
            let err = Boundary::new(vec![bad.parse().unwrap()]).unwrap_err();
            assert!(err.contains("no guest may reach"), "{bad}: {err}");
        }
    }
}
