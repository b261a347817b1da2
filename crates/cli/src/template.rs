//! `siesta template build|list`.

use std::process::ExitCode;

use siesta_sandbox::template::{self, BuildOptions};
use siesta_sandbox::{Node, NodeConfig};

#[derive(clap::Subcommand)]
pub enum TemplateCommand {
    /// Boot an image, wait for its agent, and freeze it into a template.
    Build {
        /// Template name.
        name: String,
        /// Root filesystem image (`$SIESTA_HOME/assets/rootfs-IMAGE.img`);
        /// defaults to the template name.
        #[arg(long)]
        image: Option<String>,
        /// Rebuild a template that exists.
        #[arg(long)]
        force: bool,
        /// Do nothing when the template exists.
        #[arg(long)]
        if_missing: bool,
    },
    /// List templates.
    List,
}

pub async fn run(cmd: TemplateCommand) -> anyhow::Result<ExitCode> {
    let mut config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    match cmd {
        TemplateCommand::Build {
            name,
            image,
            force,
            if_missing,
        } => {
            // Its own network tag: a build never touches a server's slots.
            config.net_tag = "b".into();
            config.warm_slots = 0;
            if if_missing {
                if let Ok(t) = template::Template::open(&config.layout(), &name) {
                    return complete_existing(config, t).await;
                }
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
        TemplateCommand::List => list(&config)?,
    }
    Ok(ExitCode::SUCCESS)
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

fn list(config: &NodeConfig) -> anyhow::Result<()> {
    println!(
        "{:<16} {:<8} {:>6} {:>8} {:>10}  CREATED",
        "NAME", "IMAGE", "VCPUS", "MEM_MIB", "ACCEL"
    );
    for t in template::list(&config.layout())? {
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
