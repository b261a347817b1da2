//! Keeping `$SIESTA_HOME` to its owner.
//!
//! The home holds every sandbox's access and traffic tokens and env vars
//! (`siesta.db`), volume tokens (`volumes/volumes.db`), user-snapshot
//! records and guest RAM images. With the usual umask (022) all of them
//! would be readable by every local user. So commands that write there
//! create with umask 077 (files 0600, directories 0700), and `siesta serve`
//! also closes the home itself (0700): that covers files an older version
//! left 0644, since nobody else can reach into the directory.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::sys::stat::{umask, Mode};

/// From now on, what this process (and the tools it runs: qemu-img, mkfs,
/// QEMU itself) creates is for its own user only.
pub fn restrict_umask() {
    umask(Mode::from_bits_truncate(0o077));
}

/// Creates `home` if needed and makes it 0700.
pub fn close_home(home: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(home).map_err(|e| with_path(e, home))?;
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| with_path(e, home))
}

/// The permission bits of `home` that let other users in, if any
/// (`siesta doctor` reports them).
pub fn open_bits(home: &Path) -> std::io::Result<u32> {
    let mode = std::fs::metadata(home)
        .map_err(|e| with_path(e, home))?
        .permissions()
        .mode();
    Ok(mode & 0o077)
}

fn with_path(e: std::io::Error, path: &Path) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The umask is the whole process's: the check runs in a child (this
    /// test binary run again for this one test), not among other tests.
    const CHILD: &str = "SIESTA_PRIVATE_HOME_CHILD";

    #[test]
    fn the_home_and_its_databases_are_the_owners_alone() {
        if let Some(home) = std::env::var_os(CHILD) {
            return child(Path::new(&home));
        }
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        // As an older version left it: open to everyone, a file inside.
        std::fs::create_dir(&home).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(open_bits(&home).unwrap(), 0o055);
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "private_home::tests::the_home_and_its_databases_are_the_owners_alone",
                "--nocapture",
            ])
            .env(CHILD, &home)
            .status()
            .unwrap();
        assert!(status.success(), "the child's checks failed: {status}");
    }

    /// What `siesta serve` does first, then the node's databases as it
    /// opens them.
    fn child(home: &Path) {
        // A umask that lets everyone read, as a login shell's does.
        umask(Mode::from_bits_truncate(0o022));
        restrict_umask();
        close_home(home).unwrap();
        assert_eq!(open_bits(home).unwrap(), 0, "the home is 0700");
        let db = home.join(siesta_sandbox::store::DB_FILE);
        drop(siesta_sandbox::store::Store::open(&db).unwrap());
        let volumes = home.join("volumes");
        drop(siesta_volume::Volumes::open(&volumes, 16).unwrap());
        for path in [db, volumes.join("volumes.db")] {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
        let mode = std::fs::metadata(&volumes).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", volumes.display());
    }
}
