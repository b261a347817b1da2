//! Root-namespace state owned by one pool instance: the `ip siesta-<tag>`
//! table, forwarding, and removal of a crashed run's leftovers by exact name.

use std::collections::BTreeSet;
use std::path::Path;

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

/// Installs the root table; enables forwarding and masquerade out of the
/// default-route interface when the host has one. Returns that interface.
pub(crate) async fn setup_root(tag: &Tag, subnet: &Subnet) -> Result<Option<String>> {
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
        &nft::root_table(tag, subnet, egress.as_deref()),
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
