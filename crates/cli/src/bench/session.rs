//! A node and an in-memory sandbox manager for one bench run: its own
//! network tag (never the server's slots), rows that die with it.

use std::sync::Arc;

use siesta_sandbox::{Node, NodeConfig, SandboxManager};

pub struct Session {
    pub node: Arc<Node>,
    pub manager: Arc<SandboxManager>,
}

impl Session {
    pub async fn start() -> anyhow::Result<Self> {
        let mut config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
        config.net_tag = "n".into();
        let node = Node::start(config).await?;
        let manager = SandboxManager::ephemeral(node.clone())?;
        Ok(Self { node, manager })
    }

    /// Kills what the run left and stops the node.
    pub async fn close(self) {
        self.manager.shutdown().await;
        self.node.shutdown().await;
    }
}
