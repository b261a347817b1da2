//! Volumes mounted at `/init`: NFSv3 exports the host serves inside the
//! sandbox's own network namespace (see `siesta_volume::nfs`).
//!
//! Mounting is idempotent: a resumed or forked guest already has its
//! mounts (they are part of the kernel state in the snapshot), and its
//! NFS client reconnects to the new server by itself.

use std::path::Path;

use nix::mount::{mount, MsFlags};
use siesta_envd_proto::NfsMount;

/// Mounts every export not mounted yet; the first failure is the error.
pub fn ensure(mounts: &[NfsMount]) -> Result<(), String> {
    for m in mounts {
        check(m)?;
    }
    for m in mounts {
        if is_nfs_mount(&m.path) {
            continue;
        }
        mount_one(m)?;
        tracing::info!(path = %m.path, addr = %m.addr, port = m.port, "volume mounted");
    }
    Ok(())
}

fn check(m: &NfsMount) -> Result<(), String> {
    let path = Path::new(&m.path);
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        || m.path == "/"
    {
        return Err(format!(
            "mount path {:?}: give an absolute path other than /, without `..`",
            m.path
        ));
    }
    m.addr
        .parse::<std::net::Ipv4Addr>()
        .map_err(|_| format!("mount server {:?} is not an IPv4 address", m.addr))?;
    Ok(())
}

fn mount_one(m: &NfsMount) -> Result<(), String> {
    std::fs::create_dir_all(&m.path)
        .map_err(|e| format!("creating mount point {}: {e}", m.path))?;
    // The kernel's own NFS client, without mount.nfs: it talks MOUNT itself
    // given mountaddr/mountport. `nolock`: the server has no lock manager
    // (locks stay local to the guest); `noacl`: nor the NFSACL protocol.
    let options = format!(
        "vers=3,proto=tcp,port={p},mountport={p},mountproto=tcp,addr={a},mountaddr={a},nolock,noacl,hard,timeo=600,retrans=2",
        p = m.port,
        a = m.addr,
    );
    let source = format!("{}:/", m.addr);
    mount(
        Some(source.as_str()),
        m.path.as_str(),
        Some("nfs"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ENODEV => format!(
            "mounting the volume at {}: this guest's kernel has no NFS client loaded \
             (the template was built before siesta could mount volumes): rebuild the template",
            m.path
        ),
        e => format!(
            "mounting the volume at {} from {}:{}: {e}",
            m.path, m.addr, m.port
        ),
    })
}

/// Whether `path` is the mount point of an NFS mount now.
fn is_nfs_mount(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .map(|t| {
            t.lines().any(|l| {
                let mut f = l.split_whitespace();
                let (_, point, fstype) = (f.next(), f.next(), f.next());
                point == Some(path) && fstype.is_some_and(|t| t.starts_with("nfs"))
            })
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(path: &str, addr: &str) -> NfsMount {
        NfsMount {
            path: path.into(),
            addr: addr.into(),
            port: 2049,
        }
    }

    #[test]
    fn paths_and_addresses_are_checked_first() {
        assert!(check(&m("/mnt/data", "169.254.0.22")).is_ok());
        for bad in ["mnt/data", "/", "/mnt/../etc"] {
            assert!(check(&m(bad, "169.254.0.22")).is_err(), "{bad}");
        }
        assert!(check(&m("/mnt/data", "nfs.example")).is_err());
        // Nothing is mounted when one entry is bad.
        assert!(ensure(&[m("/mnt/ok", "169.254.0.22"), m("rel", "169.254.0.22")]).is_err());
    }
}
