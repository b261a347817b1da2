//! The `siesta.*` parameters the host puts on the guest kernel command line.

use std::net::{IpAddr, Ipv4Addr};

/// Boot configuration taken from `/proc/cmdline`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootConfig {
    /// `siesta.hostname=`; "siesta" when absent.
    pub hostname: String,
    /// `siesta.ip=ADDR/PREFIX` for eth0.
    pub ip: Option<(Ipv4Addr, u8)>,
    /// `siesta.gw=ADDR`: the default route.
    pub gateway: Option<Ipv4Addr>,
    /// `siesta.dns=ADDR[,ADDR...]`: written to /etc/resolv.conf.
    pub dns: Vec<IpAddr>,
}

impl Default for BootConfig {
    fn default() -> Self {
        Self {
            hostname: "siesta".to_string(),
            ip: None,
            gateway: None,
            dns: Vec::new(),
        }
    }
}

/// Parses a kernel command line. Malformed `siesta.*` values are skipped
/// with a warning rather than failing the boot: a guest without network is
/// still debuggable from its console.
pub fn parse(cmdline: &str) -> BootConfig {
    let mut cfg = BootConfig::default();
    for word in cmdline.split_ascii_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        match key {
            "siesta.hostname" if valid_hostname(value) => cfg.hostname = value.to_string(),
            "siesta.ip" => match parse_cidr(value) {
                Some(c) => cfg.ip = Some(c),
                None => tracing::warn!("ignoring malformed siesta.ip={value}"),
            },
            "siesta.gw" => match value.parse() {
                Ok(gw) => cfg.gateway = Some(gw),
                Err(_) => tracing::warn!("ignoring malformed siesta.gw={value}"),
            },
            "siesta.dns" => cfg.dns = value.split(',').filter_map(|s| s.parse().ok()).collect(),
            k if k.starts_with("siesta.") => tracing::warn!("ignoring kernel parameter {word}"),
            _ => {}
        }
    }
    cfg
}

fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (addr, prefix) = s.split_once('/')?;
    let prefix: u8 = prefix.parse().ok()?;
    (prefix <= 32).then_some(())?;
    Some((addr.parse().ok()?, prefix))
}

/// The netmask of a prefix length, e.g. 30 → 255.255.255.252.
pub fn netmask(prefix: u8) -> Ipv4Addr {
    let bits = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    };
    Ipv4Addr::from(bits)
}

fn valid_hostname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// The text of /etc/resolv.conf for `servers`.
pub fn resolv_conf(servers: &[IpAddr]) -> String {
    servers
        .iter()
        .map(|s| format!("nameserver {s}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_siesta_parameters() {
        let c = parse(
            "console=ttyS0 root=/dev/vda rw siesta.ip=169.254.0.21/30 siesta.gw=169.254.0.22 \
             siesta.hostname=sbx-1 siesta.dns=1.1.1.1,8.8.8.8 quiet",
        );
        assert_eq!(c.hostname, "sbx-1");
        assert_eq!(c.ip, Some((Ipv4Addr::new(169, 254, 0, 21), 30)));
        assert_eq!(c.gateway, Some(Ipv4Addr::new(169, 254, 0, 22)));
        assert_eq!(
            c.dns,
            vec![
                "1.1.1.1".parse::<IpAddr>().unwrap(),
                "8.8.8.8".parse().unwrap()
            ]
        );
        assert_eq!(
            resolv_conf(&c.dns),
            "nameserver 1.1.1.1\nnameserver 8.8.8.8\n"
        );
    }

    #[test]
    fn defaults_and_malformed_values() {
        assert_eq!(parse("console=ttyS0"), BootConfig::default());
        let c = parse(
            "siesta.ip=1.2.3.4 siesta.gw=nope siesta.hostname=bad/name siesta.ip=10.0.0.1/33",
        );
        assert_eq!(c, BootConfig::default());
    }

    #[test]
    fn netmasks() {
        assert_eq!(netmask(30), Ipv4Addr::new(255, 255, 255, 252));
        assert_eq!(netmask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(netmask(32), Ipv4Addr::new(255, 255, 255, 255));
        assert_eq!(netmask(0), Ipv4Addr::new(0, 0, 0, 0));
    }
}
