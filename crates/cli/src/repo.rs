//! `siesta repo check [--repair]`: consistency of the snapshot repository.

use std::process::ExitCode;
use std::time::Duration;

use siesta_sandbox::NodeConfig;
use siesta_snapshot::repo::CheckReport;
use siesta_snapshot::Repository;

#[derive(clap::Subcommand)]
pub enum RepoCommand {
    /// Report orphans, half-published entries, stale locks and damage;
    /// exit 1 when anything is wrong.
    Check {
        /// Remove what can be removed (waits for running writers).
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(cmd: RepoCommand) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    let repo = Repository::open(config.layout().repo())?;
    let RepoCommand::Check { repair, json } = cmd;
    tokio::task::spawn_blocking(move || {
        if repair {
            let removed = repo.repair(Duration::from_secs(60))?;
            if !json {
                print_report("repaired", &removed);
            }
        }
        let report = repo.check()?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print_report("check", &report);
        }
        Ok(if report.is_clean() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    })
    .await?
}

fn print_report(what: &str, report: &CheckReport) {
    println!(
        "{what}: {} snapshots, {} issues",
        report.snapshots,
        report.issues.len()
    );
    for i in &report.issues {
        let fix = if i.kind.repairable() {
            ""
        } else {
            " (not repairable)"
        };
        println!("  {:?}{fix}: {} {}", i.kind, i.path.display(), i.detail);
    }
}
