//! `siesta bench resume`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use siesta_sandbox::stages::{Stage, StageTimings};
use siesta_sandbox::template::{self, Template};
use siesta_sandbox::{CreateRequest, Node, NodeConfig, SandboxManager};

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
}

pub async fn run(args: ResumeArgs) -> anyhow::Result<ExitCode> {
    if let Some(what) = args.compare {
        let against = args.against.as_deref();
        return super::compare::run(what, &args.template, against, args.blocks, args.json).await;
    }
    let mut config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    config.net_tag = "n".into(); // never the server's slots
    let layout = config.layout();
    let tpl = Template::open(&layout, &args.template)?;
    let node = Node::start(config).await?;
    // In-memory state: the bench's sandboxes die with it and it never
    // touches the server's rows.
    let manager = SandboxManager::ephemeral(node.clone())?;
    let outcome = measure(&node, &manager, &tpl, &args).await;
    manager.shutdown().await;
    node.shutdown().await;
    let (samples, cold_boot_ms) = outcome?;
    report(&args, &samples, cold_boot_ms, &node);
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    node: &std::sync::Arc<Node>,
    manager: &std::sync::Arc<SandboxManager>,
    tpl: &Template,
    args: &ResumeArgs,
) -> anyhow::Result<(Vec<StageTimings>, f64)> {
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
    let mut samples = Vec::with_capacity(args.samples);
    for i in 0..args.samples {
        // Every sample takes a pre-spawned VMM, as in the seed's warm-pool runs.
        manager
            .wait_pool_ready(&args.template, Duration::from_secs(120))
            .await?;
        let info = manager
            .create(CreateRequest {
                template: args.template.clone(),
                // The API's default: internet allowed, as a pooled slot starts.
                egress: Default::default(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("resume {} of {}", i + 1, args.samples))?;
        samples.push(info.timings.clone().unwrap_or_default());
        manager.kill(&info.id).await?;
    }
    Ok((samples, cold_boot_ms))
}

fn report(args: &ResumeArgs, samples: &[StageTimings], cold_boot_ms: f64, node: &Node) {
    let totals: Vec<f64> = samples.iter().map(|t| t.total_ms).collect();
    let total = summarize(&totals);
    let host: Vec<f64> = samples.iter().map(StageTimings::host_side_ms).collect();
    let host = summarize(&host);
    let unattributed = summarize(
        &samples
            .iter()
            .map(StageTimings::unattributed_ms)
            .collect::<Vec<_>>(),
    );
    let mut stages: BTreeMap<Stage, Summary> = BTreeMap::new();
    for stage in Stage::ALL {
        let values: Vec<f64> = samples.iter().map(|t| t.get(stage)).collect();
        if values.iter().any(|v| *v > 0.0) {
            stages.insert(stage, summarize(&values));
        }
    }
    let vmm = node.vmm.info().clone();
    if args.json {
        let stage_means: serde_json::Map<String, serde_json::Value> = stages
            .iter()
            .map(|(s, v)| (s.name().to_string(), json!(v.mean)))
            .collect();
        let out = json!({
            "samples": total.n,
            "mean_ms": total.mean,
            "p50_ms": total.p50,
            "min_ms": total.min,
            "max_ms": total.max,
            "stages": stage_means,
            "unattributed_ms": unattributed.mean,
            "host_side_p50_ms": host.p50,
            "cold_boot_ms": cold_boot_ms,
            "p50_over_cold_boot": total.p50 / cold_boot_ms,
            "vmm": vmm,
        });
        println!("{out}");
        return;
    }
    println!(
        "siesta bench resume: template {}, {} {} ({})\n",
        args.template,
        vmm.kind,
        vmm.version,
        vmm.accel.as_str()
    );
    println!("| Samples | Mean | p50 | Min | Max |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |\n",
        total.n, total.mean, total.p50, total.min, total.max
    );
    println!("| Stage | Mean | p50 | Share |");
    println!("| --- | ---: | ---: | ---: |");
    for (stage, s) in &stages {
        println!(
            "| {} | {:.3} ms | {:.3} ms | {:.2}% |",
            stage.name(),
            s.mean,
            s.p50,
            100.0 * s.mean / total.mean
        );
    }
    println!(
        "| unattributed | {:.3} ms | - | {:.2}% |",
        unattributed.mean,
        100.0 * unattributed.mean / total.mean
    );
    println!(
        "| **total** | **{:.3} ms** | **{:.3} ms** | 100% |\n",
        total.mean, total.p50
    );
    println!("| Comparison | Value |");
    println!("| --- | ---: |");
    println!("| cold boot of the same image (spawn to first /health) | {cold_boot_ms:.1} ms |");
    println!(
        "| resume p50 / cold boot | {:.4} (1/{:.0}) |",
        total.p50 / cold_boot_ms,
        cold_boot_ms / total.p50
    );
    println!(
        "| host side p50 (total - guest_health - agent_init) | {:.3} ms |",
        host.p50
    );
}
