//! How the egress proxy turns an allowed name into addresses: the host's
//! resolver (`getaddrinfo`, so `/etc/hosts` and `/etc/resolv.conf` as for
//! any program), or one configured name server (`egress_dns`), queried
//! directly. The guest's own resolution is never trusted for this.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;

/// The resolver every slot's proxy shares.
pub enum Resolver {
    /// The host's resolver.
    System,
    /// One name server, over UDP (TCP for truncated answers).
    Nameserver {
        addr: SocketAddr,
        resolver: Box<TokioResolver>,
    },
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::System => f.write_str("system resolver"),
            Self::Nameserver { addr, .. } => write!(f, "name server {addr}"),
        }
    }
}

impl Resolver {
    /// `nameserver` as configured (`None`: the host's resolver).
    pub fn new(nameserver: Option<SocketAddr>) -> Self {
        let Some(addr) = nameserver else {
            return Self::System;
        };
        let servers = NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true);
        let config = ResolverConfig::from_parts(None, Vec::new(), servers);
        let resolver =
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default()).build();
        Self::Nameserver {
            addr,
            resolver: Box::new(resolver),
        }
    }

    /// The IPv4 addresses of `host` (guests have no IPv6).
    pub async fn lookup_v4(&self, host: &str) -> io::Result<Vec<Ipv4Addr>> {
        let ips: Vec<IpAddr> = match self {
            Self::System => tokio::net::lookup_host((host, 0))
                .await?
                .map(|a| a.ip())
                .collect(),
            Self::Nameserver { addr, resolver } => resolver
                .lookup_ip(host)
                .await
                .map_err(|e| io::Error::other(format!("asking {addr} for {host}: {e}")))?
                .iter()
                .collect(),
        };
        Ok(ips
            .into_iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(v4) => Some(v4),
                IpAddr::V6(_) => None,
            })
            .collect())
    }
}
