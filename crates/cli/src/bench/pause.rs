//! `siesta bench pause`: pause time and stored bytes by how much guest RAM
//! was written, saving only the changed pages against saving all of RAM,
//! side by side in one run.
//!
//! Each sample is a pair of fresh sandboxes of the template: each writes
//! `dirty` MiB of random data into a guest tmpfs (RAM that cannot be
//! evicted), then one is paused saving changed pages and the other saving
//! all of RAM (which goes first alternates between samples). Both are then
//! resumed, their data checked against its checksum, and killed.
//!
//! `--compare write-behind` pairs two changed-pages pauses instead: one
//! starting the state file's writeback as it is written (the default), one
//! leaving it all to the fsync at the end.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::ValueEnum;
use serde_json::json;
use siesta_sandbox::memory_save::SaveMemory;
use siesta_sandbox::SandboxManager;

use super::session::{create_pooled, guest_root, Session};
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
    /// A second template measured in the same run, interleaved with the
    /// first (e.g. one built with other kernel arguments).
    #[arg(long)]
    against: Option<String>,
    /// Delete what was written before pausing: the guest has freed that
    /// memory, and a pause that returns freed memory stores none of it.
    #[arg(long)]
    free: bool,
    /// What the changed-pages pause is paired with: a save of all of RAM,
    /// or the same pause with its writeback left to the final fsync.
    #[arg(long, value_enum, default_value_t = Compare::Full)]
    compare: Compare,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Compare {
    /// All of RAM saved (the way every pause saved before).
    Full,
    /// Changed pages, with the file's writeback started only by its fsync.
    WriteBehind,
}

impl Compare {
    /// How the other pause of each pair saves.
    fn other(self) -> SaveMemory {
        match self {
            Compare::Full => SaveMemory::Full,
            Compare::WriteBehind => SaveMemory::ChangedSyncAtEnd,
        }
    }

    /// Column label of the other pause.
    fn label(self) -> &'static str {
        match self {
            Compare::Full => "all of RAM",
            Compare::WriteBehind => "changed, fsync at end",
        }
    }
}

/// One pause and the resume after it.
#[derive(Debug, Clone, Copy)]
struct Measured {
    /// The guest command that writes (and with `--free` deletes) the data.
    write_ms: f64,
    pause_ms: f64,
    /// Of the pause, waiting for the state file's fsync.
    sync_ms: f64,
    stored_mib: f64,
    resume_ms: f64,
}

pub async fn run(args: PauseArgs) -> anyhow::Result<ExitCode> {
    if args.samples == 0 || args.dirty_mib.is_empty() {
        bail!("give at least one sample and one --dirty-mib size");
    }
    let session = Session::start().await?;
    let outcome = Box::pin(measure_all(&session.manager, &args)).await;
    session.close().await;
    let rows = outcome?;
    report(&args, &rows);
    Ok(ExitCode::SUCCESS)
}

/// One template and size: changed-pages pauses, then the other kind
/// (`--compare`).
struct Row {
    template: String,
    dirty: u64,
    changed: Vec<Measured>,
    other: Vec<Measured>,
}

impl PauseArgs {
    fn templates(&self) -> Vec<&str> {
        std::iter::once(self.template.as_str())
            .chain(self.against.as_deref())
            .collect()
    }
}

async fn measure_all(manager: &Arc<SandboxManager>, args: &PauseArgs) -> anyhow::Result<Vec<Row>> {
    let templates = args.templates();
    for t in &templates {
        manager.warm(t)?;
    }
    let mut rows = Vec::new();
    for &dirty in &args.dirty_mib {
        let mut these: Vec<Row> = templates
            .iter()
            .map(|t| Row {
                template: t.to_string(),
                dirty,
                changed: Vec::new(),
                other: Vec::new(),
            })
            .collect();
        for i in 0..args.samples {
            // Which template, and which way of saving, goes first alternates.
            let other = args.compare.other();
            let order = if i % 2 == 0 {
                [SaveMemory::Changed, other]
            } else {
                [other, SaveMemory::Changed]
            };
            for k in 0..these.len() {
                let row = &mut these[(k + i) % templates.len()];
                for how in order {
                    let m = measure(manager, args, &row.template, dirty, how)
                        .await
                        .with_context(|| {
                            format!("{how:?} pause of {} with {dirty} MiB written", row.template)
                        })?;
                    if how == SaveMemory::Changed {
                        row.changed.push(m);
                    } else {
                        row.other.push(m);
                    }
                }
            }
        }
        rows.extend(these);
    }
    Ok(rows)
}

/// A fresh sandbox writes `dirty` MiB (then deletes it with `--free`), is
/// paused as `how` says, resumed and checked, and killed.
async fn measure(
    manager: &Arc<SandboxManager>,
    args: &PauseArgs,
    template: &str,
    dirty: u64,
    how: SaveMemory,
) -> anyhow::Result<Measured> {
    let info = create_pooled(manager, template).await?;
    let id = info.id.clone();
    let result = async {
        let mut write = format!(
            "mkdir -p /run/dirty && mount -t tmpfs -o size={}m tmpfs /run/dirty && \
             head -c {dirty}M /dev/urandom > /run/dirty/data && md5sum /run/dirty/data",
            dirty + 16
        );
        // What is checked after the resume: the data, or that it is gone.
        let check = if args.free {
            write.push_str(" >/dev/null && rm /run/dirty/data && sync && ls /run/dirty");
            "ls /run/dirty"
        } else {
            "md5sum /run/dirty/data"
        };
        let t0 = Instant::now();
        let before = guest_root(manager, &id, &write).await?;
        let write_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t0 = Instant::now();
        let report = manager.pause_with(&id, how).await?;
        let pause_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t0 = Instant::now();
        manager.resume(&id).await?;
        let resume_ms = t0.elapsed().as_secs_f64() * 1e3;
        let after = guest_root(manager, &id, check).await?;
        if after != before {
            bail!("the guest's files changed over the pause: {before:?} then {after:?}");
        }
        Ok(Measured {
            write_ms,
            pause_ms,
            sync_ms: report.sync.as_secs_f64() * 1e3,
            stored_mib: report.state_bytes as f64 / (1 << 20) as f64,
            resume_ms,
        })
    }
    .await;
    manager.kill(&id).await?;
    result
}

fn p50(v: &[Measured], f: impl Fn(&Measured) -> f64) -> f64 {
    summarize(&v.iter().map(f).collect::<Vec<_>>()).p50
}

fn report(args: &PauseArgs, rows: &[Row]) {
    if args.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                let (c, f) = (&r.changed, &r.other);
                let mut row = json!({
                    "template": r.template,
                    "dirty_mib": r.dirty,
                    "write_ms": p50(c, |m| m.write_ms),
                    "pause_ms": p50(c, |m| m.pause_ms),
                    "sync_ms": p50(c, |m| m.sync_ms),
                    "stored_mib": p50(c, |m| m.stored_mib),
                    "resume_ms": p50(c, |m| m.resume_ms),
                    "samples": c.len(),
                });
                let (pause_key, prefix) = match args.compare {
                    Compare::Full => ("full_save_ms", "full"),
                    Compare::WriteBehind => ("at_end_pause_ms", "at_end"),
                };
                row[pause_key] = json!(p50(f, |m| m.pause_ms));
                row[format!("{prefix}_sync_ms")] = json!(p50(f, |m| m.sync_ms));
                row[format!("{prefix}_stored_mib")] = json!(p50(f, |m| m.stored_mib));
                row[format!("{prefix}_resume_ms")] = json!(p50(f, |m| m.resume_ms));
                row
            })
            .collect();
        println!(
            "{}",
            json!({
                "template": args.template,
                "free": args.free,
                "compare": args.compare.to_possible_value().map(|v| v.get_name().to_string()),
                "rows": rows,
            })
        );
        return;
    }
    println!(
        "siesta bench pause: template {}, {} pairs per size (p50 of each){}\n",
        args.templates().join(" and "),
        args.samples,
        if args.free {
            "; what was written is deleted before the pause"
        } else {
            ""
        }
    );
    let other = args.compare.label();
    println!("| Template | Written MiB | Guest write | Pause, changed pages | fsync | Stored | Pause, {other} | fsync | Stored | Pause ratio | Resume after changed | Resume after {other} |");
    println!(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for r in rows {
        let (c, f) = (&r.changed, &r.other);
        let (pc, pf) = (p50(c, |m| m.pause_ms), p50(f, |m| m.pause_ms));
        println!(
            "| {} | {} | {:.1} ms | {pc:.1} ms | {:.1} ms | {:.1} MiB | {pf:.1} ms | {:.1} ms | {:.1} MiB | {:.3} (1/{:.1}) | {:.1} ms | {:.1} ms |",
            r.template,
            r.dirty,
            p50(c, |m| m.write_ms),
            p50(c, |m| m.sync_ms),
            p50(c, |m| m.stored_mib),
            p50(f, |m| m.sync_ms),
            p50(f, |m| m.stored_mib),
            pc / pf,
            pf / pc,
            p50(c, |m| m.resume_ms),
            p50(f, |m| m.resume_ms),
        );
    }
}
