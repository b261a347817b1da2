//! Disks a VMM receives, against a real QEMU: a waiting VMM's disk replaced
//! by a two-level chain, checkpoints, and images whose headers were
//! rewritten as a VMM taken over would rewrite them.
//!
//! As root, the VMM drops to a user of its own, and every file lives in a
//! 0700 root directory that user cannot enter: an image QEMU opened by path
//! after the drop would fail with "Permission denied", so passing means each
//! file reached it as a descriptor.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use siesta_vmm::qemu::QemuVmm;
use siesta_vmm::vmm_users::{VmmUsers, DEFAULT_LOCK_FILE, DEFAULT_UID_BASE};
use siesta_vmm::{
    AccelChoice, BackingFile, DiskFormat, DiskSpec, LaunchMode, LaunchSpec, MemoryBacking,
    VmInstance, Vmm,
};

mod common;

const MEMORY_MIB: u64 = 128;

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

/// A qcow2 `overlay` of 64 MiB whose header names `named` as its backing
/// file, made without opening it: what a VMM taken over could write.
fn hostile_overlay(dir: &Path, name: &str, named: &Path) -> PathBuf {
    let p = dir.join(name);
    qemu_img(&[
        "create",
        "-q",
        "-u",
        "-f",
        "qcow2",
        "-F",
        "raw",
        "-b",
        named.to_str().unwrap(),
        p.to_str().unwrap(),
        "64M",
    ]);
    p
}

/// Whether process `pid` holds `path` open.
fn holds_open(pid: u32, path: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
}

/// A writable qcow2 `image` over the files `below` (nearest first).
fn qcow2_over(image: &Path, below: &[(&Path, DiskFormat)]) -> DiskSpec {
    DiskSpec {
        path: image.to_path_buf(),
        format: DiskFormat::Qcow2,
        read_only: false,
        backing: below
            .iter()
            .map(|&(p, format)| BackingFile {
                path: p.to_path_buf(),
                format,
            })
            .collect(),
    }
}

fn spec(dir: &Path, kernel: &Path, id: &str, mode: LaunchMode, disk: DiskSpec) -> LaunchSpec {
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
        disk: Some(disk),
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
    // The uid's host-wide lock stays with the server: a QEMU holding it
    // could unlock its uid for another siesta process to hand out.
    assert!(!holds_open(vm.pid(), Path::new(DEFAULT_LOCK_FILE)));
    // And it is chrooted into an empty directory: no path opens anything.
    let root = std::fs::read_link(format!("/proc/{}/root", vm.pid())).unwrap();
    assert_eq!(
        root,
        Path::new(DEFAULT_LOCK_FILE).with_file_name("vmm-root")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disks_given_after_start_reach_an_unprivileged_vmm_as_descriptors() {
    let Some(qemu) = common::qemu_or_skip() else {
        return;
    };
    let kernel = common::guest_kernel();

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

    let raw = DiskFormat::Raw;
    let pool_spec = qcow2_over(&pool_disk, &[(&base, raw)]);
    let sandbox_spec = qcow2_over(&sandbox_disk, &[(&mid, DiskFormat::Qcow2), (&base, raw)]);

    // A waiting VMM takes another disk whose chain is two files deep.
    let mut waiting = vmm
        .spawn(&spec(
            dir,
            &kernel,
            "w",
            LaunchMode::Incoming,
            pool_spec.clone(),
        ))
        .await
        .expect("spawn a waiting VMM");
    assert_unprivileged(waiting.as_ref(), as_root);
    let missing = qcow2_over(&dir.join("missing.qcow2"), &[(&base, raw)]);
    let e = waiting.replace_disk(missing).await.unwrap_err();
    assert!(e.to_string().contains("missing.qcow2"), "{e}");
    waiting
        .replace_disk(sandbox_spec)
        .await
        .expect("replace the disk after a failed try");
    waiting.shutdown().await.expect("shutdown");

    // A booted VM's disk is checkpointed twice: each overlay is created by
    // the server, names the image below it by path, and is written by QEMU.
    let mut booted = vmm
        .spawn(&spec(
            dir,
            &kernel,
            "b",
            LaunchMode::Boot,
            pool_spec.clone(),
        ))
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

    headers_a_vmm_rewrote_name_nothing(&vmm, dir, &kernel, &base, &pool_spec).await;
    assert_eq!(users.in_use(), 0, "a reaped VMM's user was not given back");
}

/// The attacks of a VMM taken over on the next one to open its disk: a
/// header that names a host file as backing (the file named by the server
/// is opened, never that one), and a header asking for an external data
/// file (refused before QEMU or `qemu-img` opens it).
async fn headers_a_vmm_rewrote_name_nothing(
    vmm: &QemuVmm,
    dir: &Path,
    kernel: &Path,
    base: &Path,
    pool_spec: &DiskSpec,
) {
    let secret = dir.join("secret.raw");
    std::fs::write(&secret, vec![0x5a; 64 << 20]).unwrap();
    let raw = DiskFormat::Raw;
    let hostile = hostile_overlay(dir, "hostile.qcow2", &secret);
    let hostile_spec = qcow2_over(&hostile, &[(base, raw)]);

    // Started on it (QEMU opens its command line as root)...
    let mut vm = vmm
        .spawn(&spec(
            dir,
            kernel,
            "h1",
            LaunchMode::Boot,
            hostile_spec.clone(),
        ))
        .await
        .expect("spawn on a disk whose header names another backing file");
    assert!(holds_open(vm.pid(), &hostile) && holds_open(vm.pid(), base));
    assert!(!holds_open(vm.pid(), &secret), "QEMU followed the header");
    vm.shutdown().await.expect("shutdown");
    // ... and handed it while waiting.
    let mut vm = vmm
        .spawn(&spec(
            dir,
            kernel,
            "h2",
            LaunchMode::Incoming,
            pool_spec.clone(),
        ))
        .await
        .expect("spawn a waiting VMM");
    vm.replace_disk(hostile_spec)
        .await
        .expect("replace the disk");
    assert!(!holds_open(vm.pid(), &secret), "QEMU followed the header");
    vm.shutdown().await.expect("shutdown");

    // An external data file: QEMU would open it read-write as root.
    let data_file = dir.join("data-file.raw");
    let with_data = dir.join("with-data.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={}", data_file.display()),
        with_data.to_str().unwrap(),
        "64M",
    ]);
    let with_data_spec = qcow2_over(&with_data, &[]);
    let refused = vmm
        .spawn(&spec(
            dir,
            kernel,
            "h3",
            LaunchMode::Boot,
            with_data_spec.clone(),
        ))
        .await;
    let Err(e) = refused else {
        panic!("a VMM was started on an image with an external data file");
    };
    assert!(e.to_string().contains("external data file"), "{e}");
    let mut vm = vmm
        .spawn(&spec(
            dir,
            kernel,
            "h4",
            LaunchMode::Incoming,
            pool_spec.clone(),
        ))
        .await
        .expect("spawn a waiting VMM");
    let e = vm.replace_disk(with_data_spec).await.unwrap_err();
    assert!(e.to_string().contains("external data file"), "{e}");
    assert!(!holds_open(vm.pid(), &data_file));
    vm.shutdown().await.expect("shutdown");
}
