//! What a template build starts from: a template of this node (its disk
//! copied, grown when asked) or an OCI image (fetched into the blob cache,
//! written as a new disk by `from_image.rs`), and what the build's cache key
//! covers of it.

use std::path::Path;

use crate::build::VmSize;
use crate::derive::{BuildLog, BuildPhase, LogLevel};
use crate::error::{Error, IoContext, Result};
use crate::from_image;
use crate::record::TemplateDefaults;
use crate::steps::{BuildSource, StepsBuild};
use crate::Template;
use siesta_host::disk::copy_sparse;
use siesta_host::Host;

/// What a build starts from, resolved: a template of this node, or an
/// image already in the blob cache.
pub(crate) enum Base {
    Template(Box<Template>),
    Image {
        image: Box<siesta_image::Image>,
        /// The agent the image's guest gets: a new one is a new build.
        agent_sha256: String,
        /// The blob cache its layers are in.
        store: siesta_image::BlobStore,
    },
}

impl Base {
    pub(crate) async fn resolve(node: &Host, source: &BuildSource, log: &BuildLog) -> Result<Self> {
        match source {
            BuildSource::Template(name) => Ok(Base::Template(Box::new(Template::open(
                &node.config.layout(),
                name,
            )?))),
            BuildSource::Image {
                reference,
                credentials,
                reach,
            } => {
                let parsed = siesta_image::ImageSource::parse(reference)?;
                let opts = siesta_image::FetchOptions {
                    credentials: credentials.clone(),
                    insecure_registries: node.config.insecure_registries.clone(),
                    limits: node.config.image_limits(),
                    reach: reach.clone(),
                };
                let store = from_image::open_cache(node)?;
                let image = from_image::fetch(&store, &parsed, &opts, log).await?;
                let agent = node.config.layout().agent_bin();
                let agent_sha256 = tokio::task::spawn_blocking(move || {
                    siesta_image::hash_file(&agent).map_err(Error::from)
                })
                .await
                .map_err(|e| crate::error::internal("hashing the agent", e))??;
                Ok(Base::Image {
                    image: Box::new(image),
                    agent_sha256,
                    store,
                })
            }
        }
    }

    /// What the cache key covers of the base.
    pub(crate) fn id(&self) -> String {
        match self {
            Base::Template(t) => t
                .snapshot
                .as_ref()
                .map_or_else(|| t.record.created_at.to_rfc3339(), |s| s.id.clone()),
            Base::Image {
                image,
                agent_sha256,
                ..
            } => format!("image {} agent {agent_sha256}", image.digest),
        }
    }

    pub(crate) fn size(&self, node: &Host) -> VmSize {
        match self {
            Base::Template(t) => VmSize {
                vcpus: t.record.vcpus,
                memory_mib: t.record.memory_mib,
            },
            Base::Image { .. } => VmSize::of_node(node),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Base::Template(t) => format!("from template {}", t.record.name),
            Base::Image { image, .. } => format!("from image {}", image.reference),
        }
    }

    /// Writes the build VM's disk at `disk`; returns the defaults the steps
    /// start from.
    pub(crate) async fn write_disk(
        &self,
        node: &Host,
        build: &StepsBuild,
        work: &Path,
        disk: &Path,
        log: &BuildLog,
    ) -> Result<TemplateDefaults> {
        match self {
            Base::Template(t) => {
                copy_sparse(&t.disk_path(), disk).await?;
                let want = target_size(disk, build).await?;
                if let Some(mib) = want {
                    log(
                        LogLevel::Info,
                        &BuildPhase::Base,
                        &format!("growing the disk to {mib} MiB"),
                    );
                    grow_disk(disk, mib).await?;
                }
                Ok(t.record.defaults.clone())
            }
            Base::Image { image, store, .. } => {
                let size = from_image::DiskRequest {
                    disk_mib: build.disk_mib,
                    min_free_mib: build.min_free_disk_mib,
                };
                from_image::write_disk(node, store, image, work, disk, size, log).await
            }
        }
    }
}

/// The size a template-based build's disk must grow to, if any: the one
/// asked for, or enough for `min_free_disk_mib` free (ext4's free blocks,
/// read with dumpe2fs).
async fn target_size(disk: &Path, build: &StepsBuild) -> Result<Option<u32>> {
    if let Some(mib) = build.disk_mib {
        return Ok(Some(mib));
    }
    let Some(min_free) = build.min_free_disk_mib else {
        return Ok(None);
    };
    let out = tokio::process::Command::new("dumpe2fs")
        .arg("-h")
        .arg(disk)
        .output()
        .await
        .ctx("running dumpe2fs on", disk)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let (Some(free), Some(block)) = (field("Free blocks:"), field("Block size:")) else {
        return Err(Error::Command {
            what: "dumpe2fs -h on the build disk".into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    };
    let free_mib = (free * block) >> 20;
    if free_mib >= u64::from(min_free) {
        return Ok(None);
    }
    let size_mib = std::fs::metadata(disk)
        .ctx("reading the size of", disk)?
        .len()
        >> 20;
    let grown = size_mib + u64::from(min_free) - free_mib;
    Ok(Some(u32::try_from(grown).unwrap_or(u32::MAX)))
}

/// Grows the ext4 disk at `disk` to `mib` MiB (never shrinks it: a smaller
/// size than the source's is refused).
async fn grow_disk(disk: &Path, mib: u32) -> Result<()> {
    let size = std::fs::metadata(disk)
        .ctx("reading the size of", disk)?
        .len();
    let want = u64::from(mib) << 20;
    if want < size {
        return Err(Error::Invalid(format!(
            "a disk of {mib} MiB is smaller than the source template's {} MiB; templates' disks can only grow",
            size >> 20
        )));
    }
    if want == size {
        return Ok(());
    }
    // The copied disk was in use when its template was frozen: check it
    // (replaying its journal) before resizing, as resize2fs requires.
    let steps: [(&str, Vec<String>); 2] = [
        (
            "e2fsck",
            vec!["-f".into(), "-y".into(), disk.display().to_string()],
        ),
        (
            "resize2fs",
            vec![disk.display().to_string(), format!("{mib}M")],
        ),
    ];
    std::fs::OpenOptions::new()
        .write(true)
        .open(disk)
        .and_then(|f| f.set_len(want))
        .ctx("growing", disk)?;
    for (cmd, args) in steps {
        let out = tokio::process::Command::new(cmd)
            .args(&args)
            .output()
            .await
            .ctx("running a disk tool on", disk)?;
        // e2fsck exits 1 when it fixed something, which is what we want.
        let ok = out.status.success() || (cmd == "e2fsck" && out.status.code() == Some(1));
        if !ok {
            return Err(Error::Command {
                what: format!("{cmd} on the build disk"),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    Ok(())
}
