//! `siesta`: the command line of a siesta node.
//!
//! `serve` runs the node's server; `template` builds and lists templates on
//! this machine; `sandbox` talks to the running server; `bench` measures.

mod attach;
mod bench;
mod build_context;
mod client;
mod doctor;
mod files;
mod private_home;
mod repo;
mod serve;
mod serve_cluster;
mod snapshot;
mod stats;
mod template;
mod volume;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "siesta", version, about = "Snapshot-first microVM sandboxes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node's server (E2B-compatible API).
    Serve(serve::ServeArgs),
    /// Build and list templates.
    #[command(subcommand)]
    Template(template::TemplateCommand),
    /// Create, inspect, pause, resume and kill sandboxes (through the server).
    #[command(subcommand)]
    Sandbox(client::SandboxCommand),
    /// Copy files into and out of a running sandbox, list its directories
    /// (through the server).
    #[command(subcommand)]
    Files(files::FilesCommand),
    /// Create, list and delete volumes; copy files into and out of them
    /// (through the server).
    #[command(subcommand)]
    Volume(volume::VolumeCommand),
    /// List and delete snapshots in this node's repository.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Check (and repair) the snapshot repository.
    #[command(subcommand)]
    Repo(repo::RepoCommand),
    /// Check what this node needs (host tools, network, accelerator,
    /// assets, default template, disk, database).
    Doctor(doctor::DoctorArgs),
    /// Measure resume latency and the guest agent.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Print a shell completion script (`siesta completions bash >
    /// /etc/bash_completion.d/siesta`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the server's OpenAPI document (YAML), the one it serves at
    /// `/openapi.yaml` (`siesta openapi > docs/openapi.yaml`).
    Openapi,
}

/// Logs to stderr, filtered by `SIESTA_LOG`; one JSON object a line with
/// `SIESTA_LOG_FORMAT=json` or `server.log_format = "json"` in siesta.toml.
fn init_logs(default_level: &str) {
    use siesta_sandbox::config_file::{ConfigFile, LogFormat};
    let json = match std::env::var("SIESTA_LOG_FORMAT") {
        Ok(f) => f.eq_ignore_ascii_case("json"),
        Err(_) => {
            let home = siesta_sandbox::config::home_from_env();
            // A broken file is reported by the command that reads it.
            ConfigFile::load(&home).is_ok_and(|f| f.server.log_format == Some(LogFormat::Json))
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SIESTA_LOG").unwrap_or_else(|_| {
        // The lazy-fetch mount is detached before its FUSE session
        // ends, whose own unmount then fails harmlessly (EINVAL).
        tracing_subscriber::EnvFilter::new(format!("{default_level},fuser::mnt=error"))
    });
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        // Colour codes only on a terminal: logs redirected to files stay plain.
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory;
        clap_complete::generate(shell, &mut Cli::command(), "siesta", &mut std::io::stdout());
        return std::process::ExitCode::SUCCESS;
    }
    if let Command::Openapi = cli.command {
        print!("{}", siesta_server::openapi_yaml());
        return std::process::ExitCode::SUCCESS;
    }
    // doctor's report is the output: its progress logs only get in the way.
    let default_level = match cli.command {
        Command::Doctor(_) => "warn",
        _ => "info",
    };
    init_logs(default_level);
    // What these write under $SIESTA_HOME (tokens, guest memory, images) is
    // for root alone. The sandbox and files commands leave it be: what
    // they write are the user's own downloads.
    if matches!(
        cli.command,
        Command::Serve(_)
            | Command::Template(_)
            | Command::Snapshot(_)
            | Command::Repo(_)
            | Command::Bench(_)
    ) {
        private_home::restrict_umask();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("siesta: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
            Command::Template(cmd) => template::run(cmd).await,
            Command::Sandbox(cmd) => client::run(cmd).await,
            Command::Bench(cmd) => Box::pin(bench::run(cmd)).await,
            Command::Snapshot(cmd) => snapshot::run(cmd).await,
            Command::Files(cmd) => files::run(cmd).await,
            Command::Volume(cmd) => volume::run(cmd).await,
            Command::Repo(cmd) => repo::run(cmd).await,
            Command::Doctor(args) => doctor::run(args),
            Command::Completions { .. } | Command::Openapi => Ok(std::process::ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("siesta: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `e` and its causes joined by `: ` as `{:#}` does, leaving out a cause
/// whose text the message already holds (many errors quote their source).
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_quotes_is_said_once() {
        let e = anyhow::Error::new(siesta_sandbox::Error::Net {
            id: "node".into(),
            source: siesta_net::NetError::Config("subnet in use".into()),
        });
        assert_eq!(
            describe(&e),
            "network for node: invalid network config: subnet in use"
        );
        let e = anyhow::anyhow!("disk full").context("pausing sandbox x");
        assert_eq!(describe(&e), "pausing sandbox x: disk full");
    }
}
