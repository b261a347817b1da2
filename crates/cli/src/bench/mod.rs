//! `siesta bench ...`: measurements that print medians and ratios taken side
//! by side in one run (never timing assertions in tests).

mod agent;
mod compare;
mod pagecache;
mod paired;
mod pause;
mod resume;

use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Resume sandboxes one after another from a template and break each
    /// resume down by stage; also cold-boots the same image for comparison.
    Resume(resume::ResumeArgs),
    /// Pause sandboxes that wrote 0, 16, 64, 256 MiB, saving changed pages
    /// and all of RAM side by side: pause time, stored bytes, resume time.
    Pause(pause::PauseArgs),
    /// Start the guest agent on the host and measure start-up, `Start`
    /// round trips and idle memory.
    Agent(agent::AgentArgs),
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Resume(args) => resume::run(args).await,
        BenchCommand::Agent(args) => agent::run(args).await,
        BenchCommand::Pause(args) => pause::run(args).await,
    }
}
