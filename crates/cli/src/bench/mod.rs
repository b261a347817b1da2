//! `siesta bench ...`: measurements that print medians and ratios taken side
//! by side in one run (never timing assertions in tests).

mod agent;
mod compare;
mod concurrent;
mod density;
mod fork;
mod memory_return;
mod pagecache;
mod paired;
mod pause;
mod remote;
mod resume;
mod session;
mod volume;

use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Resume sandboxes one after another from a template and break each
    /// resume down by stage; also cold-boots the same image for comparison.
    Resume(resume::ResumeArgs),
    /// Pause sandboxes that wrote 0, 16, 64, 256 MiB, saving changed pages
    /// and all of RAM side by side: pause time, stored bytes, resume time.
    Pause(pause::PauseArgs),
    /// Fork a running sandbox into N children: time until all are ready,
    /// against one child and a template resume.
    Fork(fork::ForkArgs),
    /// Host memory (PSS) of N idle sandboxes over N times their guest
    /// memory.
    Density(density::DensityArgs),
    /// A running sandbox frees N MiB: how much of it the host gets back,
    /// and how fast, with memory return on and off.
    MemoryReturn(memory_return::MemoryReturnArgs),
    /// Sequential write and read, and 1,000 small files, through a volume
    /// mount against the sandbox's own disk, in one sandbox, interleaved.
    Volume(volume::VolumeArgs),
    /// Start the guest agent on the host and measure start-up, `Start`
    /// round trips and idle memory.
    Agent(agent::AgentArgs),
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Resume(args) => Box::pin(resume::run(args)).await,
        BenchCommand::Agent(args) => agent::run(args).await,
        BenchCommand::Pause(args) => Box::pin(pause::run(args)).await,
        BenchCommand::Fork(args) => fork::run(args).await,
        BenchCommand::Density(args) => density::run(args).await,
        BenchCommand::MemoryReturn(args) => memory_return::run(args).await,
        BenchCommand::Volume(args) => volume::run(args).await,
    }
}
