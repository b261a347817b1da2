//! `siesta bench resume --compare prefetch --blocks N [--json]`: the seed's
//! randomized-block experiment (shared/seeds/001_*).
//!
//! Each block runs the four conditions in a fresh random order:
//! file-warm/prefetch-off, file-warm/prefetch-on, file-cold/prefetch-off,
//! file-cold/prefetch-on. Every timed resume is preceded by an untimed
//! prefetch-off baseline resume that is stopped and released, then the
//! memory file's page cache is prepared (cold: `POSIX_FADV_DONTNEED`; warm:
//! read whole) and verified with `mincore` right before the timer starts;
//! a trial whose check fails is rejected and redone. Timed: the normal
//! resume path (`resume::from_template`, pool hit) from start to the agent
//! initialised.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rand::seq::SliceRandom;
use serde_json::json;
use siesta_sandbox::envd::InitParams;
use siesta_sandbox::pool::VmmPool;
use siesta_sandbox::resume::{self, ResumeParams};
use siesta_sandbox::stages::{Stage, StageTimings};
use siesta_sandbox::template::{self, Template};
use siesta_sandbox::{Node, NodeConfig};

use super::pagecache::{make_cold, make_warm, residency};
use super::paired::{paired, Paired};
use crate::stats::summarize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compare {
    /// Startup-manifest prefetch under file-warm and file-cold memory.
    Prefetch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cond {
    WarmOff,
    WarmOn,
    ColdOff,
    ColdOn,
}

impl Cond {
    const ALL: [Cond; 4] = [Cond::WarmOff, Cond::WarmOn, Cond::ColdOff, Cond::ColdOn];
    fn name(self) -> &'static str {
        match self {
            Cond::WarmOff => "warm_off",
            Cond::WarmOn => "warm_on",
            Cond::ColdOff => "cold_off",
            Cond::ColdOn => "cold_on",
        }
    }
    fn warm(self) -> bool {
        matches!(self, Cond::WarmOff | Cond::WarmOn)
    }
    fn prefetch(self) -> bool {
        matches!(self, Cond::WarmOn | Cond::ColdOn)
    }
}

/// Attempts per trial before the run is abandoned.
const MAX_TRIES: usize = 5;

struct Trial {
    ms: f64,
    timings: StageTimings,
}

pub async fn run(
    _what: Compare,
    template: &str,
    blocks: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if blocks < 2 {
        bail!("--blocks must be at least 2 for intervals");
    }
    let mut config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    config.net_tag = "c".into(); // never a server's slots
    config.pool_size = 1;
    let layout = config.layout();
    let node = Node::start(config).await?;
    let pool = VmmPool::new(Arc::clone(&node));
    let outcome = async {
        let tpl = ready_template(&node, &layout, template).await?;
        pool.refill(tpl.clone());
        measure(&node, &pool, &tpl, blocks, json).await
    }
    .await;
    pool.drain().await;
    node.shutdown().await;
    let (trials, rejected, tpl) = outcome?;
    report(&trials, rejected, blocks, &tpl, &node, json);
    Ok(ExitCode::SUCCESS)
}

/// The template, with a startup manifest (recorded now when it has none).
async fn ready_template(
    node: &Arc<Node>,
    layout: &siesta_sandbox::layout::Layout,
    name: &str,
) -> anyhow::Result<Template> {
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

type Measured = (BTreeMap<Cond, Vec<Trial>>, usize, Template);

async fn measure(
    node: &Arc<Node>,
    pool: &Arc<VmmPool>,
    tpl: &Template,
    blocks: usize,
    quiet: bool,
) -> anyhow::Result<Measured> {
    let mut trials: BTreeMap<Cond, Vec<Trial>> = BTreeMap::new();
    let mut rejected = 0;
    let mut rng = rand::thread_rng();
    for block in 0..blocks {
        let mut order = Cond::ALL;
        order.shuffle(&mut rng);
        if !quiet {
            let names: Vec<&str> = order.iter().map(|c| c.name()).collect();
            eprintln!("block {}/{blocks}: {}", block + 1, names.join(", "));
        }
        for cond in order {
            let mut tries = 0;
            let trial = loop {
                tries += 1;
                if tries > MAX_TRIES {
                    bail!("{}: cache check failed {MAX_TRIES} times", cond.name());
                }
                match one_trial(node, pool, tpl, cond).await? {
                    Some(t) => break t,
                    None => rejected += 1,
                }
            };
            trials.entry(cond).or_default().push(trial);
        }
    }
    Ok((trials, rejected, tpl.clone()))
}

/// One timed resume under `cond`, after its baseline; `None` when the
/// page-cache check failed (the caller redoes it).
async fn one_trial(
    node: &Arc<Node>,
    pool: &Arc<VmmPool>,
    tpl: &Template,
    cond: Cond,
) -> anyhow::Result<Option<Trial>> {
    node.prefetch.set_enabled(false);
    let baseline = resume_once(node, pool, tpl)
        .await
        .context("baseline resume")?;
    stop(node, baseline).await;
    // The next pooled VMM must wait before the cache is prepared: its spawn
    // is not part of the timed resume.
    pool.wait_ready(&tpl.record.name, Duration::from_secs(120))
        .await?;
    let memory = tpl.memory_path();
    if cond.warm() {
        make_warm(&memory)?;
    } else {
        make_cold(&memory)?;
    }
    let (resident, pages) = residency(&memory)?;
    let ok = if cond.warm() {
        resident == pages
    } else {
        resident == 0
    };
    if !ok {
        eprintln!(
            "{}: rejected, {resident}/{pages} pages resident",
            cond.name()
        );
        return Ok(None);
    }
    node.prefetch.set_enabled(cond.prefetch());
    let resumed = resume_once(node, pool, tpl).await.context("timed resume");
    node.prefetch.set_enabled(false);
    let resumed = resumed?;
    let timings = resumed.timings.clone();
    stop(node, resumed).await;
    Ok(Some(Trial {
        ms: timings.total_ms,
        timings,
    }))
}

async fn resume_once(
    node: &Arc<Node>,
    pool: &Arc<VmmPool>,
    tpl: &Template,
) -> anyhow::Result<resume::Resumed> {
    pool.wait_ready(&tpl.record.name, Duration::from_secs(120))
        .await?;
    let params = ResumeParams {
        init: InitParams::new(None, Default::default()),
        guest_token: None,
        egress: siesta_net::EgressPolicy {
            allow_internet: true,
        },
    };
    Ok(resume::from_template(node, pool, tpl, &params).await?)
}

async fn stop(node: &Node, mut r: resume::Resumed) {
    let _ = r.vm.shutdown().await;
    node.release_slot(r.slot).await;
    let _ = std::fs::remove_dir_all(&r.dir);
}

/// The four paired comparisons of the seed, per block.
fn pairs(trials: &BTreeMap<Cond, Vec<Trial>>) -> Vec<(&'static str, &'static str, Paired)> {
    let ms = |c: Cond| -> Vec<f64> {
        trials
            .get(&c)
            .map(|v| v.iter().map(|t| t.ms).collect())
            .unwrap_or_default()
    };
    let diff =
        |a: Cond, b: Cond| -> Vec<f64> { ms(a).iter().zip(ms(b)).map(|(x, y)| x - y).collect() };
    vec![
        (
            "warm_on_minus_off",
            "File-warm: prefetch on minus off",
            paired(&diff(Cond::WarmOn, Cond::WarmOff)),
        ),
        (
            "cold_on_minus_off",
            "File-cold: prefetch on minus off",
            paired(&diff(Cond::ColdOn, Cond::ColdOff)),
        ),
        (
            "off_cold_minus_warm",
            "Prefetch off: file-cold minus file-warm",
            paired(&diff(Cond::ColdOff, Cond::WarmOff)),
        ),
        (
            "on_cold_minus_warm",
            "Prefetch on: file-cold minus file-warm",
            paired(&diff(Cond::ColdOn, Cond::WarmOn)),
        ),
    ]
}

fn report(
    trials: &BTreeMap<Cond, Vec<Trial>>,
    rejected: usize,
    blocks: usize,
    tpl: &Template,
    node: &Node,
    json: bool,
) {
    let summary = |c: Cond| {
        let v: Vec<f64> = trials
            .get(&c)
            .map(|v| v.iter().map(|t| t.ms).collect())
            .unwrap_or_default();
        summarize(&v)
    };
    let pairs = pairs(trials);
    if json {
        let conditions: serde_json::Map<String, serde_json::Value> = Cond::ALL
            .iter()
            .map(|c| {
                let s = summary(*c);
                (
                    c.name().to_string(),
                    json!({"mean_ms": s.mean, "median_ms": s.p50, "n": s.n}),
                )
            })
            .collect();
        let paired: serde_json::Map<String, serde_json::Value> = pairs
            .iter()
            .map(|(k, _, p)| {
                (
                    k.to_string(),
                    json!({"mean_ms": p.mean, "ci95_ms": [p.lo, p.hi]}),
                )
            })
            .collect();
        println!("{}", json!({"conditions": conditions, "paired": paired}));
        return;
    }
    let vmm = node.vmm.info();
    let mem = tpl.memory_path();
    let manifest_mib = tpl
        .snapshot
        .as_ref()
        .and_then(|s| s.manifest.as_ref())
        .map_or(0.0, |_| {
            trials
                .get(&Cond::ColdOn)
                .and_then(|v| v.first())
                .and_then(|t| t.timings.background(Stage::MemoryPrefetch))
                .map_or(0.0, |b| b.bytes as f64 / (1 << 20) as f64)
        });
    println!(
        "siesta bench resume --compare prefetch: template {}, {} {} ({}), {blocks} blocks, {rejected} trials rejected and redone",
        tpl.record.name, vmm.kind, vmm.version, vmm.accel.as_str()
    );
    println!(
        "memory file {} ({} MiB), prefetch read {manifest_mib:.1} MiB per resume\n",
        mem.display(),
        tpl.record.memory.size >> 20
    );
    let (wo, wn, co, cn) = (
        summary(Cond::WarmOff),
        summary(Cond::WarmOn),
        summary(Cond::ColdOff),
        summary(Cond::ColdOn),
    );
    println!("| Memory-file page cache | Prefetch off: mean / median | Prefetch on: mean / median | Reduction in mean |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, off, on) in [
        ("File-warm: all pages resident", wo, wn),
        ("File-cold: no pages resident", co, cn),
    ] {
        println!(
            "| {name} | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.1}% |",
            off.mean,
            off.p50,
            on.mean,
            on.p50,
            100.0 * (off.mean - on.mean) / off.mean
        );
    }
    println!(
        "\n| Paired comparison (n = {}) | Mean difference | 95% interval |",
        pairs[0].2.n
    );
    println!("| --- | ---: | ---: |");
    for (_, label, p) in &pairs {
        println!(
            "| {label} | {:+.1} ms | [{:+.1}, {:+.1}] ms |",
            p.mean, p.lo, p.hi
        );
    }
    let recovered = (co.mean - cn.mean) / (co.mean - wo.mean);
    println!("\n| Target (ratios of means) | Measured | Target |");
    println!("| --- | ---: | ---: |");
    println!("| file-cold penalty recovered (cold_off - cold_on) / (cold_off - warm_off) | {recovered:.2} | >= 0.95 |");
    println!(
        "| cold_on / cold_off | {:.2} | (reference 0.44) |",
        cn.mean / co.mean
    );
    println!(
        "| warm_on / warm_off | {:.2} | <= 0.70 where faults dominate, never > 1 |",
        wn.mean / wo.mean
    );
    println!("\n| Condition | memory_prefetch ran (mean) | finished before ready |");
    println!("| --- | ---: | ---: |");
    for c in Cond::ALL {
        let v = trials.get(&c).map(Vec::as_slice).unwrap_or_default();
        let bg: Vec<_> = v
            .iter()
            .filter_map(|t| t.timings.background(Stage::MemoryPrefetch))
            .collect();
        let ran = bg.iter().map(|b| b.ms).sum::<f64>() / bg.len().max(1) as f64;
        let done = bg.iter().filter(|b| b.finished_before_ready).count();
        let ran = if bg.is_empty() {
            "-".to_string()
        } else {
            format!("{ran:.1} ms")
        };
        println!("| {} | {ran} | {done}/{} |", c.name(), v.len());
    }
    stage_table(trials);
}

/// Mean of every stage per condition: where a difference comes from.
fn stage_table(trials: &BTreeMap<Cond, Vec<Trial>>) {
    print!("\n| Stage (mean ms) |");
    for c in Cond::ALL {
        print!(" {} |", c.name());
    }
    println!("\n| --- | ---: | ---: | ---: | ---: |");
    let mean = |c: Cond, f: &dyn Fn(&StageTimings) -> f64| {
        let v = trials.get(&c).map(Vec::as_slice).unwrap_or_default();
        v.iter().map(|t| f(&t.timings)).sum::<f64>() / v.len().max(1) as f64
    };
    for stage in Stage::ALL {
        print!("| {} |", stage.name());
        for c in Cond::ALL {
            print!(" {:.1} |", mean(c, &|t| t.get(stage)));
        }
        println!();
    }
    print!("| unattributed |");
    for c in Cond::ALL {
        print!(" {:.1} |", mean(c, &StageTimings::unattributed_ms));
    }
    print!("\n| **total** |");
    for c in Cond::ALL {
        print!(" **{:.1}** |", mean(c, &|t| t.total_ms));
    }
    println!();
}
