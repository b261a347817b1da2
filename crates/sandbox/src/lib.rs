//! siesta-sandbox: sandboxes.
//!
//! A template is a booted, ready VM frozen to disk (`siesta-template`); a
//! sandbox is born by resuming it ([`resume`], whose stages are timed in
//! [`stages`]); pre-spawned VMMs wait in the [`pool`]. [`manager`] ties them
//! together for the CLI and the server. The VMM and the network come from
//! `siesta-vmm` and `siesta-net`, held by the [`node`].

pub mod blocking;
mod builder;
pub mod console;
pub mod error;
mod fetched;
pub mod handover;
pub mod idempotent;
mod lazy_served;
mod lifecycle;
pub mod manager;
pub mod memory_prefetch;
pub mod memory_save;
pub mod node;
mod operation;
pub mod paused;
pub mod pool;
pub mod preflight;
mod recovery;
pub mod resume;
mod running;
pub mod sandbox;
mod sandbox_template;
pub mod snapshots;
pub mod stages;
pub mod store;
mod volume_users;
pub mod volumes;

pub use builder::ManagerBuilder;
pub use config::NodeConfig;
pub use error::{Error, Result};
pub use manager::{CreateRequest, SandboxManager};
pub use node::Node;
pub use store::{ListQuery, SortOrder};

// The node's configuration, layout and ids moved to `siesta-host` (issue
// 42); re-exported under their old paths while the crates above move over.
pub use siesta_host::config::file as config_file;
pub use siesta_host::{config, ids, layout};
