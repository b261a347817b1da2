//! Disks a VMM receives after it has started: a waiting VMM's disk replaced
//! by a two-level chain, and checkpoints, against a real QEMU.
//!
//! As root, the VMM drops to a user of its own, and every file lives in a
//! 0700 root directory that user cannot enter: an image QEMU opened by path
//! after the drop would fail with "Permission denied", so passing means each
//! file reached it as a descriptor.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use siesta_vmm::qemu::QemuVmm;
use siesta_vmm::vmm_users::{VmmUsers, DEFAULT_UID_BASE};
use siesta_vmm::{
    AccelChoice, DiskFormat, DiskSpec, LaunchMode, LaunchSpec, MemoryBacking, VmInstance, Vmm,
};

const MEMORY_MIB: u64 = 128;

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn qemu_img(args: &[&str]) -> String {
    let out = Command::new("qemu-img").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `image`'s backing file as `qemu-img info` reads it.
fn backing_name(image: &Path) -> Option<String> {
    let info = qemu_img(&["info", "-U", "--output=json", image.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    v["backing-filename"].as_str().map(str::to_string)
}

fn overlay(dir: &Path, name: &str, backing: &Path, format: &str) -> PathBuf {
    let p = dir.join(name);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        format,
        "-b",
        backing.to_str().unwrap(),
        p.to_str().unwrap(),
    ]);
    p
}

fn spec(dir: &Path, kernel: &Path, id: &str, mode: LaunchMode, disk: &Path) -> LaunchSpec {
    LaunchSpec {
        id: id.into(),
        run_dir: dir.join(id),
        vcpus: 1,
        memory_mib: MEMORY_MIB,
        kernel: kernel.to_path_buf(),
        initrd: None,
        cmdline: "console=ttyS0".into(),
        memory: MemoryBacking {
            path: dir.join("mem.img"),
            shared: false,
            prealloc: false,
        },
        disk: Some(DiskSpec {
            path: disk.to_path_buf(),
            format: DiskFormat::Qcow2,
            read_only: false,
            backing: None,
        }),
        net: None,
        mode,
        serial_log: false,
    }
}

/// The VMM runs as a VMM user (as root), so what it opened later cannot
/// have been opened by path.
fn assert_unprivileged(vm: &dyn VmInstance, as_root: bool) {
    if !as_root {
        return;
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", vm.pid())).unwrap();
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap();
    assert!(uid >= DEFAULT_UID_BASE, "QEMU runs as uid {uid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disks_given_after_start_reach_an_unprivileged_vmm_as_descriptors() {
    let Some(qemu) = find_on_path("qemu-system-x86_64") else {
        let must_run =
            std::env::var_os("CI").is_some() || std::env::var_os("SIESTA_TESTS_MUST_RUN").is_some();
        assert!(!must_run, "qemu-system-x86_64 is not installed");
        eprintln!("SKIPPED: qemu-system-x86_64 is not installed");
        return;
    };
    let home = std::env::var_os("SIESTA_HOME")
        .map_or_else(|| PathBuf::from("/var/lib/siesta"), PathBuf::from);
    let kernel = home.join("assets/vmlinuz");
    assert!(
        kernel.is_file(),
        "guest kernel {} missing",
        kernel.display()
    );

    let tmp = tempfile::Builder::new()
        .prefix("siesta-disks-")
        .tempdir_in("/tmp")
        .unwrap();
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::File::create(dir.join("mem.img"))
        .unwrap()
        .set_len(MEMORY_MIB << 20)
        .unwrap();
    let base = dir.join("base.raw");
    qemu_img(&["create", "-q", "-f", "raw", base.to_str().unwrap(), "64M"]);
    let pool_disk = overlay(dir, "pool.qcow2", &base, "raw");
    let mid = overlay(dir, "mid.qcow2", &base, "raw");
    let sandbox_disk = overlay(dir, "sandbox.qcow2", &mid, "qcow2");

    let as_root = nix::unistd::geteuid().is_root();
    let mut vmm = QemuVmm::new(qemu, AccelChoice::Auto).expect("QEMU backend");
    let users = VmmUsers::default_range();
    if as_root {
        vmm = vmm.with_vmm_users(users.clone());
    }

    // A waiting VMM takes another disk whose chain is two files deep.
    let mut waiting = vmm
        .spawn(&spec(dir, &kernel, "w", LaunchMode::Incoming, &pool_disk))
        .await
        .expect("spawn a waiting VMM");
    assert_unprivileged(waiting.as_ref(), as_root);
    let missing = DiskSpec {
        path: dir.join("missing.qcow2"),
        format: DiskFormat::Qcow2,
        read_only: false,
        backing: None,
    };
    let e = waiting.replace_disk(missing).await.unwrap_err();
    assert!(e.to_string().contains("missing.qcow2"), "{e}");
    waiting
        .replace_disk(DiskSpec {
            path: sandbox_disk.clone(),
            format: DiskFormat::Qcow2,
            read_only: false,
            backing: None,
        })
        .await
        .expect("replace the disk after a failed try");
    waiting.shutdown().await.expect("shutdown");

    // A booted VM's disk is checkpointed twice: each overlay is created by
    // the server, names the image below it by path, and is written by QEMU.
    let mut booted = vmm
        .spawn(&spec(dir, &kernel, "b", LaunchMode::Boot, &pool_disk))
        .await
        .expect("spawn a VMM to boot");
    assert_unprivileged(booted.as_ref(), as_root);
    let first = dir.join("ck1.qcow2");
    let second = dir.join("ck2.qcow2");
    booted.checkpoint_disk(&first).await.expect("checkpoint 1");
    booted.checkpoint_disk(&second).await.expect("checkpoint 2");
    let e = booted.checkpoint_disk(&first).await.unwrap_err();
    assert!(e.to_string().contains("exists already"), "{e}");
    booted.shutdown().await.expect("shutdown");
    assert_eq!(
        backing_name(&second).as_deref(),
        first.to_str(),
        "the second overlay names the first by path"
    );
    assert_eq!(backing_name(&first).as_deref(), pool_disk.to_str());
    drop((waiting, booted));
    assert_eq!(users.in_use(), 0, "a reaped VMM's user was not given back");
}
