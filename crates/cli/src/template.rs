//! `siesta template build|list`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use siesta_image::Credentials;
use siesta_sandbox::{Node, NodeConfig};
use siesta_template::dockerfile::{self, Instruction};
use siesta_template::{self as template, BuildOptions, BuildSource, Step, StepsBuild};

// Parsed once per process: the size of the `Build` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(clap::Subcommand)]
pub enum TemplateCommand {
    /// Boot an image, wait for its agent, and freeze it into a template.
    Build {
        /// Template name.
        name: String,
        /// What to build from: a root file system of the node's assets
        /// (`base`, `tiny`: `$SIESTA_HOME/assets/rootfs-IMAGE.img`), else an
        /// OCI image (`debian:12`, `127.0.0.1:5000/team/app:1`,
        /// `oci:DIR[:TAG]`, `docker-archive:FILE`). Default: the asset named
        /// like the template.
        #[arg(long)]
        image: Option<String>,
        /// Registry user for `--image` or the Dockerfile's FROM image; the
        /// password is read from SIESTA_REGISTRY_PASSWORD.
        #[arg(long)]
        registry_user: Option<String>,
        /// Started after the steps and left running in the template (the
        /// Dockerfile's CMD/ENTRYPOINT when there is one).
        #[arg(long)]
        start_cmd: Option<String>,
        /// Rebuild a template that exists.
        #[arg(long)]
        force: bool,
        /// Do nothing when the template exists.
        #[arg(long)]
        if_missing: bool,
        /// Build from this Dockerfile (the subset in docs/templates.md):
        /// FROM names the template to start from.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// The build context COPY reads from (default: the Dockerfile's
        /// directory).
        context: Option<PathBuf>,
        /// `NAME=VALUE` for an ARG of the Dockerfile (repeatable).
        #[arg(long = "build-arg")]
        build_args: Vec<String>,
        /// Run until it succeeds after the start command (CMD/ENTRYPOINT)
        /// before freezing, e.g. `curl -sf localhost:8000`.
        #[arg(long)]
        ready_cmd: Option<String>,
        /// vCPUs of the template's VM (default: the source template's).
        #[arg(long)]
        cpus: Option<u32>,
        /// Memory of the template's VM in MiB (default: the source's).
        #[arg(long)]
        memory_mib: Option<u32>,
        /// Size of the template's disk in MiB (default: an image's files
        /// plus 1 GiB free; a template's disk as it is).
        #[arg(long)]
        disk_mib: Option<u32>,
        /// `text` (progress lines) or `json` (one JSON object per line).
        #[arg(long, default_value = "text")]
        output: String,
    },
    /// List templates.
    List {
        /// Print one JSON array of the template records instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a template (its running sandboxes keep running).
    Delete { name: String },
}

pub async fn run(cmd: TemplateCommand) -> anyhow::Result<ExitCode> {
    let mut config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    match cmd {
        TemplateCommand::Build {
            name,
            image,
            registry_user,
            start_cmd,
            force,
            if_missing,
            file,
            context,
            build_args,
            ready_cmd,
            cpus,
            memory_mib,
            disk_mib,
            output,
        } => {
            // Its own network tag and subnet: a build never touches a
            // server's slots.
            config.beside_server("b", siesta_net::Subnet::ten_slash_16(254));
            config.warm_slots = 0;
            let mut force = force;
            if if_missing {
                if let Ok(t) = template::Template::open(&config.layout(), &name) {
                    let Some(why) = stale(&config, &t) else {
                        return complete_existing(config, t).await;
                    };
                    println!("template {name} {why}: rebuilding it");
                    force = true;
                }
            }
            let credentials = registry_credentials(registry_user)?;
            let oci_image = image
                .clone()
                .filter(|i| file.is_some() || !config.layout().image(i).exists());
            if file.is_some() || oci_image.is_some() {
                let req = StepsRequest {
                    name,
                    file,
                    image: oci_image,
                    credentials,
                    context,
                    build_args,
                    start_cmd,
                    ready_cmd,
                    cpus,
                    memory_mib,
                    disk_mib,
                    force,
                    json: parse_output(&output)?,
                };
                return build_steps(config, req).await;
            }
            let node = Node::start(config).await?;
            let opts = BuildOptions {
                image: image.unwrap_or_else(|| name.clone()),
                name,
                force,
            };
            let built = template::build_template(&node, &opts).await;
            // The template is published; its startup manifest is recorded
            // after, and a failure there leaves a usable template.
            let manifest = match (&built, node.config.record_manifest) {
                (Ok(t), true) => Some(template::record_startup_manifest(&node, t).await),
                _ => None,
            };
            node.shutdown().await;
            let t = built?;
            match manifest {
                Some(Ok(m)) => print_manifest(&m),
                Some(Err(e)) => {
                    // Published but not prefetchable: say so and fail, so a
                    // setup script does not go on as if all were well.
                    eprintln!(
                        "siesta: template {} is built, but its startup manifest could not be recorded: {e}\n\
                         fix the cause (`siesta doctor`), then run `siesta template build {} --if-missing` to record it",
                        t.record.name, t.record.name
                    );
                    return Ok(ExitCode::FAILURE);
                }
                None => {}
            }
            print_built(&t);
        }
        TemplateCommand::List { json } => list(&config, json)?,
        TemplateCommand::Delete { name } => {
            if !template::delete(&config.layout(), &name)? {
                anyhow::bail!("template {name:?} not found (`siesta template list`)");
            }
            println!("deleted template {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_output(output: &str) -> anyhow::Result<bool> {
    match output {
        "text" => Ok(false),
        "json" => Ok(true),
        other => anyhow::bail!("--output {other:?}: use text or json"),
    }
}

/// `--registry-user` with SIESTA_REGISTRY_PASSWORD (never on the command
/// line, where other users of the machine can read it).
fn registry_credentials(user: Option<String>) -> anyhow::Result<Option<Credentials>> {
    let Some(username) = user else {
        return Ok(None);
    };
    let password = std::env::var("SIESTA_REGISTRY_PASSWORD").map_err(|_| {
        anyhow::anyhow!("--registry-user {username}: set its password in SIESTA_REGISTRY_PASSWORD")
    })?;
    Ok(Some(Credentials { username, password }))
}

/// `siesta template build NAME -f FILE [CONTEXT]` or `--image REF`.
struct StepsRequest {
    name: String,
    file: Option<PathBuf>,
    image: Option<String>,
    credentials: Option<Credentials>,
    context: Option<PathBuf>,
    build_args: Vec<String>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
    cpus: Option<u32>,
    memory_mib: Option<u32>,
    disk_mib: Option<u32>,
    force: bool,
    json: bool,
}

impl StepsRequest {
    /// The build of `source` with `steps`, sized and forced as asked.
    fn plan(&self, source: BuildSource, steps: Vec<Step>, start_cmd: Option<String>) -> StepsBuild {
        StepsBuild {
            name: self.name.clone(),
            source,
            steps,
            start_cmd,
            ready_cmd: self.ready_cmd.clone(),
            vcpus: self.cpus,
            memory_mib: self.memory_mib,
            disk_mib: self.disk_mib,
            min_free_disk_mib: None,
            rebuild_from: self.force.then_some(0),
        }
    }
}

async fn build_steps(config: NodeConfig, req: StepsRequest) -> anyhow::Result<ExitCode> {
    let plan = match &req.file {
        Some(file) => plan_dockerfile(&config, &req, file)?,
        None => req.plan(
            BuildSource::Image {
                reference: req.image.clone().unwrap_or_default(),
                credentials: req.credentials.clone(),
                // The operator's own build, on the host: any registry.
                reach: siesta_image::Reach::Anywhere,
            },
            Vec::new(),
            req.start_cmd.clone(),
        ),
    };
    let node = Node::start(config).await?;
    let log = build_log(req.json);
    let built = template::build_from_steps(&node, &plan, &log).await;
    let manifest = match (&built, node.config.record_manifest) {
        (Ok(t), true) if t.snapshot.as_ref().is_some_and(|s| s.manifest.is_none()) => {
            Some(template::record_startup_manifest(&node, t).await)
        }
        _ => None,
    };
    node.shutdown().await;
    let t = built?;
    if let Some(Err(e)) = manifest {
        eprintln!("siesta: startup manifest not recorded (resumes will not prefetch): {e}");
    }
    if req.json {
        println!(
            "{}",
            serde_json::json!({"template": t.record.name, "status": "ready"})
        );
    } else {
        print_built(&t);
    }
    Ok(ExitCode::SUCCESS)
}

/// Build progress: one JSON object per line with `--output json`; else one
/// line per event, with pull progress drawn as a bar redrawn in place when
/// stdout is a terminal (and left out when it is not).
fn build_log(json: bool) -> template::BuildLog {
    use std::io::{IsTerminal, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let terminal = std::io::stdout().is_terminal();
    let bar_shown = AtomicBool::new(false);
    std::sync::Arc::new(move |level, phase, msg| {
        if level == template::LogLevel::Progress {
            if terminal && !json {
                print!("\r\x1b[K[{phase}] {msg}");
                let _ = std::io::stdout().flush();
                bar_shown.store(true, Ordering::Relaxed);
            }
            return;
        }
        if bar_shown.swap(false, Ordering::Relaxed) {
            print!("\r\x1b[K");
        }
        if json {
            let level = format!("{level:?}").to_lowercase();
            println!(
                "{}",
                serde_json::json!({"step": phase.to_string(), "level": level, "message": msg})
            );
        } else {
            println!("[{phase}] {msg}");
        }
    })
}

/// Reads the Dockerfile and archives its COPY sources into build steps.
fn plan_dockerfile(
    config: &NodeConfig,
    req: &StepsRequest,
    file: &std::path::Path,
) -> anyhow::Result<StepsBuild> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut args = BTreeMap::new();
    for pair in &req.build_args {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--build-arg {pair:?}: use NAME=VALUE"))?;
        args.insert(k.to_string(), v.to_string());
    }
    let parsed =
        dockerfile::parse(&text, &args).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let context = match &req.context {
        Some(c) => c.clone(),
        None => file
            .parent()
            .map_or_else(|| PathBuf::from("."), PathBuf::from),
    };
    let context = if context.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        context
    };
    let files = config.layout().build_files();
    // As Docker (and E2B's from_dockerfile): root in / first; sandboxes
    // get E2B's user and home unless the Dockerfile chose its own.
    let mut steps = vec![Step::User("root".into()), Step::Workdir("/".into())];
    let sets_user = parsed
        .instructions
        .iter()
        .any(|i| matches!(i, Instruction::User(_)));
    let sets_workdir = parsed
        .instructions
        .iter()
        .any(|i| matches!(i, Instruction::Workdir(_)));
    for ins in parsed.instructions {
        steps.push(match ins {
            Instruction::Run(command) => Step::Run {
                command,
                user: None,
            },
            Instruction::Env(pairs) => Step::Env(pairs),
            Instruction::Workdir(d) => Step::Workdir(d),
            Instruction::User(u) => Step::User(u),
            Instruction::Copy(spec) => crate::build_context::copy_step(&context, &spec, &files)?,
        });
    }
    if !sets_user {
        steps.push(Step::User("user".into()));
    }
    if !sets_workdir {
        steps.push(Step::Workdir("/home/user".into()));
    }
    let source = build_source(config, &parsed.from, req.image.as_deref(), &req.credentials);
    let start_cmd = parsed.start_cmd.or_else(|| req.start_cmd.clone());
    Ok(req.plan(source, steps, start_cmd))
}

/// `FROM` (or `--image`, which overrides it): a template of this node when
/// one has that name (E2B's base image means `base`), else an OCI image.
fn build_source(
    config: &NodeConfig,
    from: &str,
    image: Option<&str>,
    credentials: &Option<Credentials>,
) -> BuildSource {
    let from = image.unwrap_or(from);
    let repo = from.split([':', '@']).next().unwrap_or("");
    if matches!(repo, "e2bdev/base" | "docker.io/e2bdev/base") {
        return BuildSource::Template("base".into());
    }
    let plain_name = !from.contains(['/', ':', '@']);
    if plain_name && template::Template::open(&config.layout(), from).is_ok() {
        return BuildSource::Template(from.to_string());
    }
    BuildSource::Image {
        reference: from.to_string(),
        credentials: credentials.clone(),
        // The operator's own build, on the host: any registry.
        reach: siesta_image::Reach::Anywhere,
    }
}

fn print_built(t: &template::Template) {
    println!(
        "template {} built: cold boot {:.0} ms, memory {} MiB allocated, state {} KiB ({} {}, {})",
        t.record.name,
        t.record.cold_boot_ms,
        t.record.memory.allocated >> 20,
        t.record.state.size >> 10,
        t.record.vmm.kind,
        t.record.vmm.version,
        t.record.vmm.accel,
    );
}

fn list(config: &NodeConfig, json: bool) -> anyhow::Result<()> {
    let templates = template::list(&config.layout())?;
    if json {
        let records: Vec<_> = templates.iter().map(|t| &t.record).collect();
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<8} {:>6} {:>8} {:>10}  CREATED",
        "NAME", "IMAGE", "VCPUS", "MEM_MIB", "ACCEL"
    );
    for t in &templates {
        let r = &t.record;
        println!(
            "{:<16} {:<8} {:>6} {:>8} {:>10}  {}",
            r.name,
            r.image,
            r.vcpus,
            r.memory_mib,
            r.vmm.accel.as_str(),
            r.created_at
        );
    }
    Ok(())
}

/// Why `--if-missing` rebuilds an existing template, if it does: it was
/// frozen with another device set than VMMs get now (no VMM could restore
/// it), or booted from older guest assets.
fn stale(config: &NodeConfig, t: &template::Template) -> Option<&'static str> {
    if t.record.vmm.devices != siesta_vmm::DEVICE_SET {
        return Some("was frozen with another set of devices than VMMs have now");
    }
    booted_from_older_assets(config, t)
        .then_some("was booted from an older guest kernel, initramfs or agent")
}

/// Whether `t`, a template booted straight from the guest assets (not one
/// built on another template or an image, which are the user's), was booted
/// from other assets than today's: it would lack what they added.
fn booted_from_older_assets(config: &NodeConfig, t: &template::Template) -> bool {
    if t.record.parent.is_some() || t.record.source_image.is_some() {
        return false;
    }
    match template::record::guest_assets_digest(&config.layout()) {
        Ok(now) => t.record.guest_assets.as_deref() != Some(now.as_str()),
        Err(_) => false, // no assets to compare with: keep what is there
    }
}

/// `--if-missing` on a template that exists: records its startup manifest
/// if an earlier build could not, else nothing to do.
async fn complete_existing(config: NodeConfig, t: template::Template) -> anyhow::Result<ExitCode> {
    let name = t.record.name.clone();
    let needs_manifest = t.snapshot.as_ref().is_some_and(|s| s.manifest.is_none());
    if !(needs_manifest && config.record_manifest) {
        println!("template {name} exists");
        return Ok(ExitCode::SUCCESS);
    }
    println!("template {name} exists without its startup manifest: recording it");
    let node = Node::start(config).await?;
    let recorded = template::record_startup_manifest(&node, &t).await;
    node.shutdown().await;
    let m = recorded.map_err(|e| {
        anyhow::anyhow!(
            "recording the startup manifest of {name}: {e} (`siesta doctor` checks the node)"
        )
    })?;
    print_manifest(&m);
    Ok(ExitCode::SUCCESS)
}

fn print_manifest(m: &template::RecordedManifest) {
    println!(
        "startup manifest: {:.1} MiB in {} ranges, {} samples until ready ({:.0} ms)",
        m.bytes as f64 / (1 << 20) as f64,
        m.ranges,
        m.samples,
        m.ready_ms
    );
}
