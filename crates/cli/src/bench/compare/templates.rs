//! `--compare templates --template A --against B`: resumes of two templates
//! side by side, say `base` and a template built from an OCI image with
//! python3 and node. Each block resumes both in a fresh random order; each
//! timed resume follows an untimed baseline through the same pool and runs
//! with its memory file resident (as `followup.rs` does), prefetch off. So
//! what differs is the template: its memory image and devices.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use rand::seq::SliceRandom;
use serde_json::json;
use siesta_sandbox::layout::Layout;
use siesta_sandbox::pool::VmmPool;
use siesta_sandbox::stages::StageTimings;
use siesta_sandbox::Node;
use siesta_template::Template;

use super::followup::{host_ms, one_trial};
use super::{ready_template, stage_table, warm_pool, MAX_TRIES};
use crate::bench::paired::paired;
use crate::stats::summarize;

pub async fn run(
    node: &Arc<Node>,
    layout: &Layout,
    names: [&str; 2],
    blocks: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let pools = [0, 1].map(|_| VmmPool::with_options(Arc::clone(node), warm_pool()));
    node.prefetch.set_enabled(false);
    let outcome = async {
        let a = ready_template(node, layout, names[0]).await?;
        let b = ready_template(node, layout, names[1]).await?;
        pools[0].refill(a.clone());
        pools[1].refill(b.clone());
        measure(node, &pools, [&a, &b], blocks, json).await
    }
    .await;
    for p in &pools {
        p.drain().await;
    }
    let timings = outcome?;
    report(names, &timings, blocks, node, json);
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    node: &Arc<Node>,
    pools: &[Arc<VmmPool>; 2],
    tpls: [&Template; 2],
    blocks: usize,
    quiet: bool,
) -> anyhow::Result<[Vec<StageTimings>; 2]> {
    let mut out: [Vec<StageTimings>; 2] = Default::default();
    let mut rng = rand::thread_rng();
    for block in 0..blocks {
        let mut order = [0usize, 1];
        order.shuffle(&mut rng);
        if !quiet {
            let names: Vec<&str> = order
                .iter()
                .map(|&i| tpls[i].record.name.as_str())
                .collect();
            eprintln!("block {}/{blocks}: {}", block + 1, names.join(", "));
        }
        for i in order {
            let mut tries = 0;
            let t = loop {
                tries += 1;
                if tries > MAX_TRIES {
                    bail!("memory file would not stay resident ({MAX_TRIES} tries)");
                }
                if let Some(t) = one_trial(node, &pools[i], tpls[i]).await? {
                    break t;
                }
            };
            out[i].push(t);
        }
    }
    Ok(out)
}

fn report(names: [&str; 2], t: &[Vec<StageTimings>; 2], blocks: usize, node: &Node, json: bool) {
    let totals = t
        .each_ref()
        .map(|v| v.iter().map(|x| x.total_ms).collect::<Vec<_>>());
    let hosts = t
        .each_ref()
        .map(|v| v.iter().map(host_ms).collect::<Vec<_>>());
    let [sa, sb] = totals.each_ref().map(|v| summarize(v));
    let [ha, hb] = hosts.each_ref().map(|v| summarize(v));
    let diffs: Vec<f64> = totals[1]
        .iter()
        .zip(&totals[0])
        .map(|(b, a)| b - a)
        .collect();
    let p = paired(&diffs);
    if json {
        let cond = |s: &crate::stats::Summary, h: &crate::stats::Summary| json!({"median_ms": s.p50, "mean_ms": s.mean, "host_side_median_ms": h.p50, "n": s.n});
        println!(
            "{}",
            json!({
                "compare": "templates",
                "templates": {names[0]: cond(&sa, &ha), names[1]: cond(&sb, &hb)},
                "median_ratio": sb.p50 / sa.p50,
                "paired": {"second_minus_first": {"mean_ms": p.mean, "ci95_ms": [p.lo, p.hi]}},
            })
        );
        return;
    }
    let vmm = node.vmm.info();
    println!(
        "siesta bench resume --compare templates: {} against {}, {} {} ({}), {blocks} blocks, memory file resident, prefetch off\n",
        names[0], names[1], vmm.kind, vmm.version, vmm.accel.as_str()
    );
    println!("| Template | n | Median | Mean | Min | Max | Host side median |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, s, h) in [(names[0], &sa, &ha), (names[1], &sb, &hb)] {
        println!(
            "| {name} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} ms |",
            s.n, s.p50, s.mean, s.min, s.max, h.p50
        );
    }
    println!(
        "\n| {} / {} | median ratio {:.3} | paired mean difference {:+.1} ms, 95% [{:+.1}, {:+.1}] |",
        names[1], names[0], sb.p50 / sa.p50, p.mean, p.lo, p.hi
    );
    let columns: Vec<(&str, Vec<&StageTimings>)> = vec![
        (names[0], t[0].iter().collect()),
        (names[1], t[1].iter().collect()),
    ];
    stage_table(&columns);
}
