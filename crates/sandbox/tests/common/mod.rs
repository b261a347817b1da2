//! Helpers shared by the real-VM tests.

use std::collections::HashSet;
use std::path::PathBuf;

use siesta_sandbox::SandboxManager;

/// The guest assets built by `make assets`.
pub fn assets_dir() -> PathBuf {
    std::env::var_os("SIESTA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/siesta"))
        .join("assets")
}

/// `Err(why)` when this machine cannot run VMs for tests.
pub fn prerequisites() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root (network namespaces need it)".into());
    }
    for f in ["vmlinuz", "initramfs.img", "rootfs-base.img"] {
        let path = assets_dir().join(f);
        if !path.exists() {
            return Err(format!("{} missing (run `make assets`)", path.display()));
        }
    }
    Ok(())
}

/// True when the test should go on; prints why not, and under CI (or
/// `make test`, which sets `SIESTA_TESTS_MUST_RUN`) fails instead of
/// skipping.
pub fn can_run_vms() -> bool {
    match prerequisites() {
        Ok(()) => true,
        Err(why)
            if std::env::var_os("CI").is_some()
                || std::env::var_os("SIESTA_TESTS_MUST_RUN").is_some() =>
        {
            panic!("VM test cannot run under CI: {why}")
        }
        Err(why) => {
            eprintln!("skipping VM test: {why}");
            false
        }
    }
}

/// Names of the network namespaces that exist now.
pub fn netns_names() -> HashSet<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Namespaces named `prefix...` (one node's) that exist now but not in
/// `before`: what a test left behind.
#[allow(dead_code)] // not every test binary uses it
pub fn new_namespaces(before: &HashSet<String>, prefix: &str) -> Vec<String> {
    netns_names()
        .difference(before)
        .filter(|n| n.starts_with(prefix))
        .cloned()
        .collect()
}

/// Runs `cmd` in sandbox `id`, asserts it exited 0, returns its stdout.
#[allow(dead_code)] // not every test binary uses it
pub async fn exec_ok(m: &SandboxManager, id: &str, cmd: &str) -> String {
    let out = m
        .exec(id, cmd, None, |_, _| {})
        .await
        .unwrap_or_else(|e| panic!("exec {cmd:?} in {id}: {e}"));
    assert_eq!(
        out.exit_code,
        0,
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A node configuration in `home` whose network tag is unique to this test
/// process and binary (`suffix`, a lowercase letter), on a subnet of its
/// own: never a server's or another test's slots.
#[allow(dead_code)] // not every test binary uses it
pub fn node_config(home: &std::path::Path, suffix: char) -> siesta_sandbox::NodeConfig {
    let mut config = siesta_sandbox::NodeConfig::new(home);
    config.net_tag = std::process::id()
        .to_string()
        .bytes()
        .rev()
        .take(5)
        .map(|d| (b'a' + (d - b'0')) as char)
        .chain(std::iter::once(suffix))
        .collect();
    // Never the default 10.250.0.0/16 of a server that may run meanwhile
    // (`make up`); one /16 per suffix.
    config.net_subnet =
        siesta_net::Subnet::ten_slash_16(100 + (suffix as u8).wrapping_sub(b'a') % 26);
    config.warm_slots = 1;
    config.boot_ready_timeout = std::time::Duration::from_secs(240);
    config.resume_ready_timeout = std::time::Duration::from_secs(60);
    config
}
