//! `--compare prefetch`: the seed's randomized-block experiment
//! (shared/seeds/001_*).
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
use siesta_sandbox::layout::Layout;
use siesta_sandbox::pool::VmmPool;
use siesta_sandbox::stages::{Stage, StageTimings};
use siesta_sandbox::Node;
use siesta_template::Template;

use super::{ready_template, resume_once, stage_table, stop, warm_pool, MAX_TRIES};
use crate::bench::pagecache::{make_cold, make_warm, residency};
use crate::bench::paired::{paired, Paired};
use crate::stats::summarize;

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

struct Trial {
    ms: f64,
    timings: StageTimings,
}

pub async fn run(
    node: &Arc<Node>,
    layout: &Layout,
    template: &str,
    blocks: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let pool = VmmPool::with_options(Arc::clone(node), warm_pool());
    let outcome = async {
        let tpl = ready_template(node, layout, template).await?;
        pool.refill(tpl.clone());
        measure(node, &pool, &tpl, blocks, json).await
    }
    .await;
    pool.drain().await;
    let (trials, rejected, tpl) = outcome?;
    report(&trials, rejected, blocks, &tpl, node, json);
    Ok(ExitCode::SUCCESS)
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
    let columns: Vec<(&str, Vec<&StageTimings>)> = Cond::ALL
        .iter()
        .map(|c| {
            let v = trials.get(c).map(Vec::as_slice).unwrap_or_default();
            (c.name(), v.iter().map(|t| &t.timings).collect())
        })
        .collect();
    stage_table(&columns);
}
