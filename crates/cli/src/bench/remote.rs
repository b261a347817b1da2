//! `siesta bench resume --from s3`: creates from a template the node does
//! not have, fetched from the object store (`SIESTA_S3_*`) on that create
//! (fetching its chunks one at a time, and [`FETCH_CONCURRENCY`] at a
//! time, the default), against creates from the same template once it is
//! in the local (POSIX) repository, alternating in one run.
//!
//! Each sample runs a node in a new scratch home
//! (`$SIESTA_HOME/ephemeral/s3-<pid>-<n>`, the server's assets linked in,
//! its own empty repository), so its cold create really lacks the
//! template; its warm create follows in the same home. Neither uses
//! pre-spawned VMMs (`pool_size = 0`), so the two differ by the fetch
//! alone.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use siesta_sandbox::remote_tier::RemoteTier;
use siesta_sandbox::template;
use siesta_sandbox::{CreateRequest, Node, NodeConfig, SandboxManager};
use siesta_snapshot::remote::{RemoteError, RemoteRepo, S3Config, FETCH_CONCURRENCY};
use siesta_snapshot::Repository;

use crate::stats::summarize;

/// Two cold creates (chunks fetched one at a time, and concurrently) and
/// one warm create.
struct Sample {
    serial: Cold,
    cold: Cold,
    warm_ms: f64,
}

/// A create that fetched its template first.
struct Cold {
    ms: f64,
    /// The resume inside it (its stages' total).
    resume_ms: f64,
}

pub async fn run(template_name: &str, samples: usize, json: bool) -> anyhow::Result<ExitCode> {
    let s3 = S3Config::from_env()?.context(
        "--from s3 needs an object store: set SIESTA_S3_ENDPOINT, SIESTA_S3_BUCKET, \
         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    )?;
    let remote = RemoteRepo::open(&s3)?;
    let home = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    let home_repo = Repository::open(home.layout().repo())?;
    let alias = template::alias(template_name);
    let id = home_repo
        .resolve(&alias)
        .with_context(|| format!("template {template_name:?} in this node's repository"))?
        .id;
    publish(&remote, &home_repo, &alias, &id).await?;
    let bytes = fetched_bytes(&home_repo, &id)?;

    let serial = remote.clone().with_fetch_concurrency(1);
    let mut measured = Vec::with_capacity(samples);
    for i in 0..samples {
        let in_scratch = |n: usize, remote: RemoteRepo| {
            let home = &home;
            async move {
                let scratch = scratch_home(&home.home, n)?;
                let outcome = sample(home, &scratch, &remote, template_name).await;
                std::fs::remove_dir_all(&scratch)
                    .with_context(|| format!("removing {}", scratch.display()))?;
                outcome
            }
        };
        let context = || format!("sample {} of {samples}", i + 1);
        let (serial, _) = in_scratch(2 * i, serial.clone())
            .await
            .with_context(context)?;
        let (cold, warm_ms) = in_scratch(2 * i + 1, remote.clone())
            .await
            .with_context(context)?;
        measured.push(Sample {
            serial,
            cold,
            warm_ms,
        });
    }
    report(template_name, &s3, bytes, &measured, json);
    Ok(ExitCode::SUCCESS)
}

/// The template in the store under its alias, as `siesta repo push
/// template:NAME` leaves it; a store alias naming another snapshot is left
/// alone and stops the bench.
async fn publish(
    remote: &RemoteRepo,
    repo: &Repository,
    alias: &str,
    id: &str,
) -> anyhow::Result<()> {
    remote.push(repo, id).await?;
    match remote.alias_target(alias).await {
        Ok(target) if target == id => Ok(()),
        Ok(other) => anyhow::bail!(
            "the object store's {alias} names {other}, not this node's {id}; \
             use another bucket (or `siesta repo remote-alias {alias} {id}`)"
        ),
        Err(RemoteError::NotFound(_)) => Ok(remote.set_alias(alias, id).await?),
        Err(e) => Err(e.into()),
    }
}

/// The bytes a cold create fetches: every file of the record.
fn fetched_bytes(repo: &Repository, id: &str) -> anyhow::Result<u64> {
    let record = repo.get(id)?;
    let mut total = 0;
    for role in record.files.keys() {
        let path = repo.file_path(&record, role)?;
        total += std::fs::metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .len();
    }
    Ok(total)
}

/// `$SIESTA_HOME/ephemeral/s3-<pid>-<n>` with the node's assets linked in.
fn scratch_home(home: &Path, n: usize) -> anyhow::Result<PathBuf> {
    let dir = home.join(format!("ephemeral/s3-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let assets = dir.join("assets");
    if !assets.exists() {
        std::os::unix::fs::symlink(home.join("assets"), &assets)
            .with_context(|| format!("linking {}", assets.display()))?;
    }
    Ok(dir)
}

/// One cold and one warm create (ms) by a node in `scratch`.
async fn sample(
    home: &NodeConfig,
    scratch: &Path,
    remote: &RemoteRepo,
    name: &str,
) -> anyhow::Result<(Cold, f64)> {
    let mut config = home.clone();
    config.home = scratch.to_path_buf();
    config.sandbox_root = None;
    config.net_tag = "n".into();
    config.pool_size = 0;
    let node = Node::start(config).await?;
    let manager = SandboxManager::ephemeral(node.clone())?;
    manager.set_remote(RemoteTier::new(remote.clone()));
    let outcome = cold_then_warm(&manager, name).await;
    manager.shutdown().await;
    node.shutdown().await;
    outcome
}

async fn cold_then_warm(manager: &SandboxManager, name: &str) -> anyhow::Result<(Cold, f64)> {
    let (ms, info) = timed_create(manager, name).await.context("cold create")?;
    let resume_ms = info.timings.map_or(0.0, |t| t.total_ms);
    manager.kill(&info.id).await?;
    let (warm_ms, info) = timed_create(manager, name).await.context("warm create")?;
    manager.kill(&info.id).await?;
    Ok((Cold { ms, resume_ms }, warm_ms))
}

async fn timed_create(
    manager: &SandboxManager,
    name: &str,
) -> anyhow::Result<(f64, siesta_sandbox::sandbox::SandboxInfo)> {
    let started = Instant::now();
    let info = manager
        .create(CreateRequest {
            template: name.to_string(),
            ..Default::default()
        })
        .await?;
    Ok((started.elapsed().as_secs_f64() * 1000.0, info))
}

fn report(name: &str, s3: &S3Config, bytes: u64, samples: &[Sample], json: bool) {
    let column = |f: &dyn Fn(&Sample) -> f64| summarize(&samples.iter().map(f).collect::<Vec<_>>());
    let serial = column(&|s| s.serial.ms);
    let serial_fetch = column(&|s| s.serial.ms - s.serial.resume_ms);
    let cold = column(&|s| s.cold.ms);
    let fetch = column(&|s| s.cold.ms - s.cold.resume_ms);
    let warm = column(&|s| s.warm_ms);
    let mib = bytes as f64 / f64::from(1 << 20);
    if json {
        let out = json!({
            "samples": cold.n,
            "fetched_mib": mib,
            "cold_p50_ms": cold.p50,
            "fetch_p50_ms": fetch.p50,
            "warm_p50_ms": warm.p50,
            "cold_over_warm_p50": cold.p50 / warm.p50,
            "fetch_concurrency": FETCH_CONCURRENCY,
            "serial_cold_p50_ms": serial.p50,
            "serial_fetch_p50_ms": serial_fetch.p50,
            "serial_over_concurrent_fetch_p50": serial_fetch.p50 / fetch.p50,
        });
        println!("{out}");
        return;
    }
    println!(
        "siesta bench resume --from s3: template {name}, {} / {}, {mib:.0} MiB of files (apparent size) per fetch; cold and warm creates alternate, no pre-spawned VMMs\n",
        s3.endpoint, s3.bucket
    );
    println!("| Create | Samples | Mean | p50 | Min | Max |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let concurrent = format!("object store, cold, {FETCH_CONCURRENCY} chunks at a time (default)");
    for (what, t) in [
        ("object store, cold, one chunk at a time", &serial),
        ("  of which the fetch", &serial_fetch),
        (concurrent.as_str(), &cold),
        ("  of which the fetch", &fetch),
        ("local repository (POSIX), warm", &warm),
    ] {
        println!(
            "| {what} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
            t.n, t.mean, t.p50, t.min, t.max
        );
    }
    println!("\n| Comparison | Value |\n| --- | ---: |");
    println!(
        "| fetch p50, one at a time / {FETCH_CONCURRENCY} at a time | {:.2} |",
        serial_fetch.p50 / fetch.p50
    );
    println!("| cold p50 / warm p50 | {:.2} |", cold.p50 / warm.p50);
}
