//! Egress policy of a slot and the record of what was last applied.

/// What a guest may reach. Default: the internet is allowed (as in E2B).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EgressPolicy {
    pub allow_internet: bool,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        Self {
            allow_internet: true,
        }
    }
}

/// Result of [`crate::Slot::apply_policy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyUpdate {
    /// The chain was rewritten.
    Applied,
    /// The slot already had this policy; no nft call was made.
    Skipped,
}
