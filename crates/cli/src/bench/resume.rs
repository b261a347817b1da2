//! `siesta bench resume`: resumes from a template one after another, each
//! sandbox then paused and resumed once more, so both resume paths are
//! measured side by side, stage by stage, in one run.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;
use siesta_sandbox::stages::{Stage, StageTimings};
use siesta_sandbox::{Node, SandboxManager};
use siesta_template::{self as template, Template};

use super::session::create_pooled;
use crate::stats::{summarize, Summary};

#[derive(clap::Args)]
pub struct ResumeArgs {
    /// Number of resumes.
    #[arg(long, default_value_t = 20)]
    samples: usize,
    #[arg(long, default_value = "base")]
    template: String,
    /// The second template of `--compare templates`.
    #[arg(long)]
    against: Option<String>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Run a randomized-block comparison instead (see `bench/compare/`).
    #[arg(long, value_enum)]
    compare: Option<super::compare::Compare>,
    /// Blocks of the comparison (each runs every condition once).
    #[arg(long, default_value_t = 8)]
    blocks: usize,
    /// Resume this many sandboxes at once, in `--samples` rounds, against
    /// as many resumes one at a time: p50 and p99 against the single p50.
    #[arg(long)]
    concurrency: Option<usize>,
    /// `s3`: create from the template fetched from the object store
    /// (`SIESTA_S3_*`) by a node that lacks it, against creates once it is
    /// local (see `bench/remote.rs`).
    #[arg(long, value_enum)]
    from: Option<ResumeSource>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ResumeSource {
    S3,
}

pub async fn run(args: ResumeArgs) -> anyhow::Result<ExitCode> {
    if let Some(what) = args.compare {
        let against = args.against.as_deref();
        return super::compare::run(what, &args.template, against, args.blocks, args.json).await;
    }
    if let Some(ResumeSource::S3) = args.from {
        return super::remote::run(&args.template, args.samples, args.json).await;
    }
    let config = super::session::bench_config("n")?;
    let layout = config.layout();
    let tpl = Template::open(&layout, &args.template)?;
    let node = Node::start(config).await?;
    // In-memory state: the bench's sandboxes die with it and it never
    // touches the server's rows.
    let manager = SandboxManager::ephemeral(node.clone())?;
    if let Some(n) = args.concurrency.filter(|n| *n > 0) {
        manager.warm(&args.template)?;
        let outcome = super::concurrent::measure(&manager, &args.template, n, args.samples).await;
        manager.shutdown().await;
        node.shutdown().await;
        super::session::remove_sandbox_root(&node.config);
        super::concurrent::report(&outcome?, &args.template, args.json);
        return Ok(ExitCode::SUCCESS);
    }
    let outcome = measure(&node, &manager, &tpl, &args).await;
    manager.shutdown().await;
    node.shutdown().await;
    super::session::remove_sandbox_root(&node.config);
    let measured = outcome?;
    report(&args, &measured, &node);
    Ok(ExitCode::SUCCESS)
}

/// Stage timings of each path, and the cold boot they compare with.
struct Measured {
    from_template: Vec<StageTimings>,
    from_paused: Vec<StageTimings>,
    cold_boot_ms: f64,
}

async fn measure(
    node: &std::sync::Arc<Node>,
    manager: &std::sync::Arc<SandboxManager>,
    tpl: &Template,
    args: &ResumeArgs,
) -> anyhow::Result<Measured> {
    // A template built from an OCI image has no root file system asset to
    // boot again: its build's own cold boot stands in.
    let cold_boot_ms = if node.config.layout().image(&tpl.record.image).exists() {
        template::cold_boot(node, &tpl.record.image)
            .await
            .context("cold boot of the template's image")?
    } else {
        tpl.record.cold_boot_ms
    };
    manager.warm(&args.template)?;
    let mut out = Measured {
        from_template: Vec::with_capacity(args.samples),
        from_paused: Vec::with_capacity(args.samples),
        cold_boot_ms,
    };
    for i in 0..args.samples {
        let info = create_pooled(manager, &args.template)
            .await
            .with_context(|| format!("resume {} of {}", i + 1, args.samples))?;
        out.from_template
            .push(info.timings.clone().unwrap_or_default());
        // Both paths resume into a VMM the pool has waiting.
        let paused = async {
            manager.pause(&info.id).await?;
            manager
                .wait_pool_ready(&args.template, std::time::Duration::from_secs(120))
                .await?;
            anyhow::Ok(manager.resume(&info.id).await?)
        }
        .await
        .with_context(|| format!("pause and resume {} of {}", i + 1, args.samples));
        manager.kill(&info.id).await?;
        out.from_paused.push(paused?.timings.unwrap_or_default());
    }
    Ok(out)
}

/// Summaries of one path's samples.
struct PathSummary {
    total: Summary,
    host: Summary,
    unattributed: Summary,
    stages: BTreeMap<Stage, Summary>,
}

fn summarize_path(samples: &[StageTimings]) -> PathSummary {
    let column =
        |f: &dyn Fn(&StageTimings) -> f64| summarize(&samples.iter().map(f).collect::<Vec<_>>());
    let mut stages = BTreeMap::new();
    for stage in Stage::ALL {
        if samples.iter().any(|t| t.get(stage) > 0.0) {
            stages.insert(stage, column(&|t| t.get(stage)));
        }
    }
    PathSummary {
        total: column(&|t| t.total_ms),
        host: column(&StageTimings::host_side_ms),
        unattributed: column(&StageTimings::unattributed_ms),
        stages,
    }
}

fn report(args: &ResumeArgs, m: &Measured, node: &Node) {
    let tpl = summarize_path(&m.from_template);
    let paused = summarize_path(&m.from_paused);
    let cold_boot_ms = m.cold_boot_ms;
    let vmm = node.vmm.info().clone();
    if args.json {
        let out = json!({
            "samples": tpl.total.n,
            "mean_ms": tpl.total.mean,
            "p50_ms": tpl.total.p50,
            "min_ms": tpl.total.min,
            "max_ms": tpl.total.max,
            "stages": stage_means(&tpl),
            "unattributed_ms": tpl.unattributed.mean,
            "host_side_p50_ms": tpl.host.p50,
            "cold_boot_ms": cold_boot_ms,
            "p50_over_cold_boot": tpl.total.p50 / cold_boot_ms,
            "paused": {
                "mean_ms": paused.total.mean,
                "p50_ms": paused.total.p50,
                "min_ms": paused.total.min,
                "max_ms": paused.total.max,
                "stages": stage_means(&paused),
                "host_side_p50_ms": paused.host.p50,
            },
            "paused_over_template_p50": paused.total.p50 / tpl.total.p50,
            "vmm": vmm,
        });
        println!("{out}");
        return;
    }
    println!(
        "siesta bench resume: template {}, {} {} ({}); each sandbox resumed from the template, then paused and resumed again\n",
        args.template,
        vmm.kind,
        vmm.version,
        vmm.accel.as_str()
    );
    println!("| Resume from | Samples | Mean | p50 | Min | Max |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, p) in [("template", &tpl), ("paused sandbox", &paused)] {
        let t = &p.total;
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            t.n, t.mean, t.p50, t.min, t.max
        );
    }
    println!();
    println!("| Stage | template mean | template p50 | share | paused mean | paused p50 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let stages: std::collections::BTreeSet<Stage> = tpl
        .stages
        .keys()
        .chain(paused.stages.keys())
        .copied()
        .collect();
    let cell = |p: &PathSummary, s: Stage| {
        p.stages
            .get(&s)
            .map(|v| (format!("{:.3} ms", v.mean), format!("{:.3} ms", v.p50)))
            .unwrap_or(("-".into(), "-".into()))
    };
    for stage in stages {
        let ((tm, tp), (pm, pp)) = (cell(&tpl, stage), cell(&paused, stage));
        let share = tpl
            .stages
            .get(&stage)
            .map(|v| format!("{:.2}%", 100.0 * v.mean / tpl.total.mean))
            .unwrap_or("-".into());
        println!("| {} | {tm} | {tp} | {share} | {pm} | {pp} |", stage.name());
    }
    println!(
        "| unattributed | {:.3} ms | - | {:.2}% | {:.3} ms | - |",
        tpl.unattributed.mean,
        100.0 * tpl.unattributed.mean / tpl.total.mean,
        paused.unattributed.mean
    );
    println!(
        "| **total** | **{:.3} ms** | **{:.3} ms** | 100% | **{:.3} ms** | **{:.3} ms** |\n",
        tpl.total.mean, tpl.total.p50, paused.total.mean, paused.total.p50
    );
    println!("| Comparison | Value |");
    println!("| --- | ---: |");
    println!("| cold boot of the same image (spawn to first /health) | {cold_boot_ms:.1} ms |");
    println!(
        "| resume p50 / cold boot | {:.4} (1/{:.0}) |",
        tpl.total.p50 / cold_boot_ms,
        cold_boot_ms / tpl.total.p50
    );
    println!(
        "| host side p50 (total - guest_health - agent_init) | {:.3} ms |",
        tpl.host.p50
    );
    println!(
        "| paused resume p50 / template resume p50 | {:.3} |",
        paused.total.p50 / tpl.total.p50
    );
    println!("| paused host side p50 | {:.3} ms |", paused.host.p50);
}

fn stage_means(p: &PathSummary) -> serde_json::Map<String, serde_json::Value> {
    p.stages
        .iter()
        .map(|(s, v)| (s.name().to_string(), json!(v.mean)))
        .collect()
}
