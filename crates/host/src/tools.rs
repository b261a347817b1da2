//! The host programs a node runs, and the Debian package of each.

use std::path::{Path, PathBuf};

/// A program the node runs on the host.
#[derive(Debug, Clone, Copy)]
pub struct HostTool {
    pub command: &'static str,
    /// The Debian package that provides it (what `scripts/install-deps.sh`
    /// installs).
    pub package: &'static str,
    /// What the node needs it for, for the message when it is missing.
    pub used_for: &'static str,
}

/// Every host program the server needs to create, pause and resume
/// sandboxes. (`guest/build-assets.sh` needs more to build guest images;
/// it checks those itself.)
pub const HOST_TOOLS: &[HostTool] = &[
    HostTool {
        command: "qemu-system-x86_64",
        package: "qemu-system-x86",
        used_for: "runs every VM",
    },
    HostTool {
        command: "qemu-img",
        package: "qemu-utils",
        used_for: "creates each sandbox's copy-on-write disk",
    },
    HostTool {
        command: "nft",
        package: "nftables",
        used_for: "NAT and egress policy of network slots",
    },
    HostTool {
        command: "ip",
        package: "iproute2",
        used_for: "network namespaces, veth and tap devices",
    },
    HostTool {
        command: "cp",
        package: "coreutils",
        used_for: "copies disks of snapshots and templates",
    },
];

/// The package that provides `command`, if it is one of [`HOST_TOOLS`].
pub fn package_of(command: &str) -> Option<&'static str> {
    let name = Path::new(command)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(command);
    HOST_TOOLS
        .iter()
        .find(|t| t.command == name)
        .map(|t| t.package)
}

/// Where `command` is: itself when it names a path, else the first
/// executable file of that name in `$PATH`.
pub fn find_on_path(command: &Path) -> Option<PathBuf> {
    if command.components().count() > 1 {
        return is_executable(command).then(|| command.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_are_named_by_command_or_path() {
        assert_eq!(package_of("qemu-img"), Some("qemu-utils"));
        assert_eq!(
            package_of("/usr/bin/qemu-system-x86_64"),
            Some("qemu-system-x86")
        );
        assert_eq!(package_of("unknown-tool"), None);
    }

    #[test]
    fn a_path_is_found_only_when_executable() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tool");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        assert_eq!(find_on_path(&file), None);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_on_path(&file), Some(file.clone()));
        assert!(find_on_path(Path::new("sh")).is_some());
        assert_eq!(find_on_path(Path::new("no-such-command-siesta")), None);
    }
}
