//! `siesta bench memory-return --mib N`: a running sandbox writes N MiB to a
//! tmpfs and deletes it; how much of its VMM's private guest memory the host
//! gets back while it keeps running, and how fast, with the node's memory
//! return (KSM with zero pages, `siesta_vmm::memory_return`) against
//! without it (`ksmd` stopped), interleaved in one run.
//!
//! "Private" is the `Anonymous` memory of the VMM's guest-RAM mapping: the
//! pages the guest wrote, which the template's page cache does not hold.

use std::os::unix::fs::MetadataExt;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use siesta_sandbox::SandboxManager;
use siesta_template::Template;
use siesta_vmm::memory_return::Ksm;

use super::density::vmm_memory;
use super::session::{create_pooled, guest_root, Session};
use crate::stats::summarize;

#[derive(clap::Args)]
pub struct MemoryReturnArgs {
    /// MiB the guest writes to a tmpfs and deletes.
    #[arg(long, default_value_t = 128)]
    mib: u64,
    /// Sandboxes per arm.
    #[arg(long, default_value_t = 3)]
    samples: usize,
    /// Longest wait for 90% of the freed memory to come back; the arm
    /// without memory return idles this long.
    #[arg(long, default_value_t = 60)]
    wait_secs: u64,
    #[arg(long, default_value = "base")]
    template: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// One sandbox's figures, in MiB and ms.
struct Sample {
    returning: bool,
    after_free_mib: f64,
    after_wait_mib: f64,
    /// Until 90% of what was freed came back; `None`: it did not.
    return_ms: Option<f64>,
    /// CPU `ksmd` used over the wait, as a share of one core.
    ksmd_cpu: f64,
}

pub async fn run(args: MemoryReturnArgs) -> anyhow::Result<ExitCode> {
    if args.samples == 0 || args.mib == 0 {
        bail!("--samples and --mib must be at least 1");
    }
    let ksm = Ksm::host();
    let session = Session::start().await?;
    if !ksm.is_enabled()? {
        session.close().await;
        bail!("memory return is off on this node (memory_return = false, or KSM could not be switched on: see the server's warning)");
    }
    let outcome = measure(&session, &ksm, &args).await;
    // Whatever an arm left, ksmd runs again as the node set it.
    let restarted = ksm.set_running(true);
    session.close().await;
    let samples = outcome?;
    restarted?;
    report(&args, &samples);
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    session: &Session,
    ksm: &Ksm,
    args: &MemoryReturnArgs,
) -> anyhow::Result<Vec<Sample>> {
    let template = Template::open(&session.node.config.layout(), &args.template)?;
    let ram_inode = std::fs::metadata(&template.memory)
        .with_context(|| format!("stat {}", template.memory.display()))?
        .ino();
    session.manager.warm(&args.template)?;
    let mut samples = Vec::new();
    for i in 0..args.samples {
        // Alternate which arm goes first, so neither always follows the other.
        for returning in [i % 2 == 0, i % 2 == 1] {
            ksm.set_running(returning)?;
            samples.push(sample(&session.manager, args, ram_inode, returning).await?);
        }
    }
    Ok(samples)
}

async fn sample(
    manager: &Arc<SandboxManager>,
    args: &MemoryReturnArgs,
    ram_inode: u64,
    returning: bool,
) -> anyhow::Result<Sample> {
    let info = create_pooled(manager, &args.template).await?;
    let result =
        write_free_and_wait(manager, &info.id, info.vmm_pid, args, ram_inode, returning).await;
    manager.kill(&info.id).await?;
    result
}

async fn write_free_and_wait(
    manager: &Arc<SandboxManager>,
    id: &str,
    pid: Option<u32>,
    args: &MemoryReturnArgs,
    ram_inode: u64,
    returning: bool,
) -> anyhow::Result<Sample> {
    let pid = pid.with_context(|| format!("sandbox {id} has no VMM"))?;
    let private_mib =
        || -> anyhow::Result<f64> { Ok(vmm_memory(pid, ram_inode)?.ram_anon_kib as f64 / 1024.0) };
    let n = args.mib;
    guest_root(
        manager,
        id,
        &format!(
            "mkdir -p /run/freed && mount -t tmpfs -o size={}m tmpfs /run/freed && \
             head -c {n}M /dev/urandom > /run/freed/data && rm /run/freed/data && umount /run/freed",
            n + 16
        ),
    )
    .await?;
    let after_free_mib = private_mib()?;
    let target = after_free_mib - 0.9 * n as f64;
    let ksmd_before = ksmd_cpu_secs()?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.wait_secs);
    let mut now_mib = after_free_mib;
    let mut return_ms = None;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now_mib = private_mib()?;
        if now_mib <= target {
            return_ms = Some(started.elapsed().as_secs_f64() * 1e3);
            break;
        }
    }
    let ksmd_cpu = (ksmd_cpu_secs()? - ksmd_before) / started.elapsed().as_secs_f64();
    Ok(Sample {
        returning,
        after_free_mib,
        after_wait_mib: now_mib,
        return_ms,
        ksmd_cpu,
    })
}

/// CPU seconds the kernel's `ksmd` thread has used (user + system).
fn ksmd_cpu_secs() -> anyhow::Result<f64> {
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let dir = entry.context("reading /proc")?.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim() != "ksmd" {
            continue;
        }
        return super::session::cpu_secs(&dir);
    }
    bail!("no ksmd thread in /proc (a kernel without KSM?)")
}

/// One arm's medians.
#[derive(serde::Serialize)]
struct Row {
    memory_return: bool,
    private_after_free_mib: f64,
    private_after_wait_mib: f64,
    returned_mib: f64,
    /// Samples in which 90% came back within the wait, of `samples`.
    returned_samples: usize,
    samples: usize,
    return_ms: Option<f64>,
    ksmd_cpu: f64,
}

fn row(samples: &[Sample], returning: bool) -> Row {
    let v: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.returning == returning)
        .collect();
    let p50 =
        |f: &dyn Fn(&Sample) -> f64| summarize(&v.iter().map(|s| f(s)).collect::<Vec<_>>()).p50;
    let returned: Vec<f64> = v.iter().filter_map(|s| s.return_ms).collect();
    Row {
        memory_return: returning,
        private_after_free_mib: p50(&|s| s.after_free_mib),
        private_after_wait_mib: p50(&|s| s.after_wait_mib),
        returned_mib: p50(&|s| s.after_free_mib - s.after_wait_mib),
        returned_samples: returned.len(),
        samples: v.len(),
        return_ms: (!returned.is_empty()).then(|| summarize(&returned).p50),
        ksmd_cpu: p50(&|s| s.ksmd_cpu),
    }
}

fn report(args: &MemoryReturnArgs, samples: &[Sample]) {
    let rows = [row(samples, false), row(samples, true)];
    if args.json {
        println!("{}", json!({ "freed_mib": args.mib, "rows": rows }));
        return;
    }
    println!(
        "{} MiB written to a tmpfs and deleted in a running {} sandbox; medians of {} per arm",
        args.mib, args.template, args.samples
    );
    println!("| Memory return | Private after the free | Private after the wait | Returned | Returned (90%) in | Time to 90% | ksmd CPU |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        let time = r.return_ms.map_or_else(
            || format!("not in {} s", args.wait_secs),
            |ms| format!("{ms:.0} ms"),
        );
        println!(
            "| {} | {:.1} MiB | {:.1} MiB | {:.1} MiB ({:.2}) | {}/{} | {time} | {:.1}% |",
            if r.memory_return {
                "on (KSM, zero pages)"
            } else {
                "off (ksmd stopped)"
            },
            r.private_after_free_mib,
            r.private_after_wait_mib,
            r.returned_mib,
            r.returned_mib / args.mib as f64,
            r.returned_samples,
            r.samples,
            r.ksmd_cpu * 100.0
        );
    }
}
