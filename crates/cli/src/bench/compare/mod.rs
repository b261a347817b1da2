//! `siesta bench resume --compare WHAT --blocks N [--json]`: randomized-block
//! experiments on the resume path, in the style of the seed's
//! (shared/seeds/001_*): conditions in a fresh random order per block, an
//! untimed baseline resume before every timed one, paired differences with
//! 95% Student-t intervals.
//!
//! - `prefetch` ([`prefetch`]): startup-manifest prefetch under file-warm
//!   and file-cold memory, four conditions.
//! - `pool`, `prealloc`, `policy-skip` ([`followup`]): the seed's other
//!   follow-ups, each work the VMM pool can take off the resume path, as
//!   off/on pairs with the memory file warm; `refill` likewise, for when
//!   the pool spawns the VMM that replaces the one a resume took.
//! - `templates` ([`templates`]): resumes of two templates side by side
//!   (`--template A --against B`), say `base` and one built from an image.

mod followup;
mod prefetch;
mod templates;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use siesta_envd_client::InitParams;
use siesta_sandbox::layout::Layout;
use siesta_sandbox::pool::{PoolOptions, VmmPool};
use siesta_sandbox::resume::{self, ResumeParams};
use siesta_sandbox::stages::{Stage, StageTimings};
use siesta_sandbox::Node;
use siesta_template::{self as template, Template};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compare {
    /// Startup-manifest prefetch under file-warm and file-cold memory.
    Prefetch,
    /// A VMM prepared ahead by the pool (process, device configuration,
    /// disk overlay, network slot) against one made on the resume path.
    Pool,
    /// Guest memory populated when the pooled VMM is spawned against
    /// faulted in by the running guest.
    Prealloc,
    /// Skipping an unchanged egress policy on a reused slot against
    /// re-applying it.
    PolicySkip,
    /// Spawning the pool's replacement VMM once the resume is ready against
    /// alongside it.
    Refill,
    /// Resumes of `--template` against those of `--against`.
    Templates,
}

/// Attempts per trial before the run is abandoned.
const MAX_TRIES: usize = 5;
/// How long to wait for a pooled VMM.
const POOL_WAIT: Duration = Duration::from_secs(120);

pub async fn run(
    what: Compare,
    template: &str,
    against: Option<&str>,
    blocks: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if what == Compare::Templates && against.is_none() {
        bail!("--compare templates needs --against OTHER_TEMPLATE");
    }
    if blocks < 2 {
        bail!("--blocks must be at least 2 for intervals");
    }
    let config = super::session::bench_config("c")?;
    let layout = config.layout();
    let node = Node::start(config).await?;
    let outcome = match what {
        Compare::Prefetch => prefetch::run(&node, &layout, template, blocks, json).await,
        Compare::Templates => {
            let names = [template, against.unwrap_or_default()];
            templates::run(&node, &layout, names, blocks, json).await
        }
        other => followup::run(&node, &layout, other, template, blocks, json).await,
    };
    node.shutdown().await;
    super::session::remove_sandbox_root(&node.config);
    outcome
}

/// The pool every experiment starts from: one VMM waiting, as a server runs.
fn warm_pool() -> PoolOptions {
    PoolOptions {
        size: 1,
        prealloc_memory: false,
        policy_skip: true,
        refill_after_ready: true,
        refill_when_quiet: true,
    }
}

/// The template, with a startup manifest (recorded now when it has none).
async fn ready_template(node: &Arc<Node>, layout: &Layout, name: &str) -> anyhow::Result<Template> {
    let tpl = Template::open(layout, name)?;
    let has = tpl.snapshot.as_ref().is_some_and(|s| s.manifest.is_some());
    if has {
        return Ok(tpl);
    }
    eprintln!("template {name} has no startup manifest: recording one");
    template::record_startup_manifest(node, &tpl)
        .await
        .context("recording the startup manifest")?;
    Ok(Template::open(layout, name)?)
}

/// One resume of `tpl` through `pool` (waiting for its VMM first unless the
/// pool keeps none), as the server resumes a new sandbox.
async fn resume_once(
    node: &Arc<Node>,
    pool: &Arc<VmmPool>,
    tpl: &Template,
) -> anyhow::Result<resume::Resumed> {
    if pool.options().size > 0 {
        pool.wait_ready(&tpl.record.name, POOL_WAIT).await?;
    }
    let params = ResumeParams {
        init: InitParams::new(None, Default::default(), &Default::default()),
        guest_token: None,
        egress: siesta_net::EgressPolicy::default(),
        mounts: Vec::new(),
        volumes: None,
    };
    Ok(resume::from_template(node, pool, tpl, &params).await?)
}

/// Stops a resumed VM and removes its sandbox directory.
async fn stop(node: &Node, mut r: resume::Resumed) {
    let _ = r.vm.shutdown().await;
    node.release_slot(r.slot).await;
    let _ = std::fs::remove_dir_all(&r.dir);
}

/// Mean of every stage per condition (columns of `(name, timings)`): where
/// a difference comes from.
fn stage_table(columns: &[(&str, Vec<&StageTimings>)]) {
    print!("\n| Stage (mean ms) |");
    for (name, _) in columns {
        print!(" {name} |");
    }
    print!("\n| --- |");
    for _ in columns {
        print!(" ---: |");
    }
    println!();
    let row = |label: &str, f: &dyn Fn(&StageTimings) -> f64| {
        print!("| {label} |");
        for (_, v) in columns {
            let mean = v.iter().map(|t| f(t)).sum::<f64>() / v.len().max(1) as f64;
            print!(" {mean:.1} |");
        }
        println!();
    };
    for stage in Stage::ALL {
        row(stage.name(), &|t| t.get(stage));
    }
    row("unattributed", &StageTimings::unattributed_ms);
    row("**total**", &|t| t.total_ms);
}
