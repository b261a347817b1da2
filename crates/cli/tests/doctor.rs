//! `siesta doctor` and `siesta serve` on a host that lacks `qemu-img`: both
//! exit non-zero and name the command and its package, and `serve` does
//! not start listening.
//!
//! The host is the real one with one program hidden: PATH is a temporary
//! directory of symlinks to everything on the real PATH but `qemu-img`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SIESTA: &str = env!("CARGO_BIN_EXE_siesta");

/// A directory of symlinks to every program on PATH except `hidden`.
fn path_without(hidden: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = std::env::var_os("PATH").unwrap_or_default();
    for bin_dir in std::env::split_paths(&path) {
        let Ok(entries) = std::fs::read_dir(&bin_dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let link = dir.path().join(&name);
            if name == hidden || link.symlink_metadata().is_ok() {
                continue;
            }
            std::os::unix::fs::symlink(entry.path(), &link).expect("symlink");
        }
    }
    assert!(!dir.path().join(hidden).exists());
    dir
}

fn run(path: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(SIESTA)
        .args(args)
        .env("PATH", path)
        .env("SIESTA_HOME", home)
        .output()
        .expect("run siesta")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn doctor_and_serve_refuse_a_host_without_qemu_img() {
    let path = path_without("qemu-img");
    let home = tempfile::tempdir().expect("temp home");
    // Open to every local user, as a home made under umask 022 is.
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let doctor = run(path.path(), home.path(), &["doctor"]);
    let said = text(&doctor);
    assert!(
        !doctor.status.success(),
        "doctor passed without qemu-img:\n{said}"
    );
    let line = said
        .lines()
        .find(|l| l.starts_with("FAIL") && l.contains("qemu-img"))
        .unwrap_or_else(|| panic!("no FAIL line for qemu-img:\n{said}"));
    assert!(line.contains("qemu-utils"), "{line}");

    let json = run(path.path(), home.path(), &["doctor", "--output", "json"]);
    assert!(!json.status.success());
    let report: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("doctor --output json prints JSON");
    assert_eq!(report["ready"], false);
    let check = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "qemu-img")
        .expect("a qemu-img check");
    assert_eq!(check["status"], "fail");
    assert!(check["fix"].as_str().unwrap_or("").contains("qemu-utils"));
    let access = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "home-access")
        .expect("a home-access check");
    assert_eq!(access["status"], "warn", "{access}");

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = run(path.path(), home.path(), &["serve", "--listen", &listen]);
    let said = text(&serve);
    assert!(
        !serve.status.success(),
        "serve started without qemu-img:\n{said}"
    );
    assert!(said.contains("not starting"), "{said}");
    assert!(
        said.contains("qemu-img") && said.contains("qemu-utils"),
        "{said}"
    );
    // It refused before creating anything: no key, no database.
    assert!(!home.path().join("secrets").exists());
    assert!(!home.path().join("siesta.db").exists());
    // But it closed the home to other users first.
    let mode = std::fs::metadata(home.path())
        .expect("home")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o700,
        "serve left the home {:o}",
        mode & 0o777
    );
}

#[test]
fn doctor_json_lists_every_check() {
    let home = tempfile::tempdir().expect("temp home");
    let out = Command::new(SIESTA)
        .args(["doctor", "--output", "json"])
        .env("SIESTA_HOME", home.path())
        .output()
        .expect("run siesta doctor");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for want in [
        "qemu",
        "qemu-img",
        "nft",
        "ip",
        "netns",
        "accelerator",
        "isolation",
        "vmm-cgroups",
        "vmm-users",
        "guest assets",
        "template",
        "disk",
        "database",
        "home-access",
    ] {
        assert!(names.contains(&want), "no {want} check in {names:?}");
    }
    // A fresh home has no template: a warning, which alone does not fail.
    let template = &report["checks"][names.iter().position(|n| *n == "template").unwrap()];
    assert_eq!(template["status"], "warn");
    assert_eq!(out.status.success(), report["ready"] == true);
    assert_eq!(PathBuf::from(report["home"].as_str().unwrap()), home.path());
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
