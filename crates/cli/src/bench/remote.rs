//! `siesta bench resume --from s3`: creates from a template the node does
//! not have, from the object store (`SIESTA_S3_*`) on that create: fetched
//! whole first ([`FETCH_CONCURRENCY`] chunks at a time), and served lazily
//! (the default: resumed before it is whole, `crates/tier/src/lazy/`),
//! against creates from the same template once it is in the local (POSIX)
//! repository, alternating in one run.
//!
//! Each sample runs a node in a new scratch home
//! (`$SIESTA_HOME/ephemeral/s3-<pid>-<n>`, the server's assets linked in,
//! its own empty repository), so its cold create really lacks the
//! template; its warm create follows in the same home. Neither uses
//! pre-spawned VMMs (`pool_size = 0`), so the two differ by the fetch
//! alone.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use siesta_sandbox::{CreateRequest, Node, NodeConfig, SandboxManager};
use siesta_snapshot::remote::{RemoteError, RemoteRepo, S3Config, FETCH_CONCURRENCY};
use siesta_snapshot::Repository;
use siesta_template as template;
use siesta_tier::RemoteTier;

use crate::stats::summarize;

/// Two cold creates (the template fetched whole, and served lazily) and
/// one warm create.
struct Sample {
    whole: Cold,
    lazy: Cold,
    warm_ms: f64,
}

/// A create from a template the node lacked.
struct Cold {
    ms: f64,
    /// The resume inside it (its stages' total).
    resume_ms: f64,
    /// Served lazily: MiB fetched when the create returned, and ms from
    /// its start until the template was whole and imported.
    lazy: Option<(f64, f64)>,
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

    let mut measured = Vec::with_capacity(samples);
    for i in 0..samples {
        let in_scratch = |n: usize, lazy: bool| {
            let (home, remote, id) = (&home, &remote, &id);
            async move {
                let scratch = scratch_home(&home.home, n)?;
                let outcome = sample(home, &scratch, remote, template_name, id, lazy).await;
                std::fs::remove_dir_all(&scratch)
                    .with_context(|| format!("removing {}", scratch.display()))?;
                outcome
            }
        };
        let context = || format!("sample {} of {samples}", i + 1);
        let (whole, _) = in_scratch(2 * i, false).await.with_context(context)?;
        let (lazy, warm_ms) = in_scratch(2 * i + 1, true).await.with_context(context)?;
        measured.push(Sample {
            whole,
            lazy,
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

/// One cold create (served `lazy`ly or fetched whole) and one warm create
/// (ms) by a node in `scratch`; `id` is the template's snapshot id.
async fn sample(
    home: &NodeConfig,
    scratch: &Path,
    remote: &RemoteRepo,
    name: &str,
    id: &str,
    lazy: bool,
) -> anyhow::Result<(Cold, f64)> {
    let mut config = home.clone();
    config.home = scratch.to_path_buf();
    config.sandbox_root = None;
    config.beside_server("n", siesta_net::Subnet::ten_slash_16(252));
    config.pool_size = 0;
    config.lazy_fetch = lazy;
    let node = Node::start(config).await?;
    let manager = SandboxManager::builder(node.clone())
        .remote(RemoteTier::new(remote.clone()))
        .ephemeral()?;
    if lazy && manager.remote().and_then(|r| r.lazy()).is_none() {
        anyhow::bail!("the lazy-fetch FUSE file system did not mount (see the log)");
    }
    let outcome = cold_then_warm(&manager, name, id).await;
    manager.shutdown().await;
    node.shutdown().await;
    outcome
}

async fn cold_then_warm(
    manager: &Arc<SandboxManager>,
    name: &str,
    id: &str,
) -> anyhow::Result<(Cold, f64)> {
    let started = Instant::now();
    let (ms, info) = timed_create(manager, name).await.context("cold create")?;
    let resume_ms = info.timings.map_or(0.0, |t| t.total_ms);
    let lazy = match manager
        .remote()
        .and_then(|r| r.lazy())
        .and_then(|l| l.view(id))
    {
        Some(view) => {
            let (fetched, _) = view.fetched();
            view.imported().await.context("lazy fetch")?;
            let whole_ms = started.elapsed().as_secs_f64() * 1000.0;
            Some((fetched as f64 / f64::from(1 << 20), whole_ms))
        }
        None => None,
    };
    manager.kill(&info.id).await?;
    let (warm_ms, info) = timed_create(manager, name).await.context("warm create")?;
    manager.kill(&info.id).await?;
    Ok((
        Cold {
            ms,
            resume_ms,
            lazy,
        },
        warm_ms,
    ))
}

async fn timed_create(
    manager: &Arc<SandboxManager>,
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
    let lazy_of = |s: &Sample| s.lazy.lazy.unwrap_or_default();
    let cold = column(&|s| s.whole.ms);
    let fetch = column(&|s| s.whole.ms - s.whole.resume_ms);
    let lazy = column(&|s| s.lazy.ms);
    let lazy_wait = column(&|s| s.lazy.ms - s.lazy.resume_ms);
    let lazy_mib = column(&|s| lazy_of(s).0);
    let lazy_whole = column(&|s| lazy_of(s).1);
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
            "lazy_cold_p50_ms": lazy.p50,
            "lazy_before_resume_p50_ms": lazy_wait.p50,
            "lazy_fetched_at_ready_p50_mib": lazy_mib.p50,
            "lazy_whole_p50_ms": lazy_whole.p50,
            "whole_over_lazy_cold_p50": cold.p50 / lazy.p50,
            "lazy_over_warm_p50": lazy.p50 / warm.p50,
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
    let whole = format!("object store, cold, fetched whole ({FETCH_CONCURRENCY} chunks at a time)");
    for (what, t) in [
        (whole.as_str(), &cold),
        ("  of which the fetch", &fetch),
        ("object store, cold, served lazily (default)", &lazy),
        (
            "  of which before the resume (record, state, manifest)",
            &lazy_wait,
        ),
        ("  until whole and imported (background)", &lazy_whole),
        ("local repository (POSIX), warm", &warm),
    ] {
        println!(
            "| {what} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
            t.n, t.mean, t.p50, t.min, t.max
        );
    }
    println!(
        "\nServed lazily, fetched when the create returned: p50 {:.0} MiB (min {:.0}, max {:.0}) of {mib:.0} MiB",
        lazy_mib.p50, lazy_mib.min, lazy_mib.max
    );
    println!("\n| Comparison | Value |\n| --- | ---: |");
    println!(
        "| cold p50, fetched whole / served lazily | {:.2} |",
        cold.p50 / lazy.p50
    );
    println!("| lazy cold p50 / warm p50 | {:.2} |", lazy.p50 / warm.p50);
    println!("| whole cold p50 / warm p50 | {:.2} |", cold.p50 / warm.p50);
}
