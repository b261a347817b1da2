//! Which CPU accelerator runs the guest.
//!
//! `/dev/kvm` alone does not mean a stock guest kernel runs: on our build
//! machines it is provided by the PVM module, which only runs PVM-enabled
//! guests (a stock kernel hangs after "Probing EDD"). So KVM is chosen only
//! when the hardware-virtualisation module behind it is kvm_intel or kvm_amd.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

/// What the operator asked for (the caller reads e.g. `SIESTA_ACCEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelChoice {
    #[default]
    Auto,
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// KVM where a guest really runs, else TCG (see the module comment).
    pub fn detect() -> Accel {
        Self::detect_in(Path::new("/"))
    }

    /// [`Accel::detect`] against another root directory (for tests).
    pub fn detect_in(root: &Path) -> Accel {
        let exists = |p: &str| root.join(p).exists();
        let kvm_dev = exists("dev/kvm");
        let pvm = exists("sys/module/kvm_pvm");
        let hw = exists("sys/module/kvm_intel") || exists("sys/module/kvm_amd");
        if kvm_dev && !pvm && hw {
            Accel::Kvm
        } else {
            Accel::Tcg
        }
    }

    /// Applies an operator's choice; `Auto` detects.
    pub fn choose(choice: AccelChoice) -> Accel {
        match choice {
            AccelChoice::Auto => Accel::detect(),
            AccelChoice::Kvm => Accel::Kvm,
            AccelChoice::Tcg => Accel::Tcg,
        }
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AccelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(AccelChoice::Auto),
            "kvm" => Ok(AccelChoice::Kvm),
            "tcg" => Ok(AccelChoice::Tcg),
            other => Err(format!(
                "accelerator {other:?} is not one of auto, kvm, tcg"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(paths: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for p in paths {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::create_dir_all(&p).unwrap();
        }
        d
    }

    #[test]
    fn kvm_only_with_a_hardware_module_and_without_pvm() {
        let t = tree(&["dev/kvm", "sys/module/kvm_intel"]);
        assert_eq!(Accel::detect_in(t.path()), Accel::Kvm);
        let t = tree(&["dev/kvm", "sys/module/kvm_amd"]);
        assert_eq!(Accel::detect_in(t.path()), Accel::Kvm);
        // This machine's situation: /dev/kvm from the PVM module.
        let t = tree(&["dev/kvm", "sys/module/kvm", "sys/module/kvm_pvm"]);
        assert_eq!(Accel::detect_in(t.path()), Accel::Tcg);
        let t = tree(&["dev/kvm", "sys/module/kvm_intel", "sys/module/kvm_pvm"]);
        assert_eq!(Accel::detect_in(t.path()), Accel::Tcg);
        let t = tree(&["sys/module/kvm_intel"]);
        assert_eq!(Accel::detect_in(t.path()), Accel::Tcg);
    }

    #[test]
    fn choice_parses_and_overrides() {
        assert_eq!("KVM".parse::<AccelChoice>().unwrap(), AccelChoice::Kvm);
        assert_eq!("".parse::<AccelChoice>().unwrap(), AccelChoice::Auto);
        assert!("xen".parse::<AccelChoice>().is_err());
        assert_eq!(Accel::choose(AccelChoice::Tcg), Accel::Tcg);
        assert_eq!(Accel::choose(AccelChoice::Kvm), Accel::Kvm);
    }
}
