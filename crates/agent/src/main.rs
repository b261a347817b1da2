//! The `siesta-agent` binary: binds the envd port and serves, or, as PID 1
//! (or with `--init`), boots the guest first.

use std::net::SocketAddr;

use clap::Parser;
use siesta_agent::state::AgentState;
use siesta_agent::users::UserDb;

#[derive(Parser, Debug)]
#[command(version, about = "siesta guest agent (envd-compatible)")]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "0.0.0.0:49983")]
    listen: SocketAddr,
    /// Act as the guest's init (implied when running as PID 1).
    #[arg(long)]
    init: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SIESTA_AGENT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Plain text in the guest's console log and in tests that read it.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let listen = args.listen;
    if siesta_agent::pid1::should_run(args.init) {
        siesta_agent::pid1::run(move || serve(listen));
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(listen))
}

/// Binds first and does nothing slow before: the host polls `/health` right
/// after boot or resume.
async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    // The bound address (not the requested one): with port 0, tests read the
    // port from this line.
    let addr = listener.local_addr()?;
    tracing::info!(
        version = siesta_envd_proto::ENVD_VERSION,
        "agent listening on {addr}"
    );
    siesta_agent::serve(listener, AgentState::new(UserDb::default())).await?;
    Ok(())
}
