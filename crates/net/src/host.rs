//! Root-namespace state owned by one pool instance: the `ip siesta-<tag>`
//! table, forwarding, and removal of a crashed run's leftovers by exact name.

use std::collections::BTreeSet;
use std::path::Path;

use crate::boundary::Boundary;
use crate::cmd;
use crate::error::{NetError, Result};
use crate::layout::{Subnet, Tag};
use crate::netns::{parse_default_dev, parse_link_names, parse_netns_list};
use crate::nft;

fn scope(tag: &Tag) -> String {
    format!("pool {tag}")
}

/// Removes namespaces `siesta-<tag>-<N>[-guest]`, host veths `svh<tag><N>`
/// and the table `ip siesta-<tag>`. Names of other tags never match.
/// Returns how many namespaces and veths were removed.
pub(crate) async fn cleanup_leftovers(tag: &Tag) -> Result<usize> {
    let scope = scope(tag);
    let mut removed = 0;

    let links = cmd::ip(&scope, &["-o", "link", "show"]).await?;
    for name in parse_link_names(&links) {
        if tag.parse_host_veth(&name).is_some() {
            cmd::ip(&scope, &["link", "del", &name]).await?;
            removed += 1;
        }
    }

    let list = cmd::ip(&scope, &["netns", "list"]).await?;
    let mut names: BTreeSet<String> = parse_netns_list(&list)
        .into_iter()
        .filter(|n| tag.parse_netns(n).is_some())
        .collect();
    // `ip netns list` reads /run/netns; also catch entries it could not stat.
    if let Ok(dir) = std::fs::read_dir(crate::layout::NETNS_DIR) {
        for entry in dir.flatten() {
            if let Some(n) = entry.file_name().to_str() {
                if tag.parse_netns(n).is_some() {
                    names.insert(n.to_owned());
                }
            }
        }
    }
    for name in names {
        cmd::ip(&scope, &["netns", "del", &name]).await?;
        removed += 1;
    }

    cmd::nft(&scope, None, &nft::delete_root_table(tag)).await?;
    if removed > 0 {
        tracing::info!(tag = %tag, removed, "removed leftovers of a previous run");
    }
    Ok(removed)
}

/// Refuses a subnet another interface of the host already has addresses
/// in (another siesta instance's slots, or a network the host is on): two
/// instances on one subnet give their slots the same addresses, and a
/// guest's traffic goes to whichever route the kernel picks. Run after
/// [`cleanup_leftovers`]: this tag's own veths are never in the way.
pub(crate) async fn check_subnet_free(tag: &Tag, subnet: &Subnet) -> Result<()> {
    let addrs = cmd::ip(&scope(tag), &["-o", "-4", "addr", "show"]).await?;
    match subnet_users(&addrs, subnet)
        .into_iter()
        .find(|(dev, _)| tag.parse_host_veth(dev).is_none())
    {
        None => Ok(()),
        Some((dev, cidr)) => {
            let whose = if dev.starts_with("svh") {
                " (a slot of another siesta instance)"
            } else {
                ""
            };
            Err(NetError::Config(format!(
                "subnet {subnet} is already in use on this host: {dev}{whose} has {cidr}; \
                 give this instance a subnet of its own (SIESTA_NET_SUBNET, or net_subnet in \
                 the config file's [node] section)"
            )))
        }
    }
}

/// The `(device, address/prefix)` pairs of `ip -o -4 addr show` whose
/// network lies inside `subnet`.
fn subnet_users(ip_output: &str, subnet: &Subnet) -> Vec<(String, String)> {
    let mut users = Vec::new();
    for line in ip_output.lines() {
        let mut fields = line.split_whitespace();
        let dev = fields.nth(1).unwrap_or_default();
        let dev = dev.split('@').next().unwrap_or_default();
        if fields.next() != Some("inet") {
            continue;
        }
        let Some(cidr) = fields.next() else { continue };
        let Some((addr, prefix)) = cidr.split_once('/') else {
            continue;
        };
        let (Ok(addr), Ok(prefix)) = (addr.parse(), prefix.parse::<u8>()) else {
            continue;
        };
        // Only networks inside the subnet: a wider one that holds it (a
        // 10.0.0.0/8 LAN) loses to the slots' more specific /30 routes.
        if prefix > subnet.prefix() && subnet.overlaps(addr, prefix) {
            users.push((dev.to_owned(), cidr.to_owned()));
        }
    }
    users
}

/// Installs the root table; enables forwarding and masquerade out of the
/// default-route interface when the host has one. Returns that interface.
pub(crate) async fn setup_root(
    tag: &Tag,
    subnet: &Subnet,
    boundary: &Boundary,
) -> Result<Option<String>> {
    let scope = scope(tag);
    let routes = cmd::ip(&scope, &["-4", "route", "show", "default"]).await?;
    let egress = parse_default_dev(&routes);
    if egress.is_some() {
        let path = Path::new("/proc/sys/net/ipv4/ip_forward");
        let current = std::fs::read_to_string(path)
            .map_err(|e| NetError::io(&scope, "read net.ipv4.ip_forward", e))?;
        if current.trim() != "1" {
            std::fs::write(path, "1")
                .map_err(|e| NetError::io(&scope, "set net.ipv4.ip_forward=1", e))?;
        }
    }
    cmd::nft(
        &scope,
        None,
        &nft::root_table(tag, subnet, egress.as_deref(), boundary),
    )
    .await?;
    Ok(egress)
}

/// Deletes the root table (no error when absent).
pub(crate) async fn teardown_root(tag: &Tag) -> Result<()> {
    cmd::nft(&scope(tag), None, &nft::delete_root_table(tag))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_addresses_inside_a_subnet() {
        let out = "\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 192.168.1.5/24 brd 192.168.1.255 scope global eth0\\       valid_lft forever
7: svhs1    inet 10.250.0.5/30 scope global svhs1\\       valid_lft forever preferred_lft forever
9: br0    inet 10.0.0.1/8 scope global br0\\       valid_lft forever preferred_lft forever
";
        let subnet: Subnet = "10.250.0.0/16".parse().unwrap();
        assert_eq!(
            subnet_users(out, &subnet),
            // Not br0's 10.0.0.0/8: the slots' /30 routes win over it.
            [("svhs1".to_string(), "10.250.0.5/30".to_string())]
        );
        let other: Subnet = "172.31.0.0/16".parse().unwrap();
        assert!(subnet_users(out, &other).is_empty());
    }
}
