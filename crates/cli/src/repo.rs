//! `siesta repo check [--repair]`: consistency of the snapshot repository;
//! `siesta repo push|pull|remote-list|remote-alias|remote-delete` and
//! `repo check --remote`: its shared copy in an
//! S3-compatible object store (`SIESTA_S3_ENDPOINT`, `SIESTA_S3_BUCKET`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`; see docs/cluster.md).

use std::process::ExitCode;
use std::time::Duration;

use siesta_sandbox::NodeConfig;
use siesta_snapshot::remote::{RemoteRepo, S3Config};
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
        /// Check the object store instead (SIESTA_S3_*): objects no record
        /// reaches (older than an hour, so running pushes are safe),
        /// aliases naming no record, records missing a piece.
        #[arg(long)]
        remote: bool,
    },
    /// Upload snapshot ID (or the one an alias such as template:base names)
    /// to the object store: chunks first, the record last and only once.
    /// Given an alias, the store's alias of that name points at it too, so
    /// a node with the store configured creates sandboxes of it by name.
    Push { id: String },
    /// Fetch snapshot ID from the object store into this repository, every
    /// chunk and file checked against its SHA-256.
    Pull { id: String },
    /// Snapshot ids in the object store.
    RemoteList,
    /// Delete snapshot ID from the object store (a tombstone first, so a
    /// push racing it gives up); its chunks go at `check --remote --repair`.
    RemoteDelete { id: String },
    /// Point an alias in the object store at a pushed snapshot
    /// (compare-and-swap: fails if another writer moved it meanwhile).
    RemoteAlias { alias: String, id: String },
}

pub async fn run(cmd: RepoCommand) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    let repo = Repository::open(config.layout().repo())?;
    let (repair, json) = match cmd {
        RepoCommand::Check {
            repair,
            json,
            remote: false,
        } => (repair, json),
        remote_cmd => return remote(remote_cmd, &repo).await,
    };
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

/// The object store of `SIESTA_S3_*`, if one is configured, as the tier a
/// node fetches missing templates and snapshots from.
pub fn remote_tier_from_env() -> anyhow::Result<Option<siesta_tier::RemoteTier>> {
    let Some(config) = S3Config::from_env()? else {
        return Ok(None);
    };
    let remote = RemoteRepo::open(&config)?;
    tracing::info!(
        "templates and snapshots this node lacks are fetched from {}/{}",
        config.endpoint,
        config.bucket
    );
    Ok(Some(siesta_tier::RemoteTier::new(remote)))
}

/// How old an object no record reaches must be before `check --remote`
/// counts it: a push uploads chunks before its record.
const REMOTE_GRACE: Duration = Duration::from_secs(3600);

async fn remote(cmd: RepoCommand, repo: &Repository) -> anyhow::Result<ExitCode> {
    let config = S3Config::from_env()?.ok_or_else(|| {
        anyhow::anyhow!("no object store configured: set SIESTA_S3_ENDPOINT, SIESTA_S3_BUCKET, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    })?;
    let remote = RemoteRepo::open(&config)?;
    let id_of = |name: &str| -> anyhow::Result<String> { Ok(repo.resolve(name)?.id) };
    match cmd {
        RepoCommand::Push { id: name } => {
            let id = id_of(&name)?;
            remote.push(repo, &id).await?;
            println!("pushed {id} to {}/{}", config.endpoint, config.bucket);
            // Pushed by its alias (`template:base`): other nodes find it by
            // that name too.
            if name != id {
                remote.set_alias(&name, &id).await?;
                println!("{name} -> {id}");
            }
        }
        RepoCommand::Pull { id } => {
            let record = remote.pull(repo, &id).await?;
            println!("pulled {} ({} files)", record.id, record.files.len());
        }
        RepoCommand::RemoteList => {
            for id in remote.list().await? {
                println!("{id}");
            }
        }
        RepoCommand::RemoteAlias { alias, id } => {
            remote.set_alias(&alias, &id).await?;
            println!("{alias} -> {id}");
        }
        RepoCommand::RemoteDelete { id } => {
            if !remote.delete(&id).await? {
                anyhow::bail!("snapshot {id:?} is not in the object store");
            }
            println!("deleted {id}");
        }
        RepoCommand::Check { repair, json, .. } => {
            let report = remote.check(repair, REMOTE_GRACE).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                let (verb, finished) = if repair {
                    ("removed", "finished")
                } else {
                    ("found", "found")
                };
                println!(
                    "remote check: {} records; {verb} {} unreferenced objects, {} dangling aliases; \
                     {finished} {} interrupted deletes; {} damaged records",
                    report.records,
                    report.unreferenced.len(),
                    report.dangling_aliases.len(),
                    report.half_deleted.len(),
                    report.damaged.len()
                );
                for d in &report.damaged {
                    println!("  damaged: {d} (not repairable)");
                }
            }
            let clean = if repair {
                report.damaged.is_empty()
            } else {
                report.is_clean()
            };
            return Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}
