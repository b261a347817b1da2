//! `siesta bench ...`: measurements that print medians and ratios taken side
//! by side in one run (never timing assertions in tests).

mod agent;
mod compare;
mod pagecache;
mod paired;
mod resume;

use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Resume sandboxes one after another from a template and break each
    /// resume down by stage; also cold-boots the same image for comparison.
    Resume(resume::ResumeArgs),
    /// Start the guest agent on the host and measure start-up, `Start`
    /// round trips and idle memory.
    Agent(agent::AgentArgs),
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Resume(args) => resume::run(args).await,
        BenchCommand::Agent(args) => agent::run(args).await,
    }
}
