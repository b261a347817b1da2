//! `siesta bench fork --n N`: time until all N children of one running
//! sandbox are ready, against one child (the same capture and resume path)
//! and a resume from the template, side by side in one run.
//!
//! Each sample creates a source from the template and writes a marker file,
//! forks it once with one child and once with N, checks that every child
//! sees the marker, and kills them all.
//!
//! `--compare refill` runs each sample three times, on nodes whose VMM pool
//! replaces a VMM a resume took at once, once that resume is ready, and
//! once no resume is in flight (`Tuning::refill_after_ready` and
//! `Tuning::refill_when_quiet`, both on in a server), in an order that rotates per sample; with a
//! pool as large as the fork (`--pool-size N`) every child takes a waiting
//! VMM, and the refills are what differs.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::json;
use siesta_host::Tuning;
use siesta_sandbox::{NodeConfig, SandboxManager};

use super::session::{create_pooled, guest_root, Session};
use crate::stats::summarize;

#[derive(clap::Args)]
pub struct ForkArgs {
    /// Children per fork.
    #[arg(long, default_value_t = 8)]
    n: u32,
    /// Sources, each forked once with one child and once with N.
    #[arg(long, default_value_t = 3)]
    samples: usize,
    #[arg(long, default_value = "base")]
    template: String,
    /// VMMs the pool keeps waiting (default: the configured `pool_size`);
    /// the node keeps this many network slots and two more ready.
    #[arg(long)]
    pool_size: Option<usize>,
    /// Run every sample under two settings, side by side.
    #[arg(long, value_enum)]
    compare: Option<ForkCompare>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ForkCompare {
    /// The pool refilled at once, after the resume that took a VMM, and
    /// once no resume is in flight.
    Refill,
}

#[derive(Default)]
struct Measured {
    fork_ms: Vec<f64>,
    single_resume_ms: Vec<f64>,
    template_resume_ms: Vec<f64>,
    /// Share of all the host's cores busy during each fork of N: near 1.0,
    /// the children wait for CPU, not for each other.
    fork_cpu_busy: Vec<f64>,
    /// Each child's own resume (its stages' wall time) in the forks of N.
    child_resume_ms: Vec<f64>,
}

/// What one fork took.
struct Forked {
    ms: f64,
    cpu_busy: f64,
    child_resume_ms: Vec<f64>,
}

pub async fn run(args: ForkArgs) -> anyhow::Result<ExitCode> {
    if args.samples == 0 || args.n == 0 {
        bail!("give at least one sample and --n of 1 or more");
    }
    if args.compare.is_none() {
        let session = Session::start_with(config(&args)?, Tuning::default(), None).await?;
        let outcome = measure_all(&session.manager, &args).await;
        session.close().await;
        report(&args, &outcome?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut arms: [Measured; 3] = Default::default();
    for i in 0..args.samples {
        for k in (0..3).map(|j| (i + j) % 3) {
            let (after_ready, when_quiet) = REFILLS[k].1;
            let tuning = Tuning {
                refill_after_ready: after_ready,
                refill_when_quiet: when_quiet,
                ..Tuning::default()
            };
            let session = Session::start_with(config(&args)?, tuning, None).await?;
            let outcome = measure_sample(&session.manager, &args, i, &mut arms[k]).await;
            session.close().await;
            outcome?;
        }
    }
    for ((label, _), m) in REFILLS.iter().zip(&arms) {
        if !args.json {
            println!("{label}:");
        }
        report(&args, m);
    }
    Ok(ExitCode::SUCCESS)
}

/// The arms of `--compare refill`: `(refill_after_ready, refill_when_quiet)`.
const REFILLS: [(&str, (bool, bool)); 3] = [
    ("refill at once", (false, false)),
    (
        "refill once the resume that took the VMM is ready",
        (true, false),
    ),
    ("refill once no resume is in flight", (true, true)),
];

/// The bench node's configuration with `--pool-size`.
fn config(args: &ForkArgs) -> anyhow::Result<NodeConfig> {
    let mut config = super::session::bench_config("n")?;
    if let Some(size) = args.pool_size {
        config.pool_size = size;
        config.warm_slots = size + 2;
    }
    Ok(config)
}

async fn measure_all(manager: &Arc<SandboxManager>, args: &ForkArgs) -> anyhow::Result<Measured> {
    let mut m = Measured::default();
    for i in 0..args.samples {
        measure_sample(manager, args, i, &mut m).await?;
    }
    Ok(m)
}

/// Sample `i`: a source, a fork of 1 and a fork of N, added to `m`.
async fn measure_sample(
    manager: &Arc<SandboxManager>,
    args: &ForkArgs,
    i: usize,
    m: &mut Measured,
) -> anyhow::Result<()> {
    manager.warm(&args.template)?;
    {
        let source = create_pooled(manager, &args.template).await?;
        m.template_resume_ms
            .push(source.timings.as_ref().map_or(0.0, |t| t.total_ms));
        let marker = format!("sample-{i}-{}", source.id);
        let result = async {
            guest_root(manager, &source.id, &format!("echo {marker} > /tmp/marker")).await?;
            m.single_resume_ms
                .push(fork_and_check(manager, &source.id, 1, &marker).await?.ms);
            // Every sample's fork of N starts with the pool as full as it
            // keeps itself.
            manager
                .wait_pool_full(&args.template, std::time::Duration::from_secs(120))
                .await?;
            let forked = fork_and_check(manager, &source.id, args.n, &marker).await?;
            m.fork_ms.push(forked.ms);
            m.fork_cpu_busy.push(forked.cpu_busy);
            m.child_resume_ms.extend(forked.child_resume_ms);
            anyhow::Ok(())
        }
        .await;
        manager.kill(&source.id).await?;
        result.with_context(|| format!("sample {} of {}", i + 1, args.samples))?;
    }
    Ok(())
}

/// Forks `n` children of `source`: the time until all were ready, after
/// checking each holds `marker` (and killing them).
async fn fork_and_check(
    manager: &Arc<SandboxManager>,
    source: &str,
    n: u32,
    marker: &str,
) -> anyhow::Result<Forked> {
    let cpu_before = CpuTimes::read()?;
    let t0 = Instant::now();
    let children = manager.fork(source, n, None).await?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let cpu_busy = CpuTimes::read()?.busy_since(&cpu_before);
    let mut ids = Vec::new();
    let mut child_resume_ms = Vec::new();
    let mut first_error = None;
    for child in children {
        match child {
            Ok(info) => {
                child_resume_ms.extend(info.timings.as_ref().map(|t| t.total_ms));
                ids.push(info.id);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let mut checked = Ok(());
    for id in &ids {
        if checked.is_ok() {
            checked = match guest_root(manager, id, "cat /tmp/marker").await {
                Ok(got) if got.trim() == marker => Ok(()),
                Ok(got) => Err(anyhow::anyhow!(
                    "child {id} has marker {got:?}, not {marker:?}"
                )),
                Err(e) => Err(e),
            };
        }
        manager.kill(id).await?;
    }
    if let Some(e) = first_error {
        bail!("a child of {source} failed: {e}");
    }
    checked?;
    Ok(Forked {
        ms,
        cpu_busy,
        child_resume_ms,
    })
}

/// The host's CPU time so far, from the `cpu` line of `/proc/stat` (in
/// ticks, all cores together).
struct CpuTimes {
    total: u64,
    idle: u64,
}

impl CpuTimes {
    fn read() -> anyhow::Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let line = stat.lines().next().unwrap_or_default();
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        if ticks.len() < 5 || !line.starts_with("cpu ") {
            bail!("/proc/stat starts with {line:?}, not the cpu line");
        }
        Ok(Self {
            // user nice system idle iowait irq softirq steal (guest time is
            // inside user already).
            total: ticks.iter().take(8).sum(),
            idle: ticks[3] + ticks[4],
        })
    }

    /// The share of all cores that was busy since `before` (0 to 1).
    fn busy_since(&self, before: &CpuTimes) -> f64 {
        let total = self.total.saturating_sub(before.total);
        let idle = self.idle.saturating_sub(before.idle);
        if total == 0 {
            return 0.0;
        }
        1.0 - idle as f64 / total as f64
    }
}

fn report(args: &ForkArgs, m: &Measured) {
    let fork = summarize(&m.fork_ms);
    let single = summarize(&m.single_resume_ms);
    let template = summarize(&m.template_resume_ms);
    let busy = summarize(&m.fork_cpu_busy);
    let child = summarize(&m.child_resume_ms);
    if args.json {
        let out = json!({
            "n": args.n,
            "samples": fork.n,
            "fork_ms": fork.p50,
            "single_resume_ms": single.p50,
            "template_resume_ms": template.p50,
            "fork_over_single": fork.p50 / single.p50,
            "fork_cpu_busy": busy.p50,
            "child_resume_ms": child.p50,
        });
        println!("{out}");
        return;
    }
    println!(
        "siesta bench fork: template {}, {} children, {} samples (p50; capture included in both forks)\n",
        args.template, args.n, fork.n
    );
    println!("| Measure | p50 | Min | Max |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, s) in [
        (format!("fork of {} until all ready", args.n), fork),
        ("fork of 1 (one capture + one resume)".into(), single),
        ("resume from the template".into(), template),
    ] {
        println!(
            "| {name} | {:.1} ms | {:.1} ms | {:.1} ms |",
            s.p50, s.min, s.max
        );
    }
    println!(
        "\nfork of {} / fork of 1: {:.2}; per child: {:.1} ms",
        args.n,
        fork.p50 / single.p50,
        fork.p50 / f64::from(args.n)
    );
    println!(
        "each child's own resume in the forks of {}: p50 {:.1} ms (min {:.1}, max {:.1}); host cores busy during them: {:.0}% of {} (p50)",
        args.n,
        child.p50,
        child.min,
        child.max,
        busy.p50 * 100.0,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}
