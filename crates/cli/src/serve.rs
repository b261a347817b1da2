//! `siesta serve`.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use siesta_sandbox::{Node, NodeConfig, SandboxManager};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address of the API.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Template to keep pre-spawned VMMs for.
    #[arg(long, default_value = "base")]
    warm_template: String,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    let home = config.home.clone();
    let api_key = siesta_server::load_or_create_api_key(&home)
        .with_context(|| format!("API key under {}", home.display()))?;
    let node = Node::start(config).await?;
    // Loads the sandboxes a previous run left: paused ones stay resumable.
    let manager = match SandboxManager::open(node.clone()) {
        Ok(m) => m,
        Err(e) => {
            node.shutdown().await;
            return Err(e).context("opening the node's sandboxes");
        }
    };
    if let Err(e) = manager.warm(&args.warm_template) {
        tracing::warn!("not pre-spawning VMMs for {:?}: {e}", args.warm_template);
    }
    println!("siesta: listening on http://{}", args.listen);
    println!("  export E2B_API_URL=http://{}", args.listen);
    println!("  export E2B_SANDBOX_URL=http://{}", args.listen);
    println!("  export E2B_API_KEY={api_key}");
    let served = siesta_server::serve(args.listen, manager.clone(), api_key, stop_signal()).await;
    tracing::info!("shutting down: pausing running sandboxes");
    manager.shutdown().await;
    node.shutdown().await;
    served.with_context(|| format!("serving on {}", args.listen))?;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (`kill`, systemd, `make down`):
/// either way running sandboxes are paused, not lost.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
