//! `siesta bench density --n N`: host memory of N idle sandboxes of one
//! template, as PSS (proportional set size: a page shared by k processes
//! counts 1/k to each) summed over their VMM processes, divided by N times
//! the guest memory each was given.
//!
//! The sum is split into the guest RAM mapping (the template's memory blob,
//! mapped private: shared pages count once across all N) and the rest of
//! each VMM (QEMU's own heap; under TCG also its translation cache).

use std::os::unix::fs::MetadataExt;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;
use siesta_sandbox::template::Template;
use siesta_sandbox::SandboxManager;

use super::session::{create_pooled, Session};

#[derive(clap::Args)]
pub struct DensityArgs {
    /// Idle sandboxes to measure.
    #[arg(long, default_value_t = 32)]
    n: usize,
    /// Seconds to let them idle before reading their memory.
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    #[arg(long, default_value = "base")]
    template: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Memory of one VMM process, in KiB.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct VmmMemory {
    pss_kib: u64,
    ram_pss_kib: u64,
    /// The guest RAM mapping's private copies: pages the guest wrote.
    pub(super) ram_anon_kib: u64,
}

pub async fn run(args: DensityArgs) -> anyhow::Result<ExitCode> {
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    let session = Session::start().await?;
    let template = Template::open(&session.node.config.layout(), &args.template)?;
    let mut ids = Vec::new();
    let outcome = measure(&session.manager, &template, &args, &mut ids).await;
    for id in &ids {
        let _ = session.manager.kill(id).await;
    }
    session.close().await;
    let (guest_mib, memories) = outcome?;
    report(&args, guest_mib, &memories);
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    manager: &SandboxManager,
    template: &Template,
    args: &DensityArgs,
    ids: &mut Vec<String>,
) -> anyhow::Result<(u64, Vec<VmmMemory>)> {
    manager.warm(&args.template)?;
    let blob_inode = std::fs::metadata(&template.memory)
        .with_context(|| format!("stat {}", template.memory.display()))?
        .ino();
    let mut guest_mib = 0;
    for i in 0..args.n {
        let info = create_pooled(manager, &args.template)
            .await
            .with_context(|| format!("sandbox {} of {}", i + 1, args.n))?;
        guest_mib = u64::from(info.memory_mb);
        ids.push(info.id);
    }
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let mut memories = Vec::new();
    for id in ids.iter() {
        let pid = manager
            .get(id)
            .await?
            .vmm_pid
            .with_context(|| format!("sandbox {id} has no VMM"))?;
        memories.push(vmm_memory(pid, blob_inode)?);
    }
    Ok((guest_mib, memories))
}

/// PSS of process `pid` in all, and of its mappings of inode `ram_inode`.
pub(super) fn vmm_memory(pid: u32, ram_inode: u64) -> anyhow::Result<VmmMemory> {
    let path = format!("/proc/{pid}/smaps");
    let smaps = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    Ok(parse_smaps(&smaps, ram_inode))
}

fn parse_smaps(smaps: &str, ram_inode: u64) -> VmmMemory {
    let mut m = VmmMemory::default();
    let mut in_ram = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: address perms offset dev inode [path].
            in_ram = fields.nth(3).and_then(|i| i.parse::<u64>().ok()) == Some(ram_inode);
        } else if first == "Pss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            m.pss_kib += kib;
            if in_ram {
                m.ram_pss_kib += kib;
            }
        } else if first == "Anonymous:" && in_ram {
            m.ram_anon_kib += fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    m
}

fn report(args: &DensityArgs, guest_mib: u64, memories: &[VmmMemory]) {
    let n = memories.len() as f64;
    let given_mib = n * guest_mib as f64;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let pss = mib(memories.iter().map(|m| m.pss_kib).sum());
    let ram = mib(memories.iter().map(|m| m.ram_pss_kib).sum());
    let ratio = pss / given_mib;
    let ram_ratio = ram / given_mib;
    if args.json {
        let out = json!({
            "n": memories.len(),
            "guest_mib": guest_mib,
            "pss_mib": pss,
            "ram_pss_mib": ram,
            "ratio": ratio,
            "ram_ratio": ram_ratio,
        });
        println!("{out}");
        return;
    }
    println!(
        "siesta bench density: template {}, {} idle sandboxes of {guest_mib} MiB, after {} s idle\n",
        args.template,
        memories.len(),
        args.idle_secs
    );
    println!("| Measure | Total | Per sandbox | / guest memory |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| PSS of the VMM processes | {pss:.1} MiB | {:.1} MiB | {ratio:.3} |",
        pss / n
    );
    println!(
        "| of which guest RAM (template blob, private) | {ram:.1} MiB | {:.1} MiB | {ram_ratio:.3} |",
        ram / n
    );
    println!(
        "| of which the rest of QEMU | {:.1} MiB | {:.1} MiB | {:.3} |",
        pss - ram,
        (pss - ram) / n,
        (pss - ram) / given_mib
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pss_is_summed_and_the_ram_mapping_picked_by_inode() {
        let smaps = "\
7f00-7f10 rw-p 00000000 fd:01 4242 /var/lib/siesta/repo/blobs/abc
Size:              65536 kB
Pss:                1000 kB
Anonymous:           800 kB
7f10-7f20 rw-p 00000000 00:00 0
Pss:                 300 kB
Pss_Anon:            300 kB
Anonymous:           300 kB
7f20-7f30 r-xp 00000000 fd:01 99 /usr/bin/qemu-system-x86_64
Pss:                  50 kB
";
        let m = parse_smaps(smaps, 4242);
        assert_eq!(m.pss_kib, 1350);
        assert_eq!(m.ram_pss_kib, 1000);
        assert_eq!(m.ram_anon_kib, 800);
    }
}
