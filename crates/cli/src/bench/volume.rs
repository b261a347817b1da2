//! `siesta bench volume`: file I/O through a volume mount (NFSv3 from the
//! host, inside the sandbox's namespace) against the sandbox's own disk
//! (virtio-blk on a qcow2 overlay), in one sandbox, the two interleaved
//! sample by sample so both see the same machine.
//!
//! Times are taken in the guest around each command. Writes end with
//! `fsync` on both (so both are on the host's disk); reads start with the
//! guest's page cache dropped.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use serde_json::json;
use siesta_sandbox::volumes::VolumeMount;
use siesta_sandbox::{CreateRequest, SandboxManager};

use super::session::{guest_root, Session};
use crate::stats::summarize;

const MOUNT: &str = "/mnt/bench";
const DISK: &str = "/home/user/bench";

#[derive(clap::Args)]
pub struct VolumeArgs {
    /// MiB written and read sequentially per sample.
    #[arg(long, default_value_t = 64)]
    mib: u32,
    /// Small files created per sample.
    #[arg(long, default_value_t = 1000)]
    files: u32,
    #[arg(long, default_value_t = 3)]
    samples: usize,
    #[arg(long, default_value = "base")]
    template: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// One measure on both targets: seconds per sample.
#[derive(Default)]
struct Pair {
    mount: Vec<f64>,
    disk: Vec<f64>,
}

#[derive(Default)]
struct Measured {
    write: Pair,
    read: Pair,
    small: Pair,
}

pub async fn run(args: VolumeArgs) -> anyhow::Result<ExitCode> {
    if args.samples == 0 || args.mib == 0 || args.files == 0 {
        bail!("give at least one sample, --mib and --files of 1 or more");
    }
    // A scratch registry of its own, removed at the end.
    let home = siesta_sandbox::config::home_from_env();
    let dir = home.join(format!("cache/bench-volumes-{}", std::process::id()));
    let volumes = Arc::new(siesta_volume::Volumes::open(&dir, 64 * 1024)?);
    let outcome = async {
        let volume = volumes.create("bench", None)?;
        let session = Session::start_with_volumes(Some(volumes.clone())).await?;
        let measured = measure_all(&session.manager, &args, &volume).await;
        session.close().await;
        measured
    }
    .await;
    drop(volumes);
    let _ = std::fs::remove_dir_all(&dir);
    report(&args, &outcome?);
    Ok(ExitCode::SUCCESS)
}

async fn measure_all(
    manager: &Arc<SandboxManager>,
    args: &VolumeArgs,
    volume: &siesta_volume::VolumeRecord,
) -> anyhow::Result<Measured> {
    manager.warm(&args.template)?;
    manager
        .wait_pool_ready(&args.template, std::time::Duration::from_secs(120))
        .await?;
    let sandbox = manager
        .create(CreateRequest {
            template: args.template.clone(),
            volume_mounts: vec![VolumeMount {
                volume_id: volume.id.clone(),
                name: volume.name.clone(),
                path: MOUNT.into(),
            }],
            ..Default::default()
        })
        .await?;
    let result = async {
        let mut m = Measured::default();
        for i in 0..args.samples {
            // Alternate which goes first, so neither always runs warm.
            let order = if i % 2 == 0 {
                [MOUNT, DISK]
            } else {
                [DISK, MOUNT]
            };
            for target in order {
                let (w, r, s) = sample(manager, &sandbox.id, target, args)
                    .await
                    .with_context(|| format!("sample {} on {target}", i + 1))?;
                let pair = |p: &mut Pair, v| {
                    if target == MOUNT {
                        p.mount.push(v)
                    } else {
                        p.disk.push(v)
                    }
                };
                pair(&mut m.write, w);
                pair(&mut m.read, r);
                pair(&mut m.small, s);
            }
        }
        anyhow::Ok(m)
    }
    .await;
    manager.kill(&sandbox.id).await?;
    result
}

/// Seconds for the sequential write, the sequential read and the small files.
async fn sample(
    manager: &Arc<SandboxManager>,
    id: &str,
    dir: &str,
    args: &VolumeArgs,
) -> anyhow::Result<(f64, f64, f64)> {
    let timed = |body: String| {
        format!("mkdir -p {dir} && s=$(date +%s%N) && {body} && e=$(date +%s%N) && echo $((e-s))")
    };
    let write = timed(format!(
        "dd if=/dev/zero of={dir}/seq.bin bs=1M count={} conv=fsync status=none",
        args.mib
    ));
    let read = format!(
        "sync && echo 3 > /proc/sys/vm/drop_caches && {}",
        timed(format!(
            "dd if={dir}/seq.bin of=/dev/null bs=1M status=none"
        ))
    );
    let small = timed(format!(
        "mkdir {dir}/small && for i in $(seq {}); do echo $i > {dir}/small/f$i; done && sync",
        args.files
    ));
    let w = secs(manager, id, &write).await?;
    let r = secs(manager, id, &read).await?;
    let s = secs(manager, id, &small).await?;
    secs(
        manager,
        id,
        &format!("rm -rf {dir}/small {dir}/seq.bin && echo 0"),
    )
    .await?;
    Ok((w, r, s))
}

async fn secs(manager: &Arc<SandboxManager>, id: &str, cmd: &str) -> anyhow::Result<f64> {
    let text = guest_root(manager, id, cmd).await?;
    let ns: f64 = text
        .trim()
        .parse()
        .with_context(|| format!("`{cmd}` printed {text:?}"))?;
    Ok(ns / 1e9)
}

fn report(args: &VolumeArgs, m: &Measured) {
    let mib = f64::from(args.mib);
    let files = f64::from(args.files);
    let rate = |p: &Pair, amount: f64| {
        let per = |v: &[f64]| summarize(&v.iter().map(|s| amount / s).collect::<Vec<_>>()).p50;
        (per(&p.mount), per(&p.disk))
    };
    let (wm, wd) = rate(&m.write, mib);
    let (rm, rd) = rate(&m.read, mib);
    let (sm, sd) = rate(&m.small, files);
    if args.json {
        println!(
            "{}",
            json!({
                "samples": args.samples, "mib": args.mib, "files": args.files,
                "write_mib_s": {"mount": wm, "disk": wd, "ratio": wm / wd},
                "read_mib_s": {"mount": rm, "disk": rd, "ratio": rm / rd},
                "small_files_per_s": {"mount": sm, "disk": sd, "ratio": sm / sd},
            })
        );
        return;
    }
    println!(
        "siesta bench volume: template {}, {} samples, {} MiB sequential, {} small files (p50, interleaved in one sandbox)\n",
        args.template, args.samples, args.mib, args.files
    );
    println!("| Measure | Volume mount (NFSv3) | Sandbox disk | Mount / disk |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| sequential write + fsync | {wm:.1} MiB/s | {wd:.1} MiB/s | {:.2} |",
        wm / wd
    );
    println!(
        "| sequential read (cold guest cache) | {rm:.1} MiB/s | {rd:.1} MiB/s | {:.2} |",
        rm / rd
    );
    println!(
        "| small files created + sync | {sm:.0} /s | {sd:.0} /s | {:.2} |",
        sm / sd
    );
}
