//! End-to-end test with real VMs under QEMU: build a template from the `base`
//! image, resume two sandboxes from it, prove memory sharing, random-state
//! divergence, pause/resume (through a repository snapshot) with files and
//! processes intact, memory a guest freed going back to the host while it
//! runs, a corrupt paused state losing nothing, the failure
//! cases, and that nothing is left behind.
//!
//! Needs root, QEMU and the guest assets (`make assets`); it is skipped with
//! a message where they are missing, except under CI where that is a failure.
//! Boots are slow under TCG, so this is one test that proves a lot.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{assets_dir, can_run_vms, exec_ok, netns_names};

use futures::FutureExt;
use siesta_sandbox::paused;
use siesta_sandbox::sandbox::SandboxState;
use siesta_sandbox::{CreateRequest, Error, Node, NodeConfig, SandboxManager};
use siesta_snapshot::record::{DISK, MEMORY, STATE};
use siesta_snapshot::{Repository, SnapshotKind};
use siesta_template::{build_template, BuildOptions};

/// KiB of `file`'s mapping in process `pid` counted under the smaps `fields`
/// (e.g. `Shared_Clean:` and `Shared_Dirty:` for the pages it shares with
/// another process, `Anonymous:` for its private copies).
fn kib_of_mapping(pid: u32, file: &Path, fields: &[&str]) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("read smaps");
    let needle = file.to_string_lossy().to_string();
    let mut in_mapping = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        let is_header = first.split_once('-').is_some_and(|(a, b)| {
            u64::from_str_radix(a, 16).is_ok() && u64::from_str_radix(b, 16).is_ok()
        });
        if is_header {
            in_mapping = line.ends_with(&needle);
        } else if in_mapping {
            if let Some(v) = fields.iter().find_map(|f| line.strip_prefix(f)) {
                kib += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
    }
    kib
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_lifecycle_end_to_end() {
    if !can_run_vms() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("siesta-vmtest")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::os::unix::fs::symlink(assets_dir(), home.path().join("assets")).unwrap();
    let mut config = NodeConfig::new(home.path());
    // Letters only, unique per test process: never a server's slots.
    config.net_tag = std::process::id()
        .to_string()
        .bytes()
        .take(5)
        .map(|d| (b'a' + (d - b'0')) as char)
        .collect();
    // Never the default subnet of a server that may run meanwhile.
    config.net_subnet = siesta_net::Subnet::ten_slash_16(130);
    config.warm_slots = 1;
    config.boot_ready_timeout = Duration::from_secs(240);
    config.resume_ready_timeout = Duration::from_secs(60);
    let netns_before = netns_names();
    let node = Node::start(config).await.expect("node starts");
    // In-memory state: shutdown kills what a failed scenario left running.
    let manager = SandboxManager::ephemeral(node.clone()).expect("manager");

    let outcome = AssertUnwindSafe(Box::pin(scenario(&node, &manager, home.path())))
        .catch_unwind()
        .await;
    manager.shutdown().await;
    node.shutdown().await;

    // Nothing left: no VMM of ours, no namespace, no sandbox files.
    let leftover: Vec<_> = netns_names().difference(&netns_before).cloned().collect();
    assert!(
        leftover.is_empty(),
        "network namespaces left behind: {leftover:?}"
    );
    let sandboxes = std::fs::read_dir(home.path().join("sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(sandboxes, 0, "sandbox directories left behind");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Writes `mib` MiB of random data to a tmpfs in sandbox `id`, deletes it
/// and unmounts the tmpfs: memory the guest has freed.
async fn write_and_free(m: &Arc<SandboxManager>, id: &str, mib: u32) {
    let cmd = format!(
        "mkdir -p /run/freed && mount -t tmpfs -o size={}m tmpfs /run/freed && \
         head -c {mib}M /dev/urandom > /run/freed/data && rm /run/freed/data && umount /run/freed",
        mib + 16
    );
    let freed = m
        .exec(id, &cmd, Some("root"), |_, _| {})
        .await
        .expect("exec");
    assert_eq!(
        freed.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&freed.stderr)
    );
}

/// 128 MiB written to a tmpfs and deleted in sandbox `id`: the guest zeroes
/// the freed pages (`init_on_free`), and the node's memory return (KSM with
/// zero pages, on by default) gives them back to the host while the sandbox
/// keeps running. What the guest kept is intact, and it can use the returned
/// memory again.
async fn memory_freed_by_a_guest_returns_to_the_host(
    m: &Arc<SandboxManager>,
    id: &str,
    pid: u32,
    mem: &Path,
) {
    let anon = || kib_of_mapping(pid, mem, &["Anonymous:"]);
    let kept = exec_ok(
        m,
        id,
        "head -c 16M /dev/urandom > /dev/shm/kept && md5sum < /dev/shm/kept",
    )
    .await;
    write_and_free(m, id, 128).await;
    let after_free = anon();
    assert!(
        after_free > 128 << 10,
        "the VMM holds {after_free} KiB of private guest RAM after the guest wrote 128 MiB"
    );
    // ksmd's pace is the host's (a stock kernel scans 5,000 pages a second);
    // the deadline only bounds a failure.
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let mut now = after_free;
    while now + (96 << 10) > after_free && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = anon();
    }
    assert!(
        now + (96 << 10) <= after_free,
        "freed guest memory not returned: {after_free} KiB private after the free, {now} KiB 240 s later"
    );
    assert_eq!(exec_ok(m, id, "md5sum < /dev/shm/kept").await, kept);
    let rewritten = exec_ok(
        m,
        id,
        "head -c 64M /dev/urandom | tee /dev/shm/again | md5sum; md5sum < /dev/shm/again; rm /dev/shm/again /dev/shm/kept",
    )
    .await;
    let sums: Vec<&str> = rewritten.lines().collect();
    assert!(sums.len() == 2 && sums[0] == sums[1], "{rewritten}");
}

/// The paused sandbox `id` was resumed by the VMM the pool had waiting
/// (spawned under another name), which now has the sandbox's own disk open
/// and closed the pool's fresh overlay.
fn assert_resumed_in_pooled_vmm(pid: u32, id: &str, sandbox_dir: &Path) {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(&format!("guest={id}")),
        "the paused sandbox's VMM was spawned for it, not taken from the pool"
    );
    let open: Vec<std::path::PathBuf> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect();
    // Distinct paths: the disk reached the VMM as a descriptor in an fd
    // set (`siesta_vmm::qemu::fdset`), which QEMU keeps beside the block
    // layer's own duplicate of it.
    let qcow2: std::collections::BTreeSet<_> = open
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "qcow2"))
        .collect();
    assert_eq!(
        qcow2.into_iter().collect::<Vec<_>>(),
        [&sandbox_dir.join("disk.qcow2")],
        "{open:?}"
    );
    assert!(
        sandbox_dir.join("run/vmm.sock").exists(),
        "run directory moved in"
    );
}

/// VMM `pid` was started with a stand-in from `home`'s kernel stubs as its
/// kernel and no initrd (`siesta_vmm::qemu::kernel_stub`), and the stand-in
/// is the real kernel's first bytes.
fn assert_loaded_kernel_stub(pid: u32, home: &Path) {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let kernel = args
        .iter()
        .position(|a| a == "-kernel")
        .map(|i| Path::new(&args[i + 1]).to_path_buf())
        .expect("a -kernel argument");
    assert!(
        kernel.starts_with(home.join("cache/kernel-stubs")),
        "VMM {pid} loaded {}",
        kernel.display()
    );
    assert!(!args.iter().any(|a| a == "-initrd"), "{args:?}");
    let stub = std::fs::read(&kernel).unwrap();
    let whole = std::fs::read(home.join("assets/vmlinuz")).unwrap();
    assert!(stub.len() < whole.len() / 100 && whole.starts_with(&stub));
}

async fn scenario(node: &Arc<Node>, m: &Arc<SandboxManager>, home: &Path) {
    // Template: boot the base image, wait for the agent, freeze it.
    let opts = BuildOptions {
        name: "base".into(),
        image: "base".into(),
        force: false,
    };
    let t = build_template(node, &opts).await.expect("template builds");
    assert!(t.record.memory.allocated > 0 && t.record.state.size > 0);
    assert_eq!(t.record.vmm.kind, "qemu");

    // Two sandboxes from it; both run commands as `user` with bash.
    let req = CreateRequest {
        template: "base".into(),
        ..Default::default()
    };
    let a = m.create(req.clone()).await.expect("create a");
    let b = m.create(req.clone()).await.expect("create b");
    assert!(a.timings.as_ref().is_some_and(|t| t.total_ms > 0.0));
    assert_eq!(exec_ok(m, &a.id, "whoami").await.trim(), "user");
    assert_eq!(
        exec_ok(m, &b.id, "echo $HOME; test -d /home/user && echo ok")
            .await
            .trim(),
        "/home/user\nok"
    );

    // Both VMMs map the template's memory file, and share its page cache.
    let mem = t.memory_path();
    for info in [&a, &b] {
        let kib = kib_of_mapping(
            info.vmm_pid.expect("pid"),
            &mem,
            &["Shared_Clean:", "Shared_Dirty:"],
        );
        assert!(
            kib > 0,
            "VMM {} shares no pages of {}",
            info.id,
            mem.display()
        );
    }

    // They restored into VMMs that loaded the kernel's stand-in, not the
    // whole kernel and initrd, and run as shown above.
    for info in [&a, &b] {
        assert_loaded_kernel_stub(info.vmm_pid.expect("pid"), home);
    }

    // Clones must not share random state.
    let ra = exec_ok(m, &a.id, "head -c 32 /dev/urandom | od -An -tx1").await;
    let rb = exec_ok(m, &b.id, "head -c 32 /dev/urandom | od -An -tx1").await;
    assert_ne!(ra, rb, "two clones produced the same random bytes");

    memory_freed_by_a_guest_returns_to_the_host(m, &b.id, b.vmm_pid.expect("pid"), &mem).await;

    // Files and processes survive pause and resume.
    exec_ok(m, &a.id, "echo persist-me > /home/user/state.txt").await;
    exec_ok(
        m,
        &a.id,
        "nohup sleep 1000 >/dev/null 2>&1 & echo $! > /home/user/sleep.pid",
    )
    .await;
    // 96 MiB written to a tmpfs and deleted: memory the guest has freed.
    // Its template's kernel zeroes freed pages, so the pause below stores
    // none of it (checked by the state's size).
    assert!(t.record.kernel_cmdline.contains("init_on_free=1"));
    write_and_free(m, &a.id, 96).await;
    m.pause(&a.id).await.expect("pause");
    assert!(matches!(
        m.pause(&a.id).await,
        Err(Error::WrongState { .. })
    ));
    assert!(
        m.exec(&a.id, "true", None, |_, _| {}).await.is_err(),
        "exec in a paused sandbox"
    );
    // The pause is a repository snapshot: its own state and disk, the
    // template's memory blob by reference, nothing left beside the sandbox.
    let repo = Repository::open(home.join("repo")).unwrap();
    let pause = repo
        .resolve(&paused::alias(&a.id))
        .expect("paused snapshot");
    assert_eq!(pause.kind, SnapshotKind::Paused);
    assert_eq!(repo.file_path(&pause, MEMORY).unwrap(), mem);
    let sandbox_dir = home.join("sandboxes").join(&a.id);
    assert!(!sandbox_dir.join("disk.qcow2").exists());
    assert!(repo.check().unwrap().is_clean());

    // Only the pages the guest changed since the template were saved: far
    // less than its 512 MiB of RAM (and than the 96 MiB it wrote and
    // freed), with the digest in the record.
    let state = repo.file_path(&pause, STATE).unwrap();
    let good = std::fs::read(&state).unwrap();
    assert!(
        good.len() < 64 << 20,
        "a pause saved {} bytes: more than the guest's changed pages (freed memory carried?)",
        good.len()
    );
    assert!(
        pause.files[STATE].digest().is_some(),
        "state without digest"
    );

    // A corrupt paused state: a clear error naming it, and nothing lost.
    // All garbage, and one flipped byte QEMU would load without noticing.
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x01;
    for bad in [vec![0xAB; good.len()], flipped] {
        std::fs::write(&state, &bad).unwrap();
        let err = m.resume(&a.id).await.expect_err("corrupt paused state");
        assert!(err.to_string().contains(&*state.to_string_lossy()), "{err}");
        assert!(err.to_string().contains("SHA-256"), "{err}");
        assert_eq!(m.get(&a.id).await.unwrap().state, SandboxState::Paused);
        assert!(
            repo.file_path(&pause, DISK).unwrap().exists(),
            "disk given back"
        );
    }
    std::fs::write(&state, &good).unwrap();

    m.wait_pool_ready("base", Duration::from_secs(120))
        .await
        .expect("a pooled VMM waits");
    let resumed = m.resume(&a.id).await.expect("resume");
    assert!(repo.get(&pause.id).is_err(), "a resume consumes its pause");
    assert!(resumed.timings.is_some());
    assert_resumed_in_pooled_vmm(resumed.vmm_pid.expect("pid"), &a.id, &sandbox_dir);
    assert_eq!(
        exec_ok(m, &a.id, "cat /home/user/state.txt").await.trim(),
        "persist-me"
    );
    exec_ok(
        m,
        &a.id,
        "kill -0 $(cat /home/user/sleep.pid) && echo alive",
    )
    .await;

    // A VMM killed under a sandbox: clear error, and kill still cleans up.
    let pid = b.vmm_pid.expect("pid");
    // SAFETY: kill has no memory preconditions; pid is the VMM this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = m
        .exec(&b.id, "true", None, |_, _| {})
        .await
        .expect_err("exec after VMM death");
    assert!(!err.to_string().is_empty());
    m.kill(&b.id).await.expect("kill b");
    m.kill(&a.id).await.expect("kill a");
    assert!(matches!(
        m.kill(&a.id).await,
        Err(Error::SandboxNotFound { .. })
    ));

    // A missing template.
    let missing = CreateRequest {
        template: "no-such".into(),
        ..Default::default()
    };
    assert!(matches!(
        m.create(missing).await,
        Err(Error::TemplateNotFound { .. })
    ));

    // A corrupt state file: refused with an error naming it, nothing left.
    let state = t.state_path();
    let good = std::fs::read(&state).unwrap();
    std::fs::write(&state, vec![0xAB; good.len()]).unwrap();
    let err = m
        .create(req.clone())
        .await
        .expect_err("corrupt state must fail");
    assert!(err.to_string().contains("state.bin"), "{err}");
    std::fs::write(&state, &good).unwrap();

    // A truncated memory file: refused before any VMM starts.
    let memory = std::fs::OpenOptions::new().write(true).open(&mem).unwrap();
    let len = memory.metadata().unwrap().len();
    memory.set_len(len / 2).unwrap();
    let err = m
        .create(req.clone())
        .await
        .expect_err("truncated memory must fail");
    assert!(matches!(err, Error::CorruptSnapshot { .. }), "{err}");
    memory.set_len(len).unwrap();

    // A guest whose agent never starts: a clear error, nothing left behind.
    let mut config = node.config.clone();
    config.net_tag = format!("{}x", config.net_tag);
    // Beside the first node, whose slots hold addresses in its subnet.
    config.net_subnet = siesta_net::Subnet::ten_slash_16(131);
    config.kernel_args = "siesta.init=/bin/false".into();
    config.boot_ready_timeout = Duration::from_secs(20);
    let broken = Node::start(config).await.expect("second node");
    let opts = BuildOptions {
        name: "never".into(),
        image: "base".into(),
        force: false,
    };
    let err = build_template(&broken, &opts)
        .await
        .expect_err("a guest without agent");
    broken.shutdown().await;
    // The agent's kind survives the template's error and the sandbox's.
    let err = Error::from(err);
    assert!(matches!(err, Error::GuestNotReady { .. }), "{err}");
    assert!(
        !home.join("templates/never").exists() && !home.join("templates/.never.building").exists()
    );
}
