//! `siesta snapshot list|delete`: the snapshots in this node's repository.

use std::process::ExitCode;

use siesta_sandbox::NodeConfig;
use siesta_snapshot::{Repository, SnapshotKind};

#[derive(clap::Subcommand)]
pub enum SnapshotCommand {
    /// List snapshots (templates, paused sandboxes, user snapshots).
    List {
        /// Print one JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot by id or alias (`template:NAME`); a paused
    /// sandbox's goes with `siesta sandbox kill`.
    Delete { name: String },
}

pub async fn run(cmd: SnapshotCommand) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    let repo = Repository::open(config.layout().repo())?;
    tokio::task::spawn_blocking(move || execute(&repo, cmd)).await?
}

fn execute(repo: &Repository, cmd: SnapshotCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SnapshotCommand::List { json } => {
            let records = repo.list()?;
            let aliases = repo.aliases()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&records)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<36} {:<9} {:>8} {:>12}  ALIASES",
                "ID", "KIND", "MEM_MIB", "MANIFEST_KIB"
            );
            for r in records {
                let names: Vec<&str> = aliases
                    .iter()
                    .filter(|(_, id)| *id == r.id)
                    .map(|(a, _)| a.as_str())
                    .collect();
                let manifest = r
                    .manifest
                    .as_ref()
                    .map_or("-".to_string(), |m| format!("{}", m.size.div_ceil(1024)));
                println!(
                    "{:<36} {:<9} {:>8} {:>12}  {}",
                    r.id,
                    r.kind.to_string(),
                    r.guest_memory_size >> 20,
                    manifest,
                    names.join(",")
                );
            }
        }
        SnapshotCommand::Delete { name } => {
            let id = repo.alias_target(&name).ok().flatten().unwrap_or(name);
            if let Ok(r) = repo.get(&id) {
                if r.kind == SnapshotKind::Paused {
                    anyhow::bail!(
                        "{id} holds a paused sandbox's memory and disk; \
                         kill the sandbox instead (`siesta sandbox kill ID`)"
                    );
                }
            }
            repo.delete(&id)?;
            println!("deleted {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
