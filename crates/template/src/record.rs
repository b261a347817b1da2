//! The JSON record that describes a template snapshot.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, IoContext, Result};

pub const RECORD_FILE: &str = "template.json";
pub const MEMORY_FILE: &str = "memory.img";
pub const STATE_FILE: &str = "state.bin";
pub const DISK_FILE: &str = "disk.img";

/// One file of a snapshot, with what is needed to check it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub name: String,
    /// Apparent size in bytes.
    pub size: u64,
    /// Bytes actually allocated on disk (memory and disk files are sparse).
    pub allocated: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateRecord {
    pub name: String,
    /// The root filesystem image it was built from (`base`, `tiny`).
    pub image: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub vcpus: u32,
    pub memory_mib: u32,
    /// The VMM that made it; a snapshot only restores on the same.
    pub vmm: siesta_vmm::VmmInfo,
    pub kernel: String,
    pub kernel_cmdline: String,
    pub memory: FileRecord,
    pub state: FileRecord,
    pub disk: FileRecord,
    /// Time from spawning the VMM to the agent's first `/health` answer.
    pub cold_boot_ms: f64,
    /// What sandboxes of this template start with (from its build steps).
    #[serde(default)]
    pub defaults: TemplateDefaults,
    /// The template it was built from, for a template built with steps.
    #[serde(default)]
    pub parent: Option<String>,
    /// Digest of everything the build read (parent snapshot, steps, copied
    /// files, start and ready commands, size): an unchanged build reuses
    /// the template instead of building it again.
    #[serde(default)]
    pub build_key: Option<String>,
    /// The OCI image it was built from, for a template built from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_image: Option<SourceImage>,
    /// Digest of the guest kernel, initramfs and agent it booted with (see
    /// [`guest_assets_digest`]): a template booted from older assets lacks
    /// what they added since (the NFS client for volumes, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_assets: Option<String>,
}

/// The image a template was built from, and its config as the image had it
/// (`Entrypoint`, `Cmd` and `ExposedPorts` are recorded, not started).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceImage {
    pub reference: String,
    pub digest: String,
    pub config: siesta_image::ImageConfig,
}

/// The environment a template's sandboxes start in: set by ENV, USER and
/// WORKDIR steps and the start command of its build.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateDefaults {
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub guest: siesta_envd_client::GuestDefaults,
    /// Started before the template was frozen: its sandboxes resume with
    /// it running.
    #[serde(default)]
    pub start_cmd: Option<String>,
}

impl TemplateRecord {
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(RECORD_FILE);
        let text = std::fs::read_to_string(&path).ctx("reading template record", &path)?;
        serde_json::from_str(&text).map_err(|e| Error::CorruptSnapshot {
            path,
            detail: format!("bad record: {e}"),
        })
    }

    /// Writes the record atomically: a reader sees the old record or the new
    /// one, never half of one; a template without a record does not exist.
    pub fn store(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RECORD_FILE);
        let tmp = dir.join(format!("{RECORD_FILE}.tmp"));
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| crate::error::internal("encoding a template record", e))?;
        write_synced(&tmp, &text)?;
        std::fs::rename(&tmp, &path).ctx("publishing template record", &path)?;
        sync_dir(dir)
    }

    /// Checks sizes of the snapshot files in a legacy template directory.
    pub fn verify_sizes(&self, dir: &Path) -> Result<()> {
        for f in [&self.memory, &self.state, &self.disk] {
            check_size(&dir.join(&f.name), f)?;
        }
        Ok(())
    }
}

/// A snapshot file whose size is not the recorded one is corrupt.
pub(crate) fn check_size(path: &Path, f: &FileRecord) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| Error::CorruptSnapshot {
        path: path.to_path_buf(),
        detail: format!("cannot stat: {e}"),
    })?;
    if meta.len() != f.size {
        return Err(Error::CorruptSnapshot {
            path: path.to_path_buf(),
            detail: format!("size {} but the record says {}", meta.len(), f.size),
        });
    }
    Ok(())
}

/// Size, allocation and SHA-256 of a file.
pub fn file_record(path: &Path) -> Result<FileRecord> {
    use std::os::unix::fs::MetadataExt;
    let mut file = std::fs::File::open(path).ctx("opening snapshot file", path)?;
    let meta = file.metadata().ctx("stat of snapshot file", path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).ctx("reading snapshot file", path)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(FileRecord {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        size: meta.len(),
        allocated: meta.blocks() * 512,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// [`file_record`] of a template's memory, state and disk, on a blocking
/// thread: they are gigabytes, and hashing them on an async worker would
/// stall every request that worker serves for as long.
pub(crate) async fn file_records(
    memory: &Path,
    state: &Path,
    disk: &Path,
) -> Result<[FileRecord; 3]> {
    let [memory, state, disk] = [memory, state, disk].map(Path::to_path_buf);
    siesta_host::blocking::run("hashing a template's files", move || {
        Ok([
            file_record(&memory)?,
            file_record(&state)?,
            file_record(&disk)?,
        ])
    })
    .await
}

/// [`guest_assets_digest`] on a blocking thread (it reads the kernel,
/// initramfs and agent whole).
pub(crate) async fn guest_assets_digest_off_thread(
    layout: siesta_host::layout::Layout,
) -> Result<String> {
    siesta_host::blocking::run("hashing the guest assets", move || {
        guest_assets_digest(&layout)
    })
    .await
}

/// SHA-256 over the guest kernel, initramfs and agent a cold boot uses
/// now (the agent in the root images is the one in `assets/`).
pub fn guest_assets_digest(layout: &siesta_host::layout::Layout) -> Result<String> {
    let mut hasher = Sha256::new();
    for path in [layout.kernel(), layout.initrd(), layout.agent_bin()] {
        match std::fs::read(&path) {
            Ok(bytes) => hasher.update(Sha256::digest(&bytes)),
            // Older asset directories have no agent copy.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && path == layout.agent_bin() => {}
            Err(e) => return Err(e).ctx("reading guest asset", &path),
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).ctx("creating", path)?;
    f.write_all(bytes).ctx("writing", path)?;
    f.sync_all().ctx("syncing", path)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("syncing directory", dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_record_hashes_content() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, b"abc").unwrap();
        let r = file_record(&p).unwrap();
        assert_eq!(r.size, 3);
        assert_eq!(
            r.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
