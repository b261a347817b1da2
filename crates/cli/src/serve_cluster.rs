//! `siesta serve`'s cluster settings: with etcd endpoints given, the node
//! joins the cluster (docs/cluster.md §3); without, it works alone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::path::PathBuf;

use anyhow::Context;
use siesta_cluster::{Cluster, ClusterConfig, ClusterKey, EtcdConfig};
use siesta_sandbox::SandboxManager;

#[derive(clap::Args, Default)]
pub struct ClusterArgs {
    /// etcd client URLs, comma-separated (`https://10.0.0.1:2379,...`):
    /// joins the cluster kept there. None: this node works alone.
    #[arg(long, env = "SIESTA_ETCD_ENDPOINTS", value_delimiter = ',')]
    etcd: Vec<String>,
    /// The file of the key every node of the cluster shares (at least 32
    /// random bytes, mode 0600): what the nodes write to etcd is sealed
    /// with it. Required with --etcd.
    #[arg(long, env = "SIESTA_CLUSTER_KEY_FILE")]
    cluster_key_file: Option<PathBuf>,
    /// PEM CA bundle that etcd's certificates are checked against.
    #[arg(long, env = "SIESTA_ETCD_CA")]
    etcd_ca: Option<PathBuf>,
    /// PEM client certificate for etcd (with --etcd-key), for members
    /// started with --client-cert-auth. It must have no CommonName: etcd's
    /// JSON gateway refuses one that has.
    #[arg(long, env = "SIESTA_ETCD_CERT", requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// The client certificate's PEM key.
    #[arg(long, env = "SIESTA_ETCD_KEY", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// etcd user to sign in as (with --etcd-password-file), when etcd has
    /// auth enabled.
    #[arg(long, env = "SIESTA_ETCD_USER", requires = "etcd_password_file")]
    etcd_user: Option<String>,
    /// File whose first line is the etcd user's password.
    #[arg(long, env = "SIESTA_ETCD_PASSWORD_FILE", requires = "etcd_user")]
    etcd_password_file: Option<PathBuf>,
    /// Allow plain-HTTP etcd endpoints (a test network on one host):
    /// whoever is on the path reads and rewrites the cluster's state.
    #[arg(long, env = "SIESTA_INSECURE_ETCD")]
    insecure_etcd: bool,
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
        let Some(key_file) = &self.cluster_key_file else {
            anyhow::bail!(
                "joining a cluster needs --cluster-key-file (SIESTA_CLUSTER_KEY_FILE): the same \
                 file of at least 32 random bytes on every node, mode 0600 \
                 (`head -c 32 /dev/urandom > cluster.key && chmod 600 cluster.key`)"
            );
        };
        let key = ClusterKey::load(key_file)?;
        let etcd = EtcdConfig {
            endpoints,
            ca: self.etcd_ca.clone(),
            client_cert: self.etcd_cert.clone().zip(self.etcd_key.clone()),
            user: self.etcd_user.clone().zip(self.etcd_password_file.clone()),
            insecure: self.insecure_etcd,
        };
        Ok(Some(ClusterConfig {
            etcd,
            key: Arc::new(key),
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
    let endpoints = config.etcd.endpoints.join(",");
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

    /// A key file that lives as long as the test process (leaked on
    /// purpose: a few bytes in a temporary directory).
    fn key_file() -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap().keep();
        let path = dir.join("cluster.key");
        std::fs::write(&path, [9u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    fn args(etcd: &[&str], advertise: Option<&str>) -> ClusterArgs {
        ClusterArgs {
            etcd: etcd.iter().map(|s| s.to_string()).collect(),
            cluster_key_file: Some(key_file()),
            advertise: advertise.map(String::from),
            node_lease_secs: 10,
            ..ClusterArgs::default()
        }
    }

    #[test]
    fn a_cluster_needs_its_key() {
        let listen = "127.0.0.1:3001".parse().unwrap();
        let mut a = args(&["https://e:2379"], None);
        a.cluster_key_file = None;
        let err = a.config(listen).unwrap_err().to_string();
        assert!(err.contains("--cluster-key-file"), "{err}");
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
        assert_eq!(c.etcd.endpoints, ["http://e:2379"]);
        assert!(!c.etcd.insecure, "plain HTTP is refused at join, not here");
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
