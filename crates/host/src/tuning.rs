//! Optimisations a server always runs with. They are not settings: no
//! variable or file key turns one off (the ones that once did are refused
//! with a message, [`RETIRED`]). `siesta bench ... --compare` turns each
//! off to measure what it saves, by starting its node with a [`Tuning`].

/// What a node's VMMs and pool do to keep work off the resume path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Start VMMs that restore a snapshot with a stand-in of the guest
    /// kernel and no initrd: QEMU would hold both whole in every VMM
    /// although the restored guest never reads them
    /// (`siesta_vmm::qemu::kernel_stub`; `siesta bench density --compare
    /// kernel-stub`).
    pub incoming_kernel_stub: bool,
    /// Skip re-applying a pooled slot's egress policy when it is already
    /// the one asked for (`siesta bench resume --compare policy-skip`).
    pub policy_skip: bool,
    /// Top the VMM pool up only once the resume that took a VMM from it is
    /// ready: spawning the replacement meanwhile takes CPU from that
    /// resume (`siesta bench fork --compare refill`).
    pub refill_after_ready: bool,
    /// With `refill_after_ready`, also wait until no other resume is in
    /// flight, at most 2 s: the children of a fork, or a burst of creates,
    /// resume together.
    pub refill_when_quiet: bool,
}

impl Default for Tuning {
    /// Everything on: what a server runs with.
    fn default() -> Self {
        Self {
            incoming_kernel_stub: true,
            policy_skip: true,
            refill_after_ready: true,
            refill_when_quiet: true,
        }
    }
}

/// Settings that were once in `siesta.toml` (`[node]`) and the
/// environment, now always on: `(file key, variable)`.
pub const RETIRED: &[(&str, &str)] = &[
    ("incoming_kernel_stub", "SIESTA_INCOMING_KERNEL_STUB"),
    ("policy_skip", "SIESTA_POLICY_SKIP"),
    ("refill_after_ready", "SIESTA_REFILL_AFTER_READY"),
    ("refill_when_quiet", "SIESTA_REFILL_WHEN_QUIET"),
];

/// Refuses a retired variable that is set (`is_set` looks one up).
pub fn check_variables(is_set: impl Fn(&str) -> bool) -> Result<(), String> {
    match RETIRED.iter().find(|(_, var)| is_set(var)) {
        Some((_, var)) => Err(retired_message(var)),
        None => Ok(()),
    }
}

/// The error for a retired setting found where settings are read.
pub fn retired_message(name: &str) -> String {
    format!(
        "{name} is no longer a setting: siesta always runs with it on (benchmarks compare it \
         with `siesta bench ... --compare`); remove it"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_retired_variable_is_refused_by_name() {
        for (_, var) in RETIRED {
            let err = check_variables(|v| v == *var).unwrap_err();
            assert!(
                err.starts_with(var) && err.contains("no longer a setting"),
                "{err}"
            );
        }
        assert!(check_variables(|v| v == "SIESTA_PREFETCH").is_ok());
    }
}
