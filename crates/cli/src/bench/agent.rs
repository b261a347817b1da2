//! `siesta bench agent`: the guest agent run as a host process.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use siesta_envd_client::EnvdClient;

use crate::stats::summarize;

#[derive(clap::Args)]
pub struct AgentArgs {
    /// The agent binary (default: `SIESTA_AGENT_BIN`, else the static build
    /// under target/).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Agent starts to measure.
    #[arg(long, default_value_t = 20)]
    starts: usize,
    /// `Start` round trips of `true` to measure.
    #[arg(long, default_value_t = 200)]
    round_trips: usize,
    #[arg(long)]
    json: bool,
}

/// Kills the agent by its PID when the bench ends, however it ends.
struct AgentProcess(Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn spawn(agent: &PathBuf, addr: SocketAddr) -> anyhow::Result<AgentProcess> {
    let child = Command::new(agent)
        .args(["--listen", &addr.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", agent.display()))?;
    Ok(AgentProcess(child))
}

fn resident_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/PID/status")
}

pub async fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let agent = args
        .agent
        .clone()
        .or_else(|| std::env::var_os("SIESTA_AGENT_BIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("target/x86_64-unknown-linux-gnu/release/siesta-agent"));
    if !agent.exists() {
        bail!(
            "agent binary {} not found (run `make agent`)",
            agent.display()
        );
    }
    let mut starts = Vec::with_capacity(args.starts);
    for _ in 0..args.starts {
        let addr = free_port()?;
        let began = Instant::now();
        let _proc = spawn(&agent, addr)?;
        EnvdClient::new("bench", addr, None)
            .wait_healthy(Duration::from_secs(10))
            .await?;
        starts.push(began.elapsed().as_secs_f64() * 1e3);
    }

    let addr = free_port()?;
    let proc = spawn(&agent, addr)?;
    let client = EnvdClient::new("bench", addr, None);
    client.wait_healthy(Duration::from_secs(10)).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle_kib = resident_kib(proc.0.id())?;
    let mut trips = Vec::with_capacity(args.round_trips);
    for _ in 0..args.round_trips {
        let began = Instant::now();
        let out = client.run("true", &[], None, |_, _| {}).await?;
        if out.exit_code != 0 {
            bail!("`true` exited with {}", out.exit_code);
        }
        trips.push(began.elapsed().as_secs_f64() * 1e3);
    }
    drop(proc);

    let s = summarize(&starts);
    let t = summarize(&trips);
    if args.json {
        println!(
            "{}",
            json!({"start_to_health_ms": s, "start_true_round_trip_ms": t, "idle_rss_kib": idle_kib})
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("siesta bench agent: {}\n", agent.display());
    println!("| Measure | n | Median | Mean | Min | Max | Target |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| agent start to first /health | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | < 20 ms |",
        s.n, s.p50, s.mean, s.min, s.max
    );
    println!(
        "| Start `true` round trip | {} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | < 2 ms |",
        t.n, t.p50, t.mean, t.min, t.max
    );
    println!(
        "| idle resident memory | 1 | {:.2} MiB | | | | < 10 MiB |",
        idle_kib as f64 / 1024.0
    );
    Ok(ExitCode::SUCCESS)
}
