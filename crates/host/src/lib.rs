//! siesta-host: what siesta knows about the node it runs on, below every
//! crate that runs sandboxes or builds templates.
//!
//! - [`config`]: the node's settings ([`NodeConfig`]), built once at
//!   start-up from defaults, `$SIESTA_HOME/siesta.toml` ([`config::file`])
//!   and `SIESTA_*` variables, then passed down explicitly;
//! - [`layout`]: where everything lives under the home;
//! - [`ids`]: sandbox ids and access tokens;
//! - [`disk`]: copy-on-write disks and `qemu-img`, never following a name
//!   a VM could have written into an image;
//! - [`tools`]: the host programs a node runs, and their packages;
//! - [`blocking`]: work kept off the async threads; [`key_locks`]: one
//!   async lock per key;
//! - [`node`]: the [`Host`]: VMM backend, network slots, configuration;
//! - [`tuning`]: the optimisations a node always runs with, which only
//!   benchmarks turn off;
//! - [`blob_checks`]: which template blobs were checked against their
//!   digests.

pub mod blob_checks;
pub mod blocking;
pub mod config;
pub mod disk;
mod error;
pub mod ids;
pub mod key_locks;
pub mod layout;
pub mod node;
pub mod tools;
pub mod tuning;

pub use config::NodeConfig;
pub use error::{HostError, Result};
pub use node::Host;
pub use tuning::Tuning;
