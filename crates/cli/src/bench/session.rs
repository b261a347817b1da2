//! A node and an in-memory sandbox manager for one bench run: its own
//! network tag (never the server's slots), rows that die with it.

use std::sync::Arc;
use std::time::Duration;

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
        let mut config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
        config.net_tag = "n".into();
        let node = Node::start(config).await?;
        let manager = SandboxManager::ephemeral_with_volumes(node.clone(), volumes)?;
        Ok(Self { node, manager })
    }

    /// Kills what the run left and stops the node.
    pub async fn close(self) {
        self.manager.shutdown().await;
        self.node.shutdown().await;
    }
}

/// A new sandbox of `template` with the API's defaults, resumed from a
/// pre-spawned VMM as in the seed's warm-pool runs: waits for the pool to
/// have one ready first.
pub async fn create_pooled(
    manager: &SandboxManager,
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
