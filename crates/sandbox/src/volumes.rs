//! Volume mounts: which volumes a sandbox has and where, the NFS exports
//! that serve them inside its slot while it runs, and what its guest is
//! told to mount at `/init`.
//!
//! A mount is part of the sandbox's record, so it holds across pause,
//! resume and a restart of the server; forks and sandboxes made from a
//! user snapshot get the same mounts (the volume is shared, not copied).
//! The exports start in the resume path before the guest runs, and stop
//! with the VM, before its slot goes back to the pool.

use std::net::SocketAddrV4;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use siesta_envd_proto::NfsMount;
use siesta_net::layout::GATEWAY_ADDR;
use siesta_net::Slot;
use siesta_volume::nfs::{NfsExport, NFS_BASE_PORT};
use siesta_volume::Volumes;

use crate::error::{Error, Result};

/// Most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 16;

/// One volume mounted in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The volume's id: its name could be taken again by another volume.
    pub volume_id: String,
    /// Its name when the sandbox was created (what the API reports).
    pub name: String,
    /// Absolute path in the guest.
    pub path: String,
}

/// Checks a create request's mounts: absolute, distinct paths, at most
/// [`MAX_MOUNTS`].
pub fn check_mounts(mounts: &[VolumeMount]) -> Result<()> {
    if mounts.len() > MAX_MOUNTS {
        return Err(Error::Invalid(format!(
            "volumeMounts: at most {MAX_MOUNTS} volumes per sandbox"
        )));
    }
    for (i, m) in mounts.iter().enumerate() {
        // Spelled plainly: `/a/b`, no `.`, `..` or empty parts, so one
        // directory has one spelling and duplicates are seen.
        let parts: Vec<&str> = m.path.trim_end_matches('/').split('/').collect();
        let plain = parts.len() > 1
            && parts[0].is_empty()
            && parts[1..]
                .iter()
                .all(|p| !p.is_empty() && *p != "." && *p != "..");
        if !plain {
            return Err(Error::Invalid(format!(
                "volumeMounts: mount path {:?} of volume {:?} must be absolute, not /, and without `.`, `..` or `//`",
                m.path, m.name
            )));
        }
        if let Some(other) = mounts[..i]
            .iter()
            .find(|o| o.path.trim_end_matches('/') == m.path.trim_end_matches('/'))
        {
            return Err(Error::Invalid(format!(
                "volumeMounts: volumes {:?} and {:?} are both mounted at {}",
                other.name, m.name, m.path
            )));
        }
    }
    Ok(())
}

/// Where the guest reaches the export of its `index`-th mount.
fn export_addr(index: usize) -> SocketAddrV4 {
    SocketAddrV4::new(GATEWAY_ADDR, NFS_BASE_PORT + index as u16)
}

/// What `/init` tells the guest to mount.
pub fn guest_mounts(mounts: &[VolumeMount]) -> Vec<NfsMount> {
    mounts
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let addr = export_addr(i);
            NfsMount {
                path: m.path.clone(),
                addr: addr.ip().to_string(),
                port: addr.port(),
            }
        })
        .collect()
}

/// The running exports of one sandbox; dropping them stops them.
#[derive(Default)]
pub struct Exports {
    servers: Vec<NfsExport>,
}

impl Exports {
    /// Stops every export, waiting for their threads off the async ones.
    pub async fn stop(self) {
        if self.servers.is_empty() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || drop(self.servers)).await;
    }
}

/// Serves `mounts` inside `slot`'s network namespace, one export each.
/// The volume registry's reads and the exports' threads (started inside
/// the namespace) are set up on a blocking thread, off the resume path's
/// async worker.
pub async fn start_exports(
    id: &str,
    volumes: Option<&Arc<Volumes>>,
    slot: &Slot,
    mounts: &[VolumeMount],
) -> Result<Exports> {
    if mounts.is_empty() {
        return Ok(Exports::default());
    }
    let volumes = volumes.ok_or_else(|| {
        Error::Invalid(format!(
            "sandbox {id} mounts volumes, but this node serves none"
        ))
    })?;
    let (id, volumes, netns, mounts) = (
        id.to_string(),
        Arc::clone(volumes),
        slot.netns_path.clone(),
        mounts.to_vec(),
    );
    crate::blocking::run("starting volume exports", move || {
        export_all(&id, &volumes, &netns, &mounts)
    })
    .await
}

fn export_all(
    id: &str,
    volumes: &Volumes,
    netns: &std::path::Path,
    mounts: &[VolumeMount],
) -> Result<Exports> {
    let mut exports = Vec::with_capacity(mounts.len());
    for (i, m) in mounts.iter().enumerate() {
        let fail = |detail: String| Error::Agent {
            id: id.to_string(),
            detail: format!("serving volume {:?} for {}: {detail}", m.name, m.path),
        };
        let record = volumes.get(&m.volume_id).map_err(|e| fail(e.to_string()))?;
        let fs = volumes.nfs(&record).map_err(|e| fail(e.to_string()))?;
        let export =
            NfsExport::start(netns, export_addr(i), fs).map_err(|e| fail(e.to_string()))?;
        exports.push(export);
    }
    Ok(Exports { servers: exports })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, path: &str) -> VolumeMount {
        VolumeMount {
            volume_id: format!("vol-{name}"),
            name: name.into(),
            path: path.into(),
        }
    }

    #[test]
    fn mount_paths_are_absolute_and_distinct() {
        check_mounts(&[m("a", "/mnt/a"), m("b", "/home/user/b")]).unwrap();
        for bad in ["mnt/a", "/", "/mnt/../etc", "/mnt/./a", ""] {
            assert!(check_mounts(&[m("a", bad)]).is_err(), "{bad:?}");
        }
        let err = check_mounts(&[m("a", "/mnt/x"), m("b", "/mnt/x/")]).unwrap_err();
        assert!(err.to_string().contains("both mounted at"), "{err}");
        let many: Vec<_> = (0..=MAX_MOUNTS)
            .map(|i| m("v", &format!("/m/{i}")))
            .collect();
        assert!(check_mounts(&many).is_err());
    }

    #[test]
    fn each_mount_has_its_own_port_on_the_gateway() {
        let g = guest_mounts(&[m("a", "/mnt/a"), m("b", "/mnt/b")]);
        assert_eq!(g[0].addr, "169.254.0.22");
        assert_eq!((g[0].port, g[1].port), (2049, 2050));
        assert_eq!(g[1].path, "/mnt/b");
    }
}
