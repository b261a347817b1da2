//! Network slots for siesta sandboxes.
//!
//! Every sandbox runs its VMM inside a network namespace (a *slot*). All
//! guests have the same address (169.254.0.21/30, gateway 169.254.0.22 with a
//! fixed MAC), so a snapshot resumes in any slot. Each slot owns a /30 of a
//! configurable subnet: the host side of its veth pair gets `.1`, the
//! namespace side `.2` (the slot address). The host reaches the guest agent
//! at `slot_addr:49983`; nftables inside the namespace DNATs it to the guest
//! and SNATs the guest's egress to the slot address; the root namespace
//! masquerades the subnet out of the default-route interface.
//!
//! Slots are pooled by [`SlotPool`]: created ahead of time, handed out by
//! [`SlotPool::acquire`], taken back by [`SlotPool::release`].

pub mod boundary;
mod cmd;
pub mod egress;
pub mod error;
mod host;
pub mod layout;
pub mod netns;
pub mod nft;
pub mod policy;
mod pool;
mod slot;

pub use boundary::Boundary;
pub use egress::{DomainPattern, EgressProxy, Resolver};
pub use error::{NetError, Result};
pub use layout::{SlotLayout, Subnet, Tag};
pub use netns::spawn_in_netns;
pub use policy::{Cidr, EgressPolicy, PolicyUpdate};
pub use pool::{NetConfig, PoolStats, SlotPool};
pub use slot::{GuestLink, Slot};
