//! `--compare pool|prealloc|policy-skip|refill`: the seed's other
//! follow-ups, and when the pool refills, as off/on experiments. Each is
//! work the VMM pool can do before a resume instead of during it (or
//! after it), so each condition is a pool configured one way
//! ([`PoolOptions`]):
//!
//! | experiment    | off                                   | on                                   |
//! |---------------|---------------------------------------|--------------------------------------|
//! | `pool`        | no VMM waiting: slot, overlay, device configuration and QEMU made on the resume path | one VMM waiting (the server's default) |
//! | `prealloc`    | guest memory faulted in by the guest  | populated when the pooled VMM starts |
//! | `policy-skip` | the slot's egress policy re-applied   | skipped when unchanged (the default) |
//! | `refill`      | the replacement VMM spawned as the resume takes one | spawned once the resume is ready (the default) |
//!
//! Each block runs both conditions in a fresh random order; each timed
//! resume follows an untimed baseline resume through the same pool, which
//! is stopped and released. The memory file is read whole and checked
//! fully resident with `mincore` before the timer starts (else the trial is
//! rejected and redone), so the difference is the mechanism, not the disk.
//! Prefetch is off throughout. Timed: `resume::from_template` from its
//! start to the agent initialised.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use rand::seq::SliceRandom;
use serde_json::json;
use siesta_sandbox::layout::Layout;
use siesta_sandbox::pool::{PoolOptions, VmmPool};
use siesta_sandbox::stages::{Stage, StageTimings};
use siesta_sandbox::Node;
use siesta_template::Template;

use super::{ready_template, resume_once, stage_table, stop, warm_pool, Compare, MAX_TRIES};
use crate::bench::pagecache::{make_warm, residency};
use crate::bench::paired::paired;
use crate::stats::summarize;

/// The two pools an experiment compares: (off, on).
fn arms(what: Compare) -> (PoolOptions, PoolOptions) {
    let on = warm_pool();
    match what {
        Compare::Pool => (PoolOptions { size: 0, ..on }, on),
        Compare::Prealloc => (
            on,
            PoolOptions {
                prealloc_memory: true,
                ..on
            },
        ),
        Compare::PolicySkip => (
            PoolOptions {
                policy_skip: false,
                ..on
            },
            on,
        ),
        Compare::Refill => (
            PoolOptions {
                refill_after_ready: false,
                ..on
            },
            on,
        ),
        Compare::Prefetch | Compare::Templates => {
            unreachable!("prefetch and templates have their own experiments")
        }
    }
}

fn label(what: Compare) -> &'static str {
    match what {
        Compare::Pool => "pool",
        Compare::Prealloc => "prealloc",
        Compare::PolicySkip => "policy-skip",
        Compare::Refill => "refill",
        Compare::Prefetch => "prefetch",
        Compare::Templates => "templates",
    }
}

/// Timed resumes of one condition.
#[derive(Default)]
struct Arm {
    ms: Vec<f64>,
    timings: Vec<StageTimings>,
}

pub async fn run(
    node: &Arc<Node>,
    layout: &Layout,
    what: Compare,
    template: &str,
    blocks: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (off_opts, on_opts) = arms(what);
    let off = VmmPool::with_options(Arc::clone(node), off_opts);
    let on = VmmPool::with_options(Arc::clone(node), on_opts);
    node.prefetch.set_enabled(false);
    let outcome = async {
        let tpl = ready_template(node, layout, template).await?;
        off.refill(tpl.clone());
        on.refill(tpl.clone());
        measure(node, [&off, &on], &tpl, blocks, json).await
    }
    .await;
    off.drain().await;
    on.drain().await;
    let (arms, rejected, tpl) = outcome?;
    report(what, &arms, rejected, blocks, &tpl, node, json);
    Ok(ExitCode::SUCCESS)
}

type Measured = ([Arm; 2], usize, Template);

async fn measure(
    node: &Arc<Node>,
    pools: [&Arc<VmmPool>; 2],
    tpl: &Template,
    blocks: usize,
    quiet: bool,
) -> anyhow::Result<Measured> {
    let mut arms: [Arm; 2] = Default::default();
    let mut rejected = 0;
    let mut rng = rand::thread_rng();
    for block in 0..blocks {
        let mut order = [0usize, 1];
        order.shuffle(&mut rng);
        if !quiet {
            let names: Vec<&str> = order.iter().map(|&i| ["off", "on"][i]).collect();
            eprintln!("block {}/{blocks}: {}", block + 1, names.join(", "));
        }
        for i in order {
            let mut tries = 0;
            let timings = loop {
                tries += 1;
                if tries > MAX_TRIES {
                    bail!("memory file would not stay resident ({MAX_TRIES} tries)");
                }
                match one_trial(node, pools[i], tpl).await? {
                    Some(t) => break t,
                    None => rejected += 1,
                }
            };
            arms[i].ms.push(timings.total_ms);
            arms[i].timings.push(timings);
        }
    }
    Ok((arms, rejected, tpl.clone()))
}

/// A baseline resume, then the timed one with the memory file resident;
/// `None` when the residency check failed.
pub(super) async fn one_trial(
    node: &Arc<Node>,
    pool: &Arc<VmmPool>,
    tpl: &Template,
) -> anyhow::Result<Option<StageTimings>> {
    let baseline = resume_once(node, pool, tpl)
        .await
        .context("baseline resume")?;
    stop(node, baseline).await;
    if pool.options().size > 0 {
        // The next pooled VMM's spawn is not part of the timed resume.
        pool.wait_ready(&tpl.record.name, super::POOL_WAIT).await?;
    }
    let memory = tpl.memory_path();
    make_warm(&memory)?;
    let (resident, pages) = residency(&memory)?;
    if resident != pages {
        eprintln!("rejected: {resident}/{pages} pages resident");
        return Ok(None);
    }
    let resumed = resume_once(node, pool, tpl).await.context("timed resume")?;
    let timings = resumed.timings.clone();
    stop(node, resumed).await;
    Ok(Some(timings))
}

/// The part of a resume the host spends: everything but the guest's stages.
pub(super) fn host_ms(t: &StageTimings) -> f64 {
    t.total_ms - t.get(Stage::GuestHealth) - t.get(Stage::AgentInit)
}

fn report(
    what: Compare,
    arms: &[Arm; 2],
    rejected: usize,
    blocks: usize,
    tpl: &Template,
    node: &Node,
    json: bool,
) {
    let [off, on] = arms.each_ref().map(|a| summarize(&a.ms));
    let diffs: Vec<f64> = arms[1]
        .ms
        .iter()
        .zip(&arms[0].ms)
        .map(|(b, a)| b - a)
        .collect();
    let p = paired(&diffs);
    // The mechanisms compared act on the host's stages; the guest's (health,
    // init) only add TCG noise to the total.
    let host = |a: &Arm| -> Vec<f64> { a.timings.iter().map(host_ms).collect() };
    let (host_off, host_on) = (host(&arms[0]), host(&arms[1]));
    let host_diffs: Vec<f64> = host_on.iter().zip(&host_off).map(|(b, a)| b - a).collect();
    let hp = paired(&host_diffs);
    let (ho, hn) = (summarize(&host_off), summarize(&host_on));
    if json {
        let cond =
            |s: &crate::stats::Summary| json!({"mean_ms": s.mean, "median_ms": s.p50, "n": s.n});
        println!(
            "{}",
            json!({
                "compare": label(what),
                "conditions": {"off": cond(&off), "on": cond(&on)},
                "paired": {
                    "on_minus_off": {"mean_ms": p.mean, "ci95_ms": [p.lo, p.hi]},
                    "host_side_on_minus_off": {"mean_ms": hp.mean, "ci95_ms": [hp.lo, hp.hi]},
                },
            })
        );
        return;
    }
    let vmm = node.vmm.info();
    println!(
        "siesta bench resume --compare {}: template {}, {} {} ({}), {blocks} blocks, {rejected} trials rejected and redone, memory file resident, prefetch off\n",
        label(what),
        tpl.record.name,
        vmm.kind,
        vmm.version,
        vmm.accel.as_str()
    );
    println!("| Condition | n | Mean | Median | Min | Max |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, s) in [("off", off), ("on", on)] {
        println!(
            "| {name} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
            s.n, s.mean, s.p50, s.min, s.max
        );
    }
    println!(
        "\n| Paired (n = {}) | Mean difference | 95% interval | on / off (means) |",
        p.n
    );
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| on minus off, total | {:+.1} ms | [{:+.1}, {:+.1}] ms | {:.3} |",
        p.mean,
        p.lo,
        p.hi,
        on.mean / off.mean
    );
    println!(
        "| on minus off, host side (total - guest_health - agent_init) | {:+.2} ms | [{:+.2}, {:+.2}] ms | {:.3} ({:.2} / {:.2} ms) |",
        hp.mean,
        hp.lo,
        hp.hi,
        hn.mean / ho.mean,
        hn.mean,
        ho.mean
    );
    let columns: Vec<(&str, Vec<&StageTimings>)> = [("off", &arms[0]), ("on", &arms[1])]
        .into_iter()
        .map(|(n, a)| (n, a.timings.iter().collect()))
        .collect();
    stage_table(&columns);
}
