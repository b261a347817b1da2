//! What the real-QEMU tests share: finding QEMU and the guest kernel.

use std::path::{Path, PathBuf};

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// `qemu-system-x86_64` on PATH. `None` (the test skips) only outside CI
/// and `make test` (`SIESTA_TESTS_MUST_RUN`): there a skip would be a pass
/// that checked nothing, so a missing QEMU fails instead.
pub fn qemu_or_skip() -> Option<PathBuf> {
    let qemu = find_on_path("qemu-system-x86_64");
    if qemu.is_none() {
        let must_run =
            std::env::var_os("CI").is_some() || std::env::var_os("SIESTA_TESTS_MUST_RUN").is_some();
        assert!(
            !must_run,
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
        );
        eprintln!("SKIPPED: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)");
    }
    qemu
}

/// The guest kernel `make assets` put in the node's home.
pub fn guest_kernel() -> PathBuf {
    let home = std::env::var_os("SIESTA_HOME")
        .map_or_else(|| PathBuf::from("/var/lib/siesta"), PathBuf::from);
    let kernel = home.join("assets/vmlinuz");
    assert!(
        kernel.is_file(),
        "guest kernel {} missing (make assets)",
        kernel.display()
    );
    kernel
}
