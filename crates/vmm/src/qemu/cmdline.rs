//! The QEMU command line, derived from a [`LaunchSpec`] by a pure function.
//!
//! Boot and incoming launches differ only in `-incoming defer`: a migration
//! stream only loads into the very same set of devices, so everything else,
//! including the PCI addresses (pinned below so an absent disk or NIC does not
//! shift the others), is identical.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use super::disk::{filter_node, image_node, DISK_ID, FIRST_IMAGE_NODE};
use crate::{Accel, LaunchMode, LaunchSpec};

/// The memory backend's id, which is also its RAM block's name in a
/// migration stream.
pub const MEMORY_BACKEND_ID: &str = "mem";
/// QEMU's seccomp filter, everything it can deny denied.
pub const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";
/// The filter for a QEMU that drops to a user of its own with `-runas`:
/// the drop is itself a `setuid`, which `elevateprivileges=deny` kills
/// QEMU for. After the drop the process holds no capability, so `set*id`
/// can no longer raise anything.
pub const SANDBOX_RUNAS: &str =
    "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny";
/// Fixed PCI slots on q35's root bus.
const DISK_ADDR: &str = "0x3";
const NET_ADDR: &str = "0x4";
const RNG_ADDR: &str = "0x5";

/// Who QEMU becomes once it has opened its command line: `-runas` this
/// user (`uid:gid`), after `-chroot` into `root`, an empty directory, so
/// that it can open no file by path at all (everything later reaches it
/// as a descriptor, [`super::fdset`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub user: String,
    pub root: std::path::PathBuf,
}

/// Builds QEMU's argv (without the program name).
///
/// `machine` should be a versioned machine type (e.g. `pc-q35-7.2`), see
/// [`crate::VmmInfo::machine`]. q35 rather than microvm: a microvm guest
/// restored under QEMU 7.2 did not run on (platform facts). With `runas`
/// (`uid:gid`), QEMU drops to that user once it has opened what the command
/// line names (see [`crate::vmm_users`]).
/// The q35 devices turned off in device set 1.
const DEVICES_OFF: &str = "vmport=off,smbus=off,sata=off";

pub fn build_argv(
    spec: &LaunchSpec,
    accel: Accel,
    machine: &str,
    runas: Option<&RunAs>,
) -> Vec<OsString> {
    let mut a = Argv::default();
    a.pair("-name", opt("guest=", OsStr::new(&spec.id)));
    a.pair("-accel", accel.as_str());
    // q35's built-ins no guest of siesta uses, off (`crate::DEVICE_SET`).
    a.pair("-machine", format!("{machine},{DEVICES_OFF}"));
    // TCG: `max` emulates every feature QEMU can. KVM: the host's CPU model.
    a.pair(
        "-cpu",
        match accel {
            Accel::Tcg => "max",
            Accel::Kvm => "host",
        },
    );
    a.pair("-m", format!("{}M", spec.memory_mib));
    a.pair("-smp", spec.vcpus.to_string());
    // Nothing QEMU would add by itself: every device is listed below, and the
    // default VGA, NIC ROM and monitor would only grow the device state.
    for flag in ["-nodefaults", "-no-user-config", "-no-reboot"] {
        a.one(flag);
    }
    a.pair("-vga", "none");
    a.pair("-display", "none");
    // seccomp: QEMU may not exec, fork, raise its privileges, change its
    // scheduling or use obsolete system calls, so a guest that breaks
    // into it is still held by the filter (under TCG, where QEMU is the
    // only boundary, most of all).
    match runas {
        Some(run) => {
            a.pair("-sandbox", SANDBOX_RUNAS);
            a.pair("-runas", &run.user);
            a.pair("-chroot", run.root.as_os_str());
        }
        None => a.pair("-sandbox", SANDBOX),
    }

    let mut mem = opt(
        &format!(
            "memory-backend-file,id={MEMORY_BACKEND_ID},size={}M,mem-path=",
            spec.memory_mib
        ),
        spec.memory.path.as_os_str(),
    );
    mem.push(if spec.memory.shared {
        ",share=on"
    } else {
        ",share=off"
    });
    if spec.memory.prealloc {
        mem.push(",prealloc=on");
    }
    a.pair("-object", mem);
    a.pair("-numa", format!("node,memdev={MEMORY_BACKEND_ID}"));

    a.pair("-kernel", spec.kernel.as_os_str());
    if let Some(initrd) = &spec.initrd {
        a.pair("-initrd", initrd.as_os_str());
    }
    a.pair("-append", spec.cmdline.as_str());

    // The UART exists even without a log, so the device set does not depend
    // on whether anyone reads the console.
    if spec.serial_log {
        a.pair(
            "-chardev",
            // append: the log is emptied when it grows past its cap
            // (`serial_cap`), and QEMU's next write must land at the start.
            append_opt(
                opt("file,id=ser0,path=", spec.serial_log_path().as_os_str()),
                ",append=on",
            ),
        );
    } else {
        a.pair("-chardev", "null,id=ser0");
    }
    a.pair("-serial", "chardev:ser0");

    if let Some(disk) = &spec.disk {
        // JSON, so paths need no escaping; `LaunchSpec::validate` has
        // refused a path that is not UTF-8. See `disk` for why a filter.
        let image = image_node(disk, FIRST_IMAGE_NODE).unwrap_or_default();
        a.pair("-blockdev", image.to_string());
        a.pair(
            "-blockdev",
            filter_node(FIRST_IMAGE_NODE, disk.read_only).to_string(),
        );
        a.pair(
            "-device",
            format!("virtio-blk-pci,drive={DISK_ID},addr={DISK_ADDR},write-cache=on"),
        );
    }
    if let Some(net) = &spec.net {
        a.pair(
            "-netdev",
            opt(
                "tap,id=net0,script=no,downscript=no,ifname=",
                OsStr::new(&net.tap),
            ),
        );
        // romfile= (empty): no PXE option ROM; the kernel is loaded directly
        // and the ROM would be one more RAM block in every state file.
        // The MAC is validated as hex pairs: nothing to escape.
        a.pair(
            "-device",
            format!(
                "virtio-net-pci,netdev=net0,romfile=,addr={NET_ADDR},mac={}",
                net.mac
            ),
        );
    }
    a.pair("-device", format!("virtio-rng-pci,addr={RNG_ADDR}"));

    let mut qmp = opt("unix:", spec.control_socket_path().as_os_str());
    qmp.push(",server=on,wait=off");
    a.pair("-qmp", qmp);
    // Always -S: a booting VM starts at `cont`, and an incoming one stays
    // paused after loading even if its stream carries no run state.
    a.one("-S");
    if spec.mode == LaunchMode::Incoming {
        a.pair("-incoming", "defer");
    }
    a.0
}

fn append_opt(mut value: OsString, more: &str) -> OsString {
    value.push(more);
    value
}

#[derive(Default)]
struct Argv(Vec<OsString>);

impl Argv {
    fn one(&mut self, s: &str) {
        self.0.push(s.into());
    }
    fn pair(&mut self, flag: &str, value: impl Into<OsString>) {
        self.0.push(flag.into());
        self.0.push(value.into());
    }
}

/// `prefix` followed by `value` escaped for QEMU's option syntax, where a
/// comma separates options and a literal comma is written twice.
fn opt(prefix: &str, value: &OsStr) -> OsString {
    let mut s = OsString::from(prefix);
    s.push(escape(value));
    s
}

fn escape(value: &OsStr) -> OsString {
    let mut out = Vec::with_capacity(value.len());
    for &b in value.as_bytes() {
        out.push(b);
        if b == b',' {
            out.push(b',');
        }
    }
    OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::spec;
    use crate::{DiskFormat, DiskSpec, NetSpec};

    fn strs(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    fn value_of<'a>(argv: &'a [String], flag: &str) -> Vec<&'a str> {
        argv.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn boot_argv_has_every_required_piece() {
        let argv = strs(&build_argv(&spec(), Accel::Tcg, "pc-q35-7.2", None));
        assert_eq!(value_of(&argv, "-accel"), ["tcg"]);
        assert_eq!(
            value_of(&argv, "-machine"),
            ["pc-q35-7.2,vmport=off,smbus=off,sata=off"]
        );
        assert_eq!(value_of(&argv, "-sandbox"), [SANDBOX]);
        assert_eq!(value_of(&argv, "-cpu"), ["max"]);
        assert_eq!(value_of(&argv, "-m"), ["512M"]);
        assert_eq!(value_of(&argv, "-smp"), ["2"]);
        assert_eq!(
            value_of(&argv, "-object"),
            ["memory-backend-file,id=mem,size=512M,mem-path=/t/mem.img,share=on"]
        );
        assert_eq!(value_of(&argv, "-numa"), ["node,memdev=mem"]);
        assert_eq!(value_of(&argv, "-kernel"), ["/k/vmlinuz"]);
        assert_eq!(value_of(&argv, "-initrd"), ["/k/initrd"]);
        assert_eq!(value_of(&argv, "-append"), ["console=ttyS0 quiet"]);
        assert_eq!(
            value_of(&argv, "-chardev"),
            ["file,id=ser0,path=/run/siesta/vm1/serial.log,append=on"]
        );
        assert_eq!(value_of(&argv, "-serial"), ["chardev:ser0"]);
        assert_eq!(
            value_of(&argv, "-qmp"),
            ["unix:/run/siesta/vm1/vmm.sock,server=on,wait=off"]
        );
        assert_eq!(value_of(&argv, "-device"), ["virtio-rng-pci,addr=0x5"]);
        for f in ["-nodefaults", "-no-user-config", "-no-reboot", "-S"] {
            assert!(argv.iter().any(|a| a == f), "{f} missing");
        }
        assert!(value_of(&argv, "-incoming").is_empty());
        assert!(value_of(&argv, "-runas").is_empty());
        assert!(value_of(&argv, "-blockdev").is_empty() && value_of(&argv, "-netdev").is_empty());
    }

    #[test]
    fn a_vmm_user_relaxes_only_the_privilege_rule_of_the_filter() {
        let argv = strs(&build_argv(
            &spec(),
            Accel::Tcg,
            "pc-q35-7.2",
            Some(&RunAs {
                user: "1900000003:1900000003".into(),
                root: "/run/siesta/vmm-root".into(),
            }),
        ));
        assert_eq!(value_of(&argv, "-runas"), ["1900000003:1900000003"]);
        assert_eq!(value_of(&argv, "-chroot"), ["/run/siesta/vmm-root"]);
        assert_eq!(value_of(&argv, "-sandbox"), [SANDBOX_RUNAS]);
        assert_eq!(
            SANDBOX.replace("elevateprivileges=deny", "elevateprivileges=allow"),
            SANDBOX_RUNAS
        );
    }

    #[test]
    fn incoming_differs_from_boot_only_by_incoming_defer() {
        let boot = build_argv(&spec(), Accel::Tcg, "pc-q35-7.2", None);
        let mut s = spec();
        s.mode = LaunchMode::Incoming;
        let inc = build_argv(&s, Accel::Tcg, "pc-q35-7.2", None);
        assert_eq!(inc.len(), boot.len() + 2);
        assert_eq!(&inc[..boot.len()], &boot[..]);
        assert_eq!(strs(&inc[boot.len()..]), ["-incoming", "defer"]);
    }

    #[test]
    fn private_memory_kvm_disk_net_and_no_serial_log() {
        let mut s = spec();
        s.memory.shared = false;
        s.serial_log = false;
        s.disk = Some(DiskSpec {
            path: "/d/a,b.qcow2".into(),
            format: DiskFormat::Qcow2,
            read_only: true,
            backing: vec![],
        });
        s.net = Some(NetSpec {
            netns: Some("/run/netns/slot1".into()),
            tap: "tap0".into(),
            mac: "02:00:00:00:00:01".into(),
        });
        let argv = strs(&build_argv(&s, Accel::Kvm, "pc-q35-7.2", None));
        assert_eq!(value_of(&argv, "-cpu"), ["host"]);
        assert_eq!(value_of(&argv, "-accel"), ["kvm"]);
        assert!(value_of(&argv, "-object")[0].ends_with(",share=off"));
        s.memory.prealloc = true;
        let argv = strs(&build_argv(&s, Accel::Kvm, "pc-q35-7.2", None));
        assert!(value_of(&argv, "-object")[0].ends_with(",share=off,prealloc=on"));
        assert_eq!(value_of(&argv, "-chardev"), ["null,id=ser0"]);
        let blockdevs: Vec<serde_json::Value> = value_of(&argv, "-blockdev")
            .iter()
            .map(|b| serde_json::from_str(b).unwrap())
            .collect();
        assert_eq!(blockdevs.len(), 2);
        assert_eq!(blockdevs[0]["node-name"], "disk0-img");
        assert_eq!(blockdevs[0]["file"]["filename"], "/d/a,b.qcow2");
        assert_eq!(blockdevs[0]["read-only"], true);
        assert!(blockdevs[0]["backing"].is_null(), "a lone image says so");
        assert_eq!(blockdevs[1]["node-name"], "disk0");
        assert_eq!(blockdevs[1]["file"], "disk0-img");
        if let Some(d) = s.disk.as_mut() {
            d.backing = vec![crate::BackingFile::raw("/t/b,c.raw".into())];
        }
        let argv = strs(&build_argv(&s, Accel::Kvm, "pc-q35-7.2", None));
        let image: serde_json::Value =
            serde_json::from_str(value_of(&argv, "-blockdev")[0]).unwrap();
        assert_eq!(image["backing"]["file"]["filename"], "/t/b,c.raw");
        assert_eq!(
            value_of(&argv, "-netdev"),
            ["tap,id=net0,script=no,downscript=no,ifname=tap0"]
        );
        assert_eq!(
            value_of(&argv, "-device"),
            [
                "virtio-blk-pci,drive=disk0,addr=0x3,write-cache=on",
                "virtio-net-pci,netdev=net0,romfile=,addr=0x4,mac=02:00:00:00:00:01",
                "virtio-rng-pci,addr=0x5"
            ]
        );
    }

    #[test]
    fn commas_in_paths_are_doubled() {
        let mut s = spec();
        s.memory.path = "/x,y/mem,img".into();
        s.run_dir = "/r,un".into();
        let argv = strs(&build_argv(&s, Accel::Tcg, "q", None));
        assert!(value_of(&argv, "-object")[0].contains("mem-path=/x,,y/mem,,img,share=on"));
        assert_eq!(
            value_of(&argv, "-qmp"),
            ["unix:/r,,un/vmm.sock,server=on,wait=off"]
        );
        // -kernel and -append take the whole argument: no escaping there.
        s.kernel = "/k,1".into();
        let argv = strs(&build_argv(&s, Accel::Tcg, "q", None));
        assert_eq!(value_of(&argv, "-kernel"), ["/k,1"]);
    }
}
