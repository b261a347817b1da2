//! `siesta serve`.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use siesta_sandbox::config_file::{ConfigFile, ServerSection};
use siesta_sandbox::{preflight, Node, NodeConfig, SandboxManager};
use siesta_template as template;

/// Each flag overrides `[server]` of `siesta.toml`, which overrides the
/// default named here.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address of the API (default 127.0.0.1:3000).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Template to keep pre-spawned VMMs for (default `base`).
    #[arg(long)]
    warm_template: Option<String>,
    /// The domain of sandbox host names `{port}-{sandboxID}.{domain}` that
    /// `get_host()` gives (default `localhost:{listen port}`: names under
    /// `.localhost` resolve to this machine, see docs/configuration.md).
    #[arg(long, env = "SIESTA_SANDBOX_DOMAIN")]
    sandbox_domain: Option<String>,
    /// Size limit of a volume created without one, in MiB (default 10240).
    #[arg(long, env = "SIESTA_VOLUME_SIZE_MIB")]
    volume_size_mib: Option<u64>,
    /// Seconds a client has to send a request's head, on a new connection
    /// or between requests on a kept-alive one (default 30). A request
    /// whose head is in is not timed: streams last as long as they need.
    #[arg(long, env = "SIESTA_HEADER_TIMEOUT_SECS", value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_secs: Option<u64>,
    /// Most client connections open at once (default 10000); more wait
    /// in the kernel's queue until one closes.
    #[arg(long, env = "SIESTA_MAX_CONNECTIONS", value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: Option<u64>,
    /// Most connections open at once from one client address (default
    /// 1000); past it that address's new connections are closed. Behind a
    /// reverse proxy every client has the proxy's address: raise it there.
    #[arg(long, env = "SIESTA_MAX_CONNECTIONS_PER_IP", value_parser = clap::value_parser!(u64).range(1..))]
    max_connections_per_ip: Option<u64>,
    #[command(flatten)]
    cluster: crate::serve_cluster::ClusterArgs,
}

/// The server's settings once flags, environment and file are merged.
struct Settings {
    listen: SocketAddr,
    warm_template: String,
    sandbox_domain: Option<String>,
    volume_size_mib: u64,
    limits: siesta_server::HttpLimits,
}

impl ServeArgs {
    fn resolve(self, file: &ServerSection) -> anyhow::Result<Settings> {
        let listen = match (self.listen, &file.listen) {
            (Some(l), _) => l,
            (None, Some(l)) => l
                .parse()
                .with_context(|| format!("server.listen {l:?} in siesta.toml"))?,
            (None, None) => SocketAddr::from(([127, 0, 0, 1], 3000)),
        };
        Ok(Settings {
            listen,
            warm_template: self
                .warm_template
                .or_else(|| file.warm_template.clone())
                .unwrap_or_else(|| "base".into()),
            sandbox_domain: self.sandbox_domain.or_else(|| file.sandbox_domain.clone()),
            volume_size_mib: self
                .volume_size_mib
                .or(file.volume_size_mib)
                .unwrap_or(siesta_volume::DEFAULT_SIZE_LIMIT_MIB),
            limits: limits(
                self.header_timeout_secs.or(file.header_timeout_secs),
                self.max_connections.or(file.max_connections),
                self.max_connections_per_ip.or(file.max_connections_per_ip),
            )?,
        })
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    // Before anything is written there (main set the umask already).
    crate::private_home::close_home(&config.home)
        .context("keeping SIESTA_HOME to its owner (chmod 0700)")?;
    let file = ConfigFile::load(&config.home).map_err(anyhow::Error::msg)?;
    let (args, cluster_args) = {
        let mut args = args;
        let cluster = std::mem::take(&mut args.cluster);
        (args.resolve(&file.server)?, cluster)
    };
    if !preflight_passes(&config, &args.warm_template) {
        return Ok(ExitCode::FAILURE);
    }
    let home = config.home.clone();
    let api_keys = siesta_server::load_or_create_api_keys(&home)
        .with_context(|| format!("API key under {}", home.display()))?;
    let volumes_dir = home.join("volumes");
    let volumes = siesta_volume::Volumes::open(&volumes_dir, args.volume_size_mib)
        .with_context(|| format!("opening the volumes in {}", volumes_dir.display()))?;
    let volumes = std::sync::Arc::new(volumes);
    let remote = crate::repo::remote_tier_from_env()?;
    let node = Node::start(config).await?;
    // Loads the sandboxes a previous run left: paused ones stay resumable.
    let mut builder = SandboxManager::builder(node.clone()).volumes(volumes.clone());
    if let Some(remote) = remote {
        builder = builder.remote(remote);
    }
    let manager = match builder.open() {
        Ok(m) => m,
        Err(e) => {
            node.shutdown().await;
            return Err(e).context("opening the node's sandboxes");
        }
    };
    let cluster = match crate::serve_cluster::join(&cluster_args, args.listen, &manager).await {
        Ok(c) => c,
        Err(e) => {
            manager.shutdown().await;
            node.shutdown().await;
            return Err(e);
        }
    };
    record_missing_manifest(&node, &args.warm_template);
    if let Err(e) = manager.warm(&args.warm_template) {
        tracing::warn!("not pre-spawning VMMs for {:?}: {e}", args.warm_template);
    }
    let shown = shown_key(&api_keys, std::io::stdout().is_terminal());
    print!("{}", exports(args.listen, &home, shown));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let options = siesta_server::ServerOptions {
        sandbox_domain: Some(
            args.sandbox_domain
                .clone()
                .unwrap_or_else(|| format!("localhost:{}", args.listen.port())),
        ),
        volumes,
        cluster: cluster.clone(),
        limits: args.limits,
    };
    let mut server = tokio::spawn(siesta_server::serve(
        args.listen,
        manager.clone(),
        api_keys,
        options,
        async {
            let _ = stop_rx.await;
        },
    ));
    // The server may end by itself (it could not bind): then no signal.
    let ended = tokio::select! {
        r = &mut server => Some(r),
        _ = stop_signal() => None,
    };
    // Pause first: a graceful HTTP shutdown waits for every connection, and
    // a long-lived envd stream must not keep sandboxes from being saved.
    // Pausing ends those streams; new creates and resumes are refused.
    tracing::info!("shutting down: pausing running sandboxes");
    manager.shutdown().await;
    if let Some(cluster) = &cluster {
        // The pauses reach the object store (so other nodes can take them
        // over while this one is away), their rows are written out, then
        // the node deregisters.
        if !manager.wait_transfers(TRANSFER_DRAIN).await {
            tracing::warn!("pauses still going to the object store after {TRANSFER_DRAIN:?}: this node keeps them until it is back");
        }
        cluster.leave().await;
    }
    let served = match ended {
        Some(r) => r,
        None => {
            let _ = stop_tx.send(());
            match tokio::time::timeout(HTTP_DRAIN, server).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!("connections still open after {HTTP_DRAIN:?}: closing them");
                    Ok(Ok(()))
                }
            }
        }
    };
    node.shutdown().await;
    served
        .context("server task")?
        .with_context(|| format!("serving on {}", args.listen))?;
    Ok(ExitCode::SUCCESS)
}

/// The listener's limits: the flag or the file, else the defaults.
fn limits(
    header_timeout_secs: Option<u64>,
    max_connections: Option<u64>,
    max_connections_per_ip: Option<u64>,
) -> anyhow::Result<siesta_server::HttpLimits> {
    let defaults = siesta_server::HttpLimits::default();
    // The flags refuse 0 themselves; the file's values are checked here.
    if [header_timeout_secs, max_connections, max_connections_per_ip].contains(&Some(0)) {
        anyhow::bail!(
            "server.header_timeout_secs, server.max_connections and \
             server.max_connections_per_ip must be at least 1"
        );
    }
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    Ok(siesta_server::HttpLimits {
        header_timeout: header_timeout_secs
            .map_or(defaults.header_timeout, std::time::Duration::from_secs),
        max_connections: max_connections.map_or(defaults.max_connections, count),
        max_connections_per_ip: max_connections_per_ip
            .map_or(defaults.max_connections_per_ip, count),
    })
}

/// The key to show on start: none, unless this start minted it and a
/// person reads stdout. Under systemd or Kubernetes stdout is the journal
/// or the pod log, which others read and ship elsewhere.
fn shown_key(keys: &siesta_server::ApiKeys, terminal: bool) -> Option<&str> {
    (keys.minted() && terminal).then(|| keys.current())
}

/// What `serve` prints on start: the variables clients need, the key as
/// a command that reads its file.
fn exports(listen: SocketAddr, home: &Path, shown_key: Option<&str>) -> String {
    let key_file = siesta_server::key_file(home);
    let mut out = format!(
        "siesta: listening on http://{listen}\n\
         \x20 export E2B_API_URL=http://{listen}\n\
         \x20 export E2B_SANDBOX_URL=http://{listen}\n\
         \x20 export E2B_VOLUME_API_URL=http://{listen}\n\
         \x20 export E2B_API_KEY=$(cat {})\n",
        shell_word(&key_file.display().to_string())
    );
    if let Some(key) = shown_key {
        out.push_str(&format!("  (a new API key, shown this once: {key})\n"));
    }
    out
}

/// `word` as one word for a POSIX shell.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@%,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Runs `siesta doctor`'s checks; prints what failed and returns false when
/// the server could not do its job (rather than answer 500 on every create).
fn preflight_passes(config: &NodeConfig, template: &str) -> bool {
    let report = preflight::run(config, &crate::doctor::options(template));
    for warning in report.warnings() {
        tracing::warn!("{}", warning.line());
    }
    if report.ready() {
        return true;
    }
    eprintln!("siesta: not starting: what the server needs is missing here:");
    for failure in report.failures() {
        eprintln!("  {}", failure.line());
    }
    eprintln!("(`siesta doctor` prints every check)");
    false
}

/// A template published while its manifest could not be recorded (a tool
/// was missing, say) gets it now, in the background.
fn record_missing_manifest(node: &std::sync::Arc<Node>, name: &str) {
    let Ok(t) = template::Template::open(&node.config.layout(), name) else {
        return;
    };
    let recorded = t.snapshot.as_ref().is_none_or(|s| s.manifest.is_some());
    if node.config.record_manifest && !recorded {
        tracing::info!(template = name, "recording its missing startup manifest");
        drop(template::spawn_manifest_recording(node.clone(), t));
    }
}

/// How long a clean stop in a cluster waits for its pauses to reach the
/// object store (well inside the unit's and the pod's 120 s stop timeout).
const TRANSFER_DRAIN: std::time::Duration = std::time::Duration::from_secs(60);

/// How long open HTTP connections may take to finish after a stop signal.
const HTTP_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (`kill`, systemd, `make down`):
/// either way running sandboxes are paused, not lost.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under systemd or Kubernetes stdout is a log others read: the key
    /// must not be in it, only where to read it.
    #[test]
    fn the_key_is_printed_only_when_minted_and_to_a_terminal() {
        let home = tempfile::tempdir().unwrap();
        let minted = siesta_server::load_or_create_api_keys(home.path()).unwrap();
        let loaded = siesta_server::load_or_create_api_keys(home.path()).unwrap();
        let key = loaded.current().to_string();
        assert!(minted.minted() && !loaded.minted());
        let listen: SocketAddr = "127.0.0.1:3000".parse().unwrap();
        for (keys, terminal) in [(&loaded, true), (&loaded, false), (&minted, false)] {
            let out = exports(listen, home.path(), shown_key(keys, terminal));
            assert!(!out.contains(&key), "{out}");
            let file = siesta_server::key_file(home.path());
            let line = format!("export E2B_API_KEY=$(cat {})", file.display());
            assert!(out.contains(&line), "{out}");
        }
        let out = exports(listen, home.path(), shown_key(&minted, true));
        assert!(out.contains(&key), "{out}");
    }

    #[test]
    fn listener_limits_come_from_flag_or_file_else_the_defaults() {
        let defaults = siesta_server::HttpLimits::default();
        assert_eq!(limits(None, None, None).unwrap(), defaults);
        let set = limits(Some(5), Some(7), Some(3)).unwrap();
        assert_eq!(set.header_timeout, std::time::Duration::from_secs(5));
        assert_eq!(set.max_connections, 7);
        assert_eq!(set.max_connections_per_ip, 3);
        assert!(limits(Some(0), None, None).is_err());
        assert!(limits(None, Some(0), None).is_err());
        assert!(limits(None, None, Some(0)).is_err());
    }

    #[test]
    fn paths_are_quoted_for_the_shell_when_they_need_it() {
        assert_eq!(
            shell_word("/var/lib/siesta/secrets/api-key"),
            "/var/lib/siesta/secrets/api-key"
        );
        assert_eq!(shell_word("/a b/it's"), "'/a b/it'\\''s'");
    }
}
