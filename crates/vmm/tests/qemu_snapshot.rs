//! Snapshot and restore of a real guest under QEMU.
//!
//! One test, because booting a kernel under TCG takes seconds: it boots a
//! busybox guest that counts in guest RAM (`TICK n` on the serial port every
//! 0.5 s), saves it as a template (RAM in a shared file, device state only),
//! restores it over a private mapping of that file, saves that VM with its RAM
//! in the state file, restores that in a third VM, and checks each time that
//! the counter goes on from where it stopped. Then the failure paths: a VMM
//! killed under the VM, a truncated and a garbage state file.
//!
//! Needs the guest kernel at `$SIESTA_HOME/assets/vmlinuz` (default
//! `/var/lib/siesta`; `guest/build-kernel.sh` makes it) and busybox-static.
//! Skips only when `qemu-system-x86_64` is not installed.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use siesta_vmm::qemu::QemuVmm;
use siesta_vmm::vmm_users::{VmmUsers, DEFAULT_UID_BASE};
use siesta_vmm::{
    AccelChoice, Cgroups, LaunchMode, LaunchSpec, MemoryBacking, MemorySave, StateWrite,
    VmInstance, Vmm, VmmError,
};

const MEMORY_MIB: u64 = 256;

const INIT: &str = r#"#!/bin/sh
/bin/busybox --install -s
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
echo 0 > /tmp/count
while true; do
  n=$(cat /tmp/count)
  n=$((n + 1))
  echo $n > /tmp/count
  echo "TICK $n" > /dev/ttyS0
  sleep 0.5
done
"#;

/// Holds every VM the test starts. On drop (also when the test panics or
/// times out) each VMM process still running is SIGKILLed by its PID; the
/// instance's own drop then reaps it. A PID whose exit status was collected
/// is never signalled, so a recycled PID cannot be hit.
#[derive(Default)]
struct Vms(Vec<Box<dyn VmInstance>>);

impl Vms {
    fn add(&mut self, vm: Box<dyn VmInstance>) -> usize {
        self.0.push(vm);
        self.0.len() - 1
    }
}

impl std::ops::Index<usize> for Vms {
    type Output = Box<dyn VmInstance>;
    fn index(&self, i: usize) -> &Self::Output {
        &self.0[i]
    }
}

impl std::ops::IndexMut<usize> for Vms {
    fn index_mut(&mut self, i: usize) -> &mut Self::Output {
        &mut self.0[i]
    }
}

impl Drop for Vms {
    fn drop(&mut self) {
        for vm in &mut self.0 {
            if vm.try_exit_status().is_none() {
                eprintln!("cleanup: SIGKILL VM {} (pid {})", vm.id(), vm.pid());
                // SAFETY: plain kill(2) on our own unreaped child.
                unsafe { libc::kill(vm.pid() as i32, libc::SIGKILL) };
            }
        }
    }
}

/// Writes a newc cpio archive (what the kernel unpacks as initramfs).
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn new() -> Self {
        Cpio {
            out: Vec::new(),
            ino: 1,
        }
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.ino += 1;
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.out.len() & 3 != 0 {
            // newc pads names and data to 4 bytes.
            self.out.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

fn build_initramfs(busybox: &Path, out: &Path) {
    let bb = fs::read(busybox).unwrap_or_else(|e| panic!("read {}: {e}", busybox.display()));
    let mut c = Cpio::new();
    for d in [
        "bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp",
    ] {
        c.entry(d, 0o040755, (0, 0), &[]);
    }
    // The kernel opens /dev/console for init before anything is mounted.
    c.entry("dev/console", 0o020600, (5, 1), &[]);
    c.entry("bin/busybox", 0o100755, (0, 0), &bb);
    c.entry("bin/sh", 0o120777, (0, 0), b"busybox");
    c.entry("init", 0o100755, (0, 0), INIT.as_bytes());
    fs::write(out, c.finish()).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
}

/// Every complete `TICK n` line in a serial log.
fn ticks(log: &Path) -> Vec<u64> {
    let text = fs::read(log).unwrap_or_default();
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("TICK ")?.parse().ok())
        .collect()
}

/// Waits until the log shows a tick >= `at_least`; returns all ticks.
async fn wait_tick(log: &Path, at_least: u64, timeout: Duration) -> Vec<u64> {
    let start = Instant::now();
    loop {
        let t = ticks(log);
        if t.last().is_some_and(|&n| n >= at_least) {
            return t;
        }
        assert!(
            start.elapsed() < timeout,
            "no TICK {at_least} within {timeout:?} in {}; log:\n{}",
            log.display(),
            String::from_utf8_lossy(&fs::read(log).unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks that a restored VM's counter continues after `last` (it may skip
/// one: a tick can be cut in the middle of its line at the save).
async fn assert_continues(log: &Path, last: u64) -> u64 {
    let t = wait_tick(log, last + 1, Duration::from_secs(60)).await;
    let first = t[0];
    assert!(
        first > last && first <= last + 2,
        "counter did not continue: last before save {last}, first after restore {first} (all: {t:?})"
    );
    first
}

struct Env {
    kernel: PathBuf,
    initrd: PathBuf,
    dir: PathBuf,
    mem: PathBuf,
    /// Whether VMMs run in cgroups of their own (root, with a hierarchy).
    cgroups: bool,
    /// Whether VMMs drop to users of their own (root).
    runas: bool,
}

impl Env {
    fn spec(&self, id: &str, mode: LaunchMode, shared: bool) -> LaunchSpec {
        LaunchSpec {
            id: id.into(),
            run_dir: self.dir.join(id),
            vcpus: 1,
            memory_mib: MEMORY_MIB,
            kernel: self.kernel.clone(),
            initrd: Some(self.initrd.clone()),
            cmdline: "console=ttyS0 quiet panic=-1".into(),
            memory: MemoryBacking {
                path: self.mem.clone(),
                shared,
                prealloc: false,
            },
            disk: None,
            net: None,
            mode,
            serial_log: true,
        }
    }
}

/// Restores `changed` (r1's changed pages) and goes on counting, saves that
/// VM's changed pages again (a second generation, cumulative against the
/// template) and restores those: the counter continues each time.
async fn changed_pages_chain(
    vmm: &QemuVmm,
    env: &Env,
    vms: &mut Vms,
    changed: &Path,
    tmpl_state: &Path,
    last: u64,
) {
    let mut state = changed.to_path_buf();
    let mut last = last;
    for generation in 1..=2 {
        let spec = env.spec(&format!("c{generation}"), LaunchMode::Incoming, false);
        let log = spec.serial_log_path();
        let vm = vms.add(vmm.spawn(&spec).await.expect("spawn"));
        let info = vms[vm]
            .restore(&state)
            .await
            .expect("restore changed pages");
        assert_eq!(info.memory, MemorySave::ChangedPages);
        vms[vm].resume().await.expect("resume");
        let first = assert_continues(&log, last).await;
        println!(
            "changed-pages generation {generation}: load {:?} ({} bytes), first TICK {first}",
            info.load, info.state_bytes
        );
        wait_tick(&log, first + 2, Duration::from_secs(60)).await;
        vms[vm].pause().await.expect("pause");
        last = *ticks(&log).last().unwrap();
        state = env.dir.join(format!("c{generation}.changed"));
        vms[vm]
            // Both ways of writing the file, one per generation.
            .save_changed_pages(
                &state,
                tmpl_state,
                [StateWrite::Behind, StateWrite::AtEnd][generation % 2],
            )
            .await
            .expect("save changed pages again");
        vms[vm].shutdown().await.expect("shutdown");
    }
    // A base that is not a template's stream is refused before anything.
    let spec = env.spec("c3", LaunchMode::Incoming, false);
    let vm = vms.add(vmm.spawn(&spec).await.expect("spawn"));
    let log = spec.serial_log_path();
    vms[vm].restore(&state).await.expect("restore generation 2");
    vms[vm].resume().await.expect("resume");
    assert_continues(&log, last).await;
    let e = vms[vm]
        .save_changed_pages(&env.dir.join("c3.changed"), changed, StateWrite::Behind)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("x-ignore-shared") || e.to_string().contains("RAM block"),
        "{e}"
    );
    vms[vm].shutdown().await.expect("shutdown");
}

fn mem_fingerprint(p: &Path) -> (u64, i64, i64, u64) {
    let m = fs::metadata(p).unwrap();
    (m.len(), m.mtime(), m.mtime_nsec(), m.blocks())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_restore_chain_on_a_real_guest() {
    let Some(qemu) = common::qemu_or_skip() else {
        return;
    };
    let kernel = common::guest_kernel();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("busybox missing: apt-get install busybox-static");

    // Under /tmp: Unix socket paths must stay short.
    let tmp = tempfile::Builder::new()
        .prefix("siesta-vmm-")
        .tempdir_in("/tmp")
        .unwrap();
    let initrd = tmp.path().join("initrd.cpio");
    build_initramfs(&busybox, &initrd);
    let env = Env {
        kernel,
        initrd,
        dir: tmp.path().to_path_buf(),
        mem: tmp.path().join("mem.img"),
        cgroups: false,
        runas: false,
    };
    let mut vmm = QemuVmm::new(qemu, AccelChoice::Auto).expect("QEMU backend");
    println!("VMM: {:?}", vmm.info());
    // Every VM below runs confined as in production: seccomp, an empty
    // environment and, as root, a cgroup of its own.
    let cgroups = Cgroups::detect(&format!("siesta-vmmtest-{}", std::process::id()))
        .expect("cgroup hierarchy");
    if let Some(c) = &cgroups {
        vmm = vmm.with_cgroups(c.clone());
    }
    // As root, each VMM drops to a user of its own, as in production.
    let as_root = nix::unistd::geteuid().is_root();
    if as_root {
        vmm = vmm.with_vmm_users(VmmUsers::default_range());
    }
    let env = Env {
        cgroups: cgroups.is_some(),
        runas: as_root,
        ..env
    };

    let mut vms = Vms::default();
    tokio::time::timeout(Duration::from_secs(600), scenario(&vmm, &env, &mut vms))
        .await
        .expect("scenario timed out");
    for vm in &mut vms.0 {
        assert!(
            vm.try_exit_status().is_some(),
            "VM {} still running at the end",
            vm.id()
        );
    }
    // The VMs go before their directory (declared after `tmp`, dropped first).
    drop(vms);
    if let Some(c) = cgroups {
        c.remove_parent();
    }
}

/// QEMU `pid` runs under its seccomp filter, with nothing of the server's
/// environment, (as root) as a user of its own without capabilities, and
/// (when the host has cgroups) in a group of its own whose memory is
/// limited; returns that group's name.
fn assert_confined(pid: u32, cgroups_expected: bool, runas: bool) -> Option<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    if runas {
        let ids = |key: &str| -> Vec<u32> {
            let line = status.lines().find(|l| l.starts_with(key)).unwrap();
            line.split_whitespace()
                .skip(1)
                .map(|n| n.parse().unwrap())
                .collect()
        };
        for key in ["Uid:", "Gid:", "Groups:"] {
            let v = ids(key);
            assert!(
                !v.is_empty() && v.iter().all(|&id| id >= DEFAULT_UID_BASE),
                "QEMU's {key} {v:?} are not a VMM user's:\n{status}"
            );
        }
        assert!(
            status
                .lines()
                .any(|l| l.split_whitespace().eq(["CapEff:", "0000000000000000"])),
            "QEMU kept capabilities:\n{status}"
        );
    }
    assert!(
        status
            .lines()
            .any(|l| l.split_whitespace().eq(["Seccomp:", "2"])),
        "QEMU runs without its seccomp filter:\n{status}"
    );
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert_eq!(
        environ, b"PATH=/usr/sbin:/usr/bin:/sbin:/bin\0",
        "QEMU got more than PATH in its environment"
    );
    let groups = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let group = groups
        .lines()
        .map(|l| l.rsplit(':').next().unwrap_or_default())
        .find(|g| g.contains("siesta-vmmtest-"))
        .map(str::to_string);
    assert_eq!(
        group.is_some(),
        cgroups_expected,
        "QEMU's cgroups: {groups}"
    );
    let g = group?;
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        && fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .unwrap_or_default()
            .contains("memory");
    let limit = if v2 {
        format!("/sys/fs/cgroup{g}/memory.max")
    } else {
        format!("/sys/fs/cgroup/memory{g}/memory.limit_in_bytes")
    };
    let limit: u64 = fs::read_to_string(&limit).unwrap().trim().parse().unwrap();
    assert_eq!(limit, (MEMORY_MIB * 2 + 1024) << 20, "{g}");
    Some(g)
}

async fn scenario(vmm: &QemuVmm, env: &Env, vms: &mut Vms) {
    // 1. Template: boot with RAM in a shared file, pause, save device state.
    let spec = env.spec("tmpl", LaunchMode::Boot, true);
    let log = spec.serial_log_path();
    let t0 = Instant::now();
    let t = vms.add(vmm.spawn(&spec).await.expect("spawn template"));
    let spawned = t0.elapsed();
    let group = assert_confined(vms[t].pid(), env.cgroups, env.runas);
    vms[t].boot().await.expect("boot");
    wait_tick(&log, 3, Duration::from_secs(180)).await;
    println!(
        "template: spawn {spawned:?}, boot to TICK 3 {:?}",
        t0.elapsed()
    );
    vms[t].pause().await.expect("pause template");
    let last0 = *ticks(&log).last().unwrap();
    let tmpl_state = env.dir.join("tmpl.state");
    let s = vms[t]
        .save(&tmpl_state, MemorySave::InBackingFile)
        .await
        .expect("save template");
    println!(
        "template save (InBackingFile): {} bytes, write {:?}, fsync {:?}, total {:?}; last TICK {last0}",
        s.state_bytes, s.write, s.sync, s.total
    );
    assert!(
        s.state_bytes < 8 << 20,
        "RAM leaked into the device state: {} bytes",
        s.state_bytes
    );
    vms[t].shutdown().await.expect("shutdown template");
    vms[t].shutdown().await.expect("shutdown is idempotent");
    assert!(vms[t].try_exit_status().is_some());
    if let Some(g) = group {
        let gone = ["/sys/fs/cgroup", "/sys/fs/cgroup/memory"]
            .iter()
            .all(|root| !Path::new(&format!("{root}{g}")).exists());
        assert!(gone, "the template VM's cgroup {g} outlived it");
    }
    let mem_before = mem_fingerprint(&env.mem);

    // 2. Restore over a private mapping of the template's memory file.
    let spec = env.spec("r1", LaunchMode::Incoming, false);
    let log = spec.serial_log_path();
    let t0 = Instant::now();
    let r1 = vms.add(vmm.spawn(&spec).await.expect("spawn r1"));
    let spawned = t0.elapsed();
    let info = vms[r1]
        .restore(&tmpl_state)
        .await
        .expect("restore template");
    assert_eq!(info.memory, MemorySave::ChangedPages);
    let t_cont = Instant::now();
    vms[r1].resume().await.expect("resume r1");
    let first = assert_continues(&log, last0).await;
    println!(
        "r1 restore: spawn {spawned:?}, load {:?} (restore total {:?}, {} bytes), resume to TICK {first} {:?}",
        info.load,
        info.total,
        info.state_bytes,
        t_cont.elapsed()
    );
    assert!(
        vms[r1].boot().await.is_err(),
        "boot of an incoming VM must be refused"
    );
    wait_tick(&log, first + 2, Duration::from_secs(60)).await;

    // 3. Save r1 with its RAM in the state file (its RAM is private COW).
    vms[r1].pause().await.expect("pause r1");
    let last1 = *ticks(&log).last().unwrap();
    let r1_state = env.dir.join("r1.state");
    let e = vms[r1]
        .save(&r1_state, MemorySave::InBackingFile)
        .await
        .unwrap_err();
    assert!(matches!(e, VmmError::InvalidOperation { .. }), "{e}");
    // The device state's scratch file cannot be made (a directory is in
    // its way) while the pages are being written: the save fails
    // naming the step, leaves no state file, and the VM saves afterwards.
    let failing = env.dir.join("r1.failing");
    std::fs::create_dir(env.dir.join("r1.failing.devices")).unwrap();
    let e = vms[r1]
        .save_changed_pages(&failing, &tmpl_state, StateWrite::Behind)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("device state"), "{e}");
    assert!(
        !failing.exists(),
        "a failed save left {}",
        failing.display()
    );
    println!("device state refused: {e}");
    // Only the pages the guest wrote, framed by the template's stream; then
    // a full save of the same VM, which must still work afterwards.
    let r1_changed = env.dir.join("r1.changed");
    let c = vms[r1]
        .save_changed_pages(&r1_changed, &tmpl_state, StateWrite::Behind)
        .await
        .expect("save r1's changed pages");
    println!(
        "r1 save (changed pages): {} bytes, write {:?}, fsync {:?}, total {:?}",
        c.state_bytes, c.write, c.sync, c.total
    );
    let s = vms[r1]
        .save(&r1_state, MemorySave::InState)
        .await
        .expect("save r1");
    assert!(
        c.state_bytes < s.state_bytes / 2,
        "changed pages ({} bytes) should be far less than all of RAM ({} bytes)",
        c.state_bytes,
        s.state_bytes
    );
    println!(
        "r1 save (InState): {} bytes, write {:?}, fsync {:?}, total {:?}; last TICK {last1}",
        s.state_bytes, s.write, s.sync, s.total
    );
    assert!(
        s.state_bytes > 8 << 20,
        "guest RAM missing from an InState save: {} bytes",
        s.state_bytes
    );
    vms[r1].shutdown().await.expect("shutdown r1");

    // 4. Restore that into a third VM, again over the untouched template file.
    let spec = env.spec("r2", LaunchMode::Incoming, false);
    let log = spec.serial_log_path();
    let r2 = vms.add(vmm.spawn(&spec).await.expect("spawn r2"));
    let info = vms[r2].restore(&r1_state).await.expect("restore r1 state");
    assert_eq!(info.memory, MemorySave::InState);
    vms[r2].resume().await.expect("resume r2");
    let first = assert_continues(&log, last1).await;
    println!(
        "r2 restore: load {:?} ({} bytes), first TICK {first}",
        info.load, info.state_bytes
    );
    assert_eq!(
        mem_before,
        mem_fingerprint(&env.mem),
        "a private (share=off) mapping modified the template's memory file"
    );

    changed_pages_chain(vmm, env, vms, &r1_changed, &tmpl_state, last1).await;

    // 5. The VMM dies under a running VM: the next call says so.
    let pid = vms[r2].pid();
    // SAFETY: kill(2) on our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let e = vms[r2].pause().await.unwrap_err();
    println!("after SIGKILL: {e}");
    assert!(
        matches!(&e, VmmError::Exited { status, .. } if status.contains("signal 9")),
        "{e}"
    );
    assert!(vms[r2].try_exit_status().is_some());
    vms[r2]
        .shutdown()
        .await
        .expect("shutdown of a dead VM is fine");

    // 6. A truncated state file: QEMU fails the load; the error says why and
    // the process is gone.
    let bad = env.dir.join("truncated.state");
    let full = fs::read(&r1_state).unwrap();
    fs::write(&bad, &full[..full.len() / 2]).unwrap();
    let spec = env.spec("r3", LaunchMode::Incoming, false);
    let r3 = vms.add(vmm.spawn(&spec).await.expect("spawn r3"));
    let e = vms[r3].restore(&bad).await.unwrap_err();
    println!("truncated state: {e}");
    assert!(e.to_string().contains("r3"), "{e}");
    assert!(
        vms[r3].try_exit_status().is_some(),
        "QEMU left running after a failed restore"
    );

    // 7. Not a state file at all: refused before QEMU reads it; process gone.
    let bad = env.dir.join("garbage.state");
    fs::write(&bad, vec![0x5a; 10_000]).unwrap();
    let spec = env.spec("r4", LaunchMode::Incoming, false);
    let r4 = vms.add(vmm.spawn(&spec).await.expect("spawn r4"));
    let e = vms[r4].restore(&bad).await.unwrap_err();
    println!("garbage state: {e}");
    assert!(
        matches!(&e, VmmError::StateFile { detail, .. } if detail.contains("not a QEMU migration stream")),
        "{e}"
    );
    assert!(
        vms[r4].try_exit_status().is_some(),
        "QEMU left running after a failed restore"
    );

    // 8. An incoming VM over a missing memory file is refused by name.
    let mut spec = env.spec("r5", LaunchMode::Incoming, false);
    spec.memory.path = env.dir.join("missing.img");
    let Err(e) = vmm.spawn(&spec).await else {
        panic!("spawned over a missing memory file")
    };
    assert!(e.to_string().contains("missing.img"), "{e}");
}
