//! `siesta bench pause`: pause time and stored bytes by how much guest RAM
//! was written, saving only the changed pages against saving all of RAM,
//! side by side in one run.
//!
//! Each sample is a pair of fresh sandboxes of the template: each writes
//! `dirty` MiB of random data into a guest tmpfs (RAM that cannot be
//! evicted), then one is paused saving changed pages and the other saving
//! all of RAM (which goes first alternates between samples). Both are then
//! resumed, their data checked against its checksum, and killed.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::json;
use siesta_sandbox::memory_save::SaveMemory;
use siesta_sandbox::SandboxManager;

use super::session::{create_pooled, Session};
use crate::stats::summarize;

#[derive(clap::Args)]
pub struct PauseArgs {
    /// MiB the guest writes before each pause, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,16,64,256")]
    dirty_mib: Vec<u64>,
    /// Pairs of pauses per size.
    #[arg(long, default_value_t = 3)]
    samples: usize,
    #[arg(long, default_value = "base")]
    template: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// One pause and the resume after it.
#[derive(Debug, Clone, Copy)]
struct Measured {
    pause_ms: f64,
    stored_mib: f64,
    resume_ms: f64,
}

pub async fn run(args: PauseArgs) -> anyhow::Result<ExitCode> {
    if args.samples == 0 || args.dirty_mib.is_empty() {
        bail!("give at least one sample and one --dirty-mib size");
    }
    let session = Session::start().await?;
    let outcome = measure_all(&session.manager, &args).await;
    session.close().await;
    let rows = outcome?;
    report(&args, &rows);
    Ok(ExitCode::SUCCESS)
}

type Row = (u64, Vec<Measured>, Vec<Measured>);

async fn measure_all(manager: &SandboxManager, args: &PauseArgs) -> anyhow::Result<Vec<Row>> {
    manager.warm(&args.template)?;
    let mut rows = Vec::new();
    for &dirty in &args.dirty_mib {
        let (mut changed, mut full) = (Vec::new(), Vec::new());
        for i in 0..args.samples {
            let order = if i % 2 == 0 {
                [SaveMemory::Changed, SaveMemory::Full]
            } else {
                [SaveMemory::Full, SaveMemory::Changed]
            };
            for how in order {
                let m = measure(manager, &args.template, dirty, how)
                    .await
                    .with_context(|| format!("{how:?} pause with {dirty} MiB written"))?;
                match how {
                    SaveMemory::Changed => changed.push(m),
                    SaveMemory::Full => full.push(m),
                }
            }
        }
        rows.push((dirty, changed, full));
    }
    Ok(rows)
}

/// A fresh sandbox writes `dirty` MiB, is paused as `how` says, resumed and
/// checked, and killed.
async fn measure(
    manager: &SandboxManager,
    template: &str,
    dirty: u64,
    how: SaveMemory,
) -> anyhow::Result<Measured> {
    let info = create_pooled(manager, template).await?;
    let id = info.id.clone();
    let result = async {
        let write = format!(
            "mkdir -p /run/dirty && mount -t tmpfs -o size={}m tmpfs /run/dirty && \
             head -c {dirty}M /dev/urandom > /run/dirty/data && md5sum /run/dirty/data",
            dirty + 16
        );
        let before = guest(manager, &id, &write).await?;
        let t0 = Instant::now();
        let report = manager.pause_with(&id, how).await?;
        let pause_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t0 = Instant::now();
        manager.resume(&id).await?;
        let resume_ms = t0.elapsed().as_secs_f64() * 1e3;
        let after = guest(manager, &id, "md5sum /run/dirty/data").await?;
        if after != before {
            bail!("the data written before the pause changed: {before:?} then {after:?}");
        }
        Ok(Measured {
            pause_ms,
            stored_mib: report.state_bytes as f64 / (1 << 20) as f64,
            resume_ms,
        })
    }
    .await;
    manager.kill(&id).await?;
    result
}

/// Runs `cmd` in the guest as root; its stdout, or an error with stderr.
async fn guest(manager: &SandboxManager, id: &str, cmd: &str) -> anyhow::Result<String> {
    let out = manager.exec(id, cmd, Some("root"), |_, _| {}).await?;
    if out.exit_code != 0 {
        bail!(
            "`{cmd}` exited {}: {}",
            out.exit_code,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn p50(v: &[Measured], f: impl Fn(&Measured) -> f64) -> f64 {
    summarize(&v.iter().map(f).collect::<Vec<_>>()).p50
}

fn report(args: &PauseArgs, rows: &[Row]) {
    if args.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(dirty, c, f)| {
                json!({
                    "dirty_mib": dirty,
                    "pause_ms": p50(c, |m| m.pause_ms),
                    "stored_mib": p50(c, |m| m.stored_mib),
                    "resume_ms": p50(c, |m| m.resume_ms),
                    "full_save_ms": p50(f, |m| m.pause_ms),
                    "full_stored_mib": p50(f, |m| m.stored_mib),
                    "full_resume_ms": p50(f, |m| m.resume_ms),
                    "samples": c.len(),
                })
            })
            .collect();
        println!("{}", json!({ "template": args.template, "rows": rows }));
        return;
    }
    println!(
        "siesta bench pause: template {}, {} pairs per size (p50 of each)\n",
        args.template, args.samples
    );
    println!("| Written MiB | Pause, changed pages | Stored | Pause, all of RAM | Stored | Pause ratio | Resume after changed | Resume after all |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (dirty, c, f) in rows {
        let (pc, pf) = (p50(c, |m| m.pause_ms), p50(f, |m| m.pause_ms));
        println!(
            "| {dirty} | {pc:.1} ms | {:.1} MiB | {pf:.1} ms | {:.1} MiB | {:.3} (1/{:.1}) | {:.1} ms | {:.1} ms |",
            p50(c, |m| m.stored_mib),
            p50(f, |m| m.stored_mib),
            pc / pf,
            pf / pc,
            p50(c, |m| m.resume_ms),
            p50(f, |m| m.resume_ms),
        );
    }
}
