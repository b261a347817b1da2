//! A template on a host, turned into the launch description of a VMM.

use std::path::PathBuf;

use siesta_host::Host;
use siesta_net::Slot;
use siesta_vmm::{DiskSpec, LaunchMode, LaunchSpec, MemoryBacking};

use crate::Template;

/// The launch description of a VMM that will receive `template`'s snapshot:
/// the template memory mapped privately (copy-on-write, page cache shared
/// by every sandbox of the template) and the given disk.
pub fn incoming_spec(
    node: &Host,
    template: &Template,
    id: &str,
    run_dir: PathBuf,
    disk: PathBuf,
    slot: &Slot,
) -> LaunchSpec {
    let rec = &template.record;
    LaunchSpec {
        id: id.to_string(),
        run_dir,
        vcpus: rec.vcpus,
        memory_mib: rec.memory_mib.into(),
        // This node's guest kernel and initramfs, not the paths the record
        // names: a template fetched from another node (or a home that moved)
        // names files of that node. The bytes are the same (the template's
        // `guest_assets` digest).
        kernel: node.config.layout().kernel(),
        initrd: Some(node.config.layout().initrd()),
        cmdline: rec.kernel_cmdline.clone(),
        memory: MemoryBacking {
            path: template.memory_path(),
            shared: false,
            prealloc: false,
        },
        // Every sandbox's disk is an overlay of its template's: named
        // here, never read from the overlay's header (`disk_image`).
        disk: Some(DiskSpec::overlay_of_raw(disk, template.disk_path())),
        net: Some(node.net_spec(slot)),
        mode: LaunchMode::Incoming,
        serial_log: true,
    }
}
