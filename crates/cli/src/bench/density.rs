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
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ValueEnum;
use serde_json::json;
use siesta_sandbox::SandboxManager;
use siesta_template::Template;

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
    /// Measure N sandboxes without a setting and then N with it, in this
    /// one run, and print the two side by side.
    #[arg(long, value_enum)]
    compare: Option<DensityCompare>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DensityCompare {
    /// VMMs that load the whole guest kernel and initrd against VMMs that
    /// load the kernel's stand-in (`Tuning::incoming_kernel_stub`, always on
    /// in a server).
    KernelStub,
    /// VMMs running as the server's user against VMMs that each drop to an
    /// unprivileged user of their own (`SIESTA_VMM_USERS`; root only).
    VmmUsers,
}

/// Memory of one VMM process, in KiB.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct VmmMemory {
    pss_kib: u64,
    ram_pss_kib: u64,
    /// The guest RAM mapping's private copies: pages the guest wrote.
    pub(super) ram_anon_kib: u64,
}

/// The N sandboxes of one configuration.
struct Arm {
    label: &'static str,
    guest_mib: u64,
    memories: Vec<VmmMemory>,
    /// CPU seconds each VMM used from its spawn to the reading.
    cpu_secs: Vec<f64>,
}

pub async fn run(args: DensityArgs) -> anyhow::Result<ExitCode> {
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    let settings: &[(&'static str, Option<bool>)] = match args.compare {
        None => &[("", None)],
        Some(DensityCompare::KernelStub) => {
            &[("whole kernel", Some(false)), ("kernel stub", Some(true))]
        }
        Some(DensityCompare::VmmUsers) => &[
            ("VMMs as the server's user", Some(false)),
            ("a VMM user each", Some(true)),
        ],
    };
    let mut arms = Vec::new();
    for &(label, on) in settings {
        let mut config = super::session::bench_config("n")?;
        let mut tuning = siesta_host::Tuning::default();
        match (args.compare, on) {
            (Some(DensityCompare::KernelStub), Some(on)) => tuning.incoming_kernel_stub = on,
            (Some(DensityCompare::VmmUsers), Some(on)) => config.vmm_users = on,
            _ => {}
        }
        let arm = measure_arm(config, tuning, &args, label)
            .await
            .with_context(|| format!("arm {label:?}"))?;
        arms.push(arm);
    }
    match arms.as_slice() {
        [one] => report(&args, one),
        [off, on] => report_pair(&args, off, on),
        _ => unreachable!("one arm, or two to compare"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure_arm(
    config: siesta_sandbox::NodeConfig,
    tuning: siesta_host::Tuning,
    args: &DensityArgs,
    label: &'static str,
) -> anyhow::Result<Arm> {
    let session = Session::start_with(config, tuning, None).await?;
    let template = Template::open(&session.node.config.layout(), &args.template)?;
    let mut ids = Vec::new();
    let outcome = measure(&session.manager, &template, args, &mut ids).await;
    for id in &ids {
        let _ = session.manager.kill(id).await;
    }
    session.close().await;
    let (guest_mib, memories, cpu_secs) = outcome?;
    Ok(Arm {
        label,
        guest_mib,
        memories,
        cpu_secs,
    })
}

async fn measure(
    manager: &Arc<SandboxManager>,
    template: &Template,
    args: &DensityArgs,
    ids: &mut Vec<String>,
) -> anyhow::Result<(u64, Vec<VmmMemory>, Vec<f64>)> {
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
    let mut cpu = Vec::new();
    for id in ids.iter() {
        let pid = manager
            .get(id)
            .await?
            .vmm_pid
            .with_context(|| format!("sandbox {id} has no VMM"))?;
        memories.push(vmm_memory(pid, blob_inode)?);
        cpu.push(super::session::cpu_secs(std::path::Path::new(&format!(
            "/proc/{pid}"
        )))?);
    }
    Ok((guest_mib, memories, cpu))
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

/// One arm's sums, in MiB, and its ratios to the guest memory given.
struct Sums {
    pss: f64,
    ram: f64,
    given: f64,
    cpu_ms_p50: f64,
}

impl Sums {
    fn of(arm: &Arm) -> Self {
        let mib = |kib: u64| kib as f64 / 1024.0;
        Self {
            pss: mib(arm.memories.iter().map(|m| m.pss_kib).sum()),
            ram: mib(arm.memories.iter().map(|m| m.ram_pss_kib).sum()),
            given: arm.memories.len() as f64 * arm.guest_mib as f64,
            cpu_ms_p50: crate::stats::percentile(&arm.cpu_secs, 0.5) * 1e3,
        }
    }
    fn ratio(&self) -> f64 {
        self.pss / self.given
    }
    fn json(&self, arm: &Arm) -> serde_json::Value {
        json!({
            "n": arm.memories.len(),
            "guest_mib": arm.guest_mib,
            "pss_mib": self.pss,
            "ram_pss_mib": self.ram,
            "ratio": self.ratio(),
            "ram_ratio": self.ram / self.given,
            "vmm_cpu_ms_p50": self.cpu_ms_p50,
        })
    }
}

fn heading(args: &DensityArgs, arm: &Arm) {
    println!(
        "siesta bench density: template {}, {} idle sandboxes of {} MiB, after {} s idle\n",
        args.template,
        arm.memories.len(),
        arm.guest_mib,
        args.idle_secs
    );
}

fn report(args: &DensityArgs, arm: &Arm) {
    let s = Sums::of(arm);
    if args.json {
        println!("{}", s.json(arm));
        return;
    }
    heading(args, arm);
    let n = arm.memories.len() as f64;
    println!("| Measure | Total | Per sandbox | / guest memory |");
    println!("| --- | ---: | ---: | ---: |");
    let row = |what: &str, mib: f64| {
        println!(
            "| {what} | {mib:.1} MiB | {:.1} MiB | {:.3} |",
            mib / n,
            mib / s.given
        )
    };
    row("PSS of the VMM processes", s.pss);
    row("of which guest RAM (template blob, private)", s.ram);
    row("of which the rest of QEMU", s.pss - s.ram);
    println!(
        "\nCPU time of a VMM from its spawn to the reading, p50: {:.0} ms",
        s.cpu_ms_p50
    );
}

fn report_pair(args: &DensityArgs, off: &Arm, on: &Arm) {
    let (a, b) = (Sums::of(off), Sums::of(on));
    if args.json {
        let out = json!({
            "compare": args.compare.and_then(|c| c.to_possible_value()).map(|v| v.get_name().to_string()),
            "arms": [
                json!({"label": off.label, "result": a.json(off)}),
                json!({"label": on.label, "result": b.json(on)}),
            ],
            "ratio_on_over_off": b.ratio() / a.ratio(),
        });
        println!("{out}");
        return;
    }
    heading(args, off);
    let n = off.memories.len() as f64;
    println!(
        "| Per sandbox | {} | {} | {} / {} |",
        off.label, on.label, on.label, off.label
    );
    println!("| --- | ---: | ---: | ---: |");
    let row = |what: &str, x: f64, y: f64, unit: &str| {
        let digits = if unit.is_empty() { 3 } else { 1 };
        println!(
            "| {what} | {x:.digits$}{unit} | {y:.digits$}{unit} | {:.3} |",
            y / x
        )
    };
    row("PSS of the VMM", a.pss / n, b.pss / n, " MiB");
    row("of which guest RAM", a.ram / n, b.ram / n, " MiB");
    row(
        "of which the rest of QEMU",
        (a.pss - a.ram) / n,
        (b.pss - b.ram) / n,
        " MiB",
    );
    row(
        "density ratio (PSS / guest memory)",
        a.ratio(),
        b.ratio(),
        "",
    );
    row("CPU time of a VMM, p50", a.cpu_ms_p50, b.cpu_ms_p50, " ms");
    println!(
        "\nThe arms ran one after the other ({} first), each on its own node.",
        off.label
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
