//! What a backend is, recorded with every snapshot so a restore can refuse a
//! snapshot another VMM wrote before the VMM fails on it halfway.

use serde::{Deserialize, Serialize};

use crate::{Accel, VmmError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmInfo {
    /// Backend kind: "qemu", later "firecracker".
    pub kind: String,
    /// The VMM's own version line, e.g. "QEMU emulator version 7.2.22 (Debian ...)".
    pub version: String,
    /// Versioned machine type, e.g. "pc-q35-7.2" (an alias such as "q35"
    /// would silently mean another machine after a VMM upgrade).
    pub machine: String,
    pub accel: Accel,
    /// siesta's number for the set of devices it gives the machine (see
    /// [`DEVICE_SET`]); 0 in records written before it was kept.
    #[serde(default)]
    pub devices: u32,
}

/// The device set VMMs are started with now. 1: q35's vmport, SMBus and
/// AHCI controller turned off (nothing a guest needs; each is attack
/// surface). A snapshot holds the state of the devices it was frozen with,
/// so one of another set cannot be restored: the template is rebuilt.
pub const DEVICE_SET: u32 = 1;

impl VmmInfo {
    /// Ok if a snapshot recorded as `recorded` can be restored by `self`.
    ///
    /// All four fields must match exactly: device state is versioned by the
    /// machine type, the CPU model differs between accelerators (`-cpu max`
    /// under TCG, `-cpu host` under KVM), and the fast paths that read the
    /// migration stream rely on the very same VMM build.
    pub fn check_compatible(&self, recorded: &VmmInfo) -> Result<(), VmmError> {
        let mut differences = Vec::new();
        let mut cmp = |what: &str, rec: &str, cur: &str| {
            if rec != cur {
                differences.push(format!(
                    "{what}: snapshot has {rec:?}, this host has {cur:?}"
                ));
            }
        };
        cmp("kind", &recorded.kind, &self.kind);
        cmp("version", &recorded.version, &self.version);
        cmp("machine", &recorded.machine, &self.machine);
        cmp("accelerator", recorded.accel.as_str(), self.accel.as_str());
        if recorded.devices != self.devices {
            differences.push(format!(
                "device set: snapshot has {}, this host has {} (siesta changed the \
                 machine's devices since it was frozen: rebuild the template; a sandbox \
                 paused on it comes back only by a reboot from its disk, \
                 `{{\"memory\": false}}` on connect)",
                recorded.devices, self.devices
            ));
        }
        if differences.is_empty() {
            Ok(())
        } else {
            Err(VmmError::Incompatible { differences })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> VmmInfo {
        VmmInfo {
            kind: "qemu".into(),
            version: "QEMU emulator version 7.2.22".into(),
            machine: "pc-q35-7.2".into(),
            accel: Accel::Tcg,
            devices: DEVICE_SET,
        }
    }

    #[test]
    fn names_every_difference() {
        info().check_compatible(&info()).unwrap();
        let mut rec = info();
        rec.accel = Accel::Kvm;
        rec.machine = "pc-q35-8.0".into();
        let e = info().check_compatible(&rec).unwrap_err().to_string();
        assert!(e.contains("machine") && e.contains("pc-q35-8.0"), "{e}");
        assert!(e.contains("accelerator") && e.contains("kvm"), "{e}");
        assert!(!e.contains("version"), "{e}");
        // A record from before the device set was kept reads as set 0.
        let mut j = serde_json::to_value(info()).unwrap();
        j.as_object_mut().unwrap().remove("devices");
        let old: VmmInfo = serde_json::from_value(j).unwrap();
        let e = info().check_compatible(&old).unwrap_err().to_string();
        assert!(e.contains("device set") && e.contains("rebuild"), "{e}");
    }

    #[test]
    fn round_trips_through_json() {
        let j = serde_json::to_string(&info()).unwrap();
        assert!(j.contains("\"accel\":\"tcg\""), "{j}");
        assert_eq!(serde_json::from_str::<VmmInfo>(&j).unwrap(), info());
    }
}
