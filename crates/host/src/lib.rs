//! siesta-host: what siesta knows about the node it runs on, below every
//! crate that runs sandboxes or builds templates.
//!
//! - [`config`]: the node's settings ([`NodeConfig`]), built once at
//!   start-up from defaults, `$SIESTA_HOME/siesta.toml` ([`config::file`])
//!   and `SIESTA_*` variables, then passed down explicitly;
//! - [`layout`]: where everything lives under the home;
//! - [`ids`]: sandbox ids and access tokens.

pub mod config;
pub mod ids;
pub mod layout;

pub use config::NodeConfig;
