//! A node and an in-memory sandbox manager for one bench run: its own
//! network tag (never the server's slots), rows that die with it, and its
//! own sandbox directory (`$SIESTA_HOME/ephemeral/n-<pid>`), so a server
//! starting meanwhile never takes its VMMs for leftovers.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;

use siesta_host::Tuning;
use siesta_sandbox::sandbox::SandboxInfo;
use siesta_sandbox::{CreateRequest, Node, NodeConfig, SandboxManager};

pub struct Session {
    pub node: Arc<Node>,
    pub manager: Arc<SandboxManager>,
}

impl Session {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with_volumes(None).await
    }

    /// A session whose sandboxes may mount `volumes`.
    pub async fn start_with_volumes(
        volumes: Option<Arc<siesta_volume::Volumes>>,
    ) -> anyhow::Result<Self> {
        Self::start_with(bench_config("n")?, Tuning::default(), volumes).await
    }

    /// A session on a node configured by `config` (see [`bench_config`])
    /// with the optimisations `tuning` leaves on.
    pub async fn start_with(
        config: NodeConfig,
        tuning: Tuning,
        volumes: Option<Arc<siesta_volume::Volumes>>,
    ) -> anyhow::Result<Self> {
        let node = Node::start_tuned(config, tuning).await?;
        let mut builder = SandboxManager::builder(node.clone());
        if let Some(volumes) = volumes {
            builder = builder.volumes(volumes);
        }
        let manager = builder.ephemeral()?;
        Ok(Self { node, manager })
    }

    /// Kills what the run left and stops the node.
    pub async fn close(self) {
        self.manager.shutdown().await;
        self.node.shutdown().await;
        remove_sandbox_root(&self.node.config);
    }
}

/// A bench node's configuration: network tag `tag` (never the server's
/// slots) and sandboxes in `$SIESTA_HOME/ephemeral/<tag>-<pid>` (never the
/// server's directory, whose recovery would take them for leftovers).
pub fn bench_config(tag: &str) -> anyhow::Result<NodeConfig> {
    let mut config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    // `n` for the sessions, `c` for the comparisons: each its own /16.
    let second_octet = if tag == "c" { 253 } else { 252 };
    config.beside_server(tag, siesta_net::Subnet::ten_slash_16(second_octet));
    let root = format!("ephemeral/{tag}-{}", std::process::id());
    config.sandbox_root = Some(config.home.join(root));
    Ok(config)
}

/// Removes a bench's sandbox directory once its node is shut down.
pub fn remove_sandbox_root(config: &NodeConfig) {
    if let Some(root) = &config.sandbox_root {
        let _ = std::fs::remove_dir_all(root);
    }
}

/// A new sandbox of `template` with the API's defaults, resumed from a
/// pre-spawned VMM as in the seed's warm-pool runs: waits for the pool to
/// have one ready first.
pub async fn create_pooled(
    manager: &Arc<SandboxManager>,
    template: &str,
) -> anyhow::Result<SandboxInfo> {
    manager
        .wait_pool_ready(template, Duration::from_secs(120))
        .await?;
    let request = CreateRequest {
        template: template.to_string(),
        ..Default::default()
    };
    Ok(manager.create(request).await?)
}

/// Runs `cmd` in the guest as root; its stdout, or an error with its stderr.
pub async fn guest_root(
    manager: &Arc<SandboxManager>,
    id: &str,
    cmd: &str,
) -> anyhow::Result<String> {
    let out = manager.exec(id, cmd, Some("root"), |_, _| {}).await?;
    if out.exit_code != 0 {
        bail!(
            "`{cmd}` in {id} exited {}: {}",
            out.exit_code,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// CPU seconds (user + system) the process or thread whose `/proc`
/// directory is `proc_dir` has used.
pub fn cpu_secs(proc_dir: &std::path::Path) -> anyhow::Result<f64> {
    let path = proc_dir.join("stat");
    let stat = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf reads a constant of the C library.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}
