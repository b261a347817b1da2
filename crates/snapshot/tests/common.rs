//! Shared helpers of the repository tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use siesta_snapshot::repo::{Placement, PublishFile, PublishRequest};
use siesta_snapshot::SnapshotKind;

pub const MEM: u64 = 64 * 4096;

/// Writes a memory file and a state file for snapshot `id` under `dir`.
pub fn sources(dir: &Path, id: &str, fill: u8) -> (PathBuf, PathBuf) {
    let mem = dir.join(format!("{id}-memory.img"));
    std::fs::write(&mem, vec![fill; MEM as usize]).unwrap();
    let state = dir.join(format!("{id}-state.bin"));
    std::fs::write(&state, format!("state of {id}")).unwrap();
    (mem, state)
}

pub fn request(id: &str, mem: &Path, state: &Path) -> PublishRequest {
    PublishRequest {
        id: id.to_string(),
        kind: SnapshotKind::Template,
        parent: None,
        guest_memory_size: MEM,
        files: vec![
            PublishFile {
                role: "memory".into(),
                source: mem.to_path_buf(),
                placement: Placement::BlobCopy,
                sha256: None,
            },
            PublishFile {
                role: "state".into(),
                source: state.to_path_buf(),
                placement: Placement::LocalCopy,
                sha256: None,
            },
        ],
        existing: vec![],
        aliases: vec![format!("template:{id}")],
        meta: serde_json::json!({"name": id}),
    }
}
