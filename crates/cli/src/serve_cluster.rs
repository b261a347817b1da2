//! `siesta serve`'s cluster settings: with etcd endpoints given, the node
//! joins the cluster (docs/cluster.md §3); without, it works alone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use siesta_cluster::{Cluster, ClusterConfig};
use siesta_sandbox::SandboxManager;

#[derive(clap::Args, Default)]
pub struct ClusterArgs {
    /// etcd client URLs, comma-separated (`http://10.0.0.1:2379,...`):
    /// joins the cluster kept there. None: this node works alone.
    #[arg(long, env = "SIESTA_ETCD_ENDPOINTS", value_delimiter = ',')]
    etcd: Vec<String>,
    /// This node's id in the cluster (default: the host name and the
    /// API port, `HOST-PORT`).
    #[arg(long, env = "SIESTA_NODE_ID")]
    node_id: Option<String>,
    /// `host:port` at which the other nodes reach this node's API
    /// (default: the listen address, unless that is 0.0.0.0 or [::]).
    #[arg(long, env = "SIESTA_ADVERTISE")]
    advertise: Option<String>,
    /// Seconds a dead node's registration outlives it: after that, other
    /// nodes may take over its paused sandboxes.
    #[arg(long, env = "SIESTA_NODE_LEASE_SECS", default_value_t = 10)]
    node_lease_secs: u64,
}

impl ClusterArgs {
    /// The cluster configuration, or `None` when no etcd is given.
    fn config(&self, listen: SocketAddr) -> anyhow::Result<Option<ClusterConfig>> {
        let endpoints: Vec<String> = self
            .etcd
            .iter()
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Ok(None);
        }
        let advertise = match &self.advertise {
            Some(a) => a.clone(),
            None if listen.ip().is_unspecified() => anyhow::bail!(
                "listening on {listen}: give --advertise (SIESTA_ADVERTISE), the host:port \
                 other nodes reach this one at"
            ),
            None => listen.to_string(),
        };
        let node_id = match &self.node_id {
            Some(id) => id.clone(),
            None => format!("{}-{}", host_name(), listen.port()),
        };
        Ok(Some(ClusterConfig {
            endpoints,
            node_id,
            advertise,
            lease_ttl: Duration::from_secs(self.node_lease_secs.max(2)),
        }))
    }
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "node".into())
}

/// Joins the cluster when one is configured: registers the node, mirrors
/// its sandbox rows into etcd and drops the sandboxes another node took
/// over while this one was gone.
pub async fn join(
    args: &ClusterArgs,
    listen: SocketAddr,
    manager: &Arc<SandboxManager>,
) -> anyhow::Result<Option<Arc<Cluster>>> {
    let Some(config) = args.config(listen)? else {
        return Ok(None);
    };
    let endpoints = config.endpoints.join(",");
    let cluster = Cluster::join(config)
        .await
        .with_context(|| format!("joining the cluster at {endpoints}"))?;
    // Dropped before the rows are mirrored: a moved sandbox's row must not
    // be written back under this node's name.
    let moved = siesta_cluster::reconcile::drop_moved(&cluster, manager)
        .await
        .context("checking which sandboxes other nodes took over")?;
    if !moved.is_empty() {
        tracing::info!(
            count = moved.len(),
            "sandboxes other nodes took over were dropped here"
        );
    }
    manager
        .set_row_observer(cluster.row_writer())
        .context("mirroring the sandbox rows into etcd")?;
    Ok(Some(cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(etcd: &[&str], advertise: Option<&str>) -> ClusterArgs {
        ClusterArgs {
            etcd: etcd.iter().map(|s| s.to_string()).collect(),
            node_id: None,
            advertise: advertise.map(String::from),
            node_lease_secs: 10,
        }
    }

    #[test]
    fn no_etcd_means_no_cluster() {
        let listen = "127.0.0.1:3000".parse().unwrap();
        assert!(args(&[], None).config(listen).unwrap().is_none());
        assert!(args(&[" "], None).config(listen).unwrap().is_none());
    }

    #[test]
    fn a_node_advertises_its_listen_address_and_is_named_after_host_and_port() {
        let listen = "127.0.0.1:3001".parse().unwrap();
        let c = args(&["http://e:2379"], None)
            .config(listen)
            .unwrap()
            .unwrap();
        assert_eq!(c.advertise, "127.0.0.1:3001");
        assert!(c.node_id.ends_with("-3001"), "{}", c.node_id);
        assert_eq!(c.lease_ttl, Duration::from_secs(10));
    }

    #[test]
    fn listening_everywhere_needs_an_advertised_address() {
        let listen = "0.0.0.0:3000".parse().unwrap();
        let err = args(&["http://e:2379"], None).config(listen).unwrap_err();
        assert!(err.to_string().contains("--advertise"), "{err}");
        let c = args(&["http://e:2379"], Some("10.0.0.5:3000"))
            .config(listen)
            .unwrap()
            .unwrap();
        assert_eq!(c.advertise, "10.0.0.5:3000");
    }
}
